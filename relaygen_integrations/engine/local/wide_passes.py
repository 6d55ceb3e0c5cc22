"""Wide passes of a bf16 model computed in fp32 on CPUs without bf16 instructions.

On a CPU without AVX512-BF16 or AMX (``cpu.has_native_bf16``), torch runs a bf16 matmul by converting as it goes,
and its cost grows with every position: on the 2-core AVX2 EPYC a pass of the 1.5B model over 400 positions takes
70.7 s in bf16, against 11.95 s when each linear layer's weight is converted to fp32 once and the matmul runs in fp32
(``benchmarks/data/wide-passes-avx2``). Converting a weight costs about what a few positions do, so narrow passes
(decode steps, draft checks) stay in bf16 and only a linear layer that reads at least ``WIDE_FROM_ROWS`` rows is
upcast: prompts, catch-ups and long verifications. The weights stay bf16 in memory (an fp32 copy of the large model
would cost 6 GB); the result is rounded back to bf16, as a bf16 matmul's fp32 accumulator is.

The switch is a ``TorchFunctionMode`` around the pass, so it works for any transformers architecture without
replacing modules, and costs nothing on a pass it is not entered for.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from .cpu import has_native_bf16

# The narrowest linear-layer input (rows = positions) computed in fp32. Measured on the AVX2 EPYC, whole passes of
# the demo's large model, every linear upcast (benchmarks/data/wide-passes-avx2): 16 positions 3.02 s bf16 / 3.19 s
# upcast, 24 positions 4.27 / 3.47, 32 positions 5.67 / 3.65; they cross between 16 and 24.
WIDE_FROM_ROWS = 24
# RELAYGEN_WIDE_PASSES=bf16 keeps every pass in bf16 (for measuring the difference, or on a CPU where it does not pay).
ENV = "RELAYGEN_WIDE_PASSES"


def machine_wide_rows() -> int | None:
    """On this CPU, the row count from which a bf16 model's linear layers run in fp32: ``WIDE_FROM_ROWS`` without
    bf16 instructions (unless ``RELAYGEN_WIDE_PASSES`` is ``bf16``), else None."""
    if os.environ.get(ENV, "").strip().lower() == "bf16" or has_native_bf16():
        return None
    return WIDE_FROM_ROWS


def wide_pass_rows(model: torch.nn.Module) -> int | None:
    """The row count from which ``model``'s linear layers run in fp32, or None where every pass stays as it is:
    only a bf16 model on the CPU gets one (``machine_wide_rows``)."""
    weight = next((p for p in model.parameters() if p.is_floating_point()), None)
    if weight is None or weight.device.type != "cpu" or weight.dtype != torch.bfloat16:
        return None
    return machine_wide_rows()


class Fp32WideLinears(TorchFunctionMode):
    """Inside it, ``F.linear`` over a bf16 input of at least ``min_rows`` rows runs in fp32 (weight converted for the
    call) and returns bf16; narrower ones, and every other op, run as they would."""

    def __init__(self, min_rows: int) -> None:
        super().__init__()
        self.min_rows = min_rows

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is F.linear:
            x, weight = args[0], args[1] if len(args) > 1 else kwargs["weight"]
            if (
                x.dtype == torch.bfloat16
                and weight.dtype == torch.bfloat16
                and x.numel() // x.shape[-1] >= self.min_rows
            ):
                bias = args[2] if len(args) > 2 else kwargs.get("bias")
                out = F.linear(x.float(), weight.float(), None if bias is None else bias.float())
                return out.to(torch.bfloat16)
        return func(*args, **kwargs)


def wide_pass(min_rows: int | None, positions: int) -> contextlib.AbstractContextManager[Any]:
    """The context a pass over ``positions`` new positions runs in: ``Fp32WideLinears`` when the model has a
    threshold (``wide_pass_rows``) and the pass reaches it, else nothing."""
    if min_rows is None or positions < min_rows:
        return contextlib.nullcontext()
    return Fp32WideLinears(min_rows)
