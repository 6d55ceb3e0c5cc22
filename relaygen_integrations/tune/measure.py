"""Measuring a machine's pass costs: each model, each candidate format, passes over 1 to 32 positions, in a budget.

What is timed is what the engine runs: the model's forward over ``k`` new positions on top of a cached context, with
the logits of every position kept (what a speculative or verified-relay check keeps), then the cache cropped back.
The context is ``CONTEXT`` positions of random keys and values written straight into the cache: a pass's cost
depends on how many positions it attends to, not on what they hold, and a real prefill of 256 positions in bf16
costs ~50 s on an AVX2-only CPU (``pass-cost-avx2.json``: 6.1 s for 32 positions), more than the whole budget.

Budget (``DEFAULT_BUDGET_SECONDS``, the loading of each format included): formats are measured in priority order
(the shipped default's first), each size once, then again while time is left (the median of what was measured is
kept). The one-token step is timed ``STEP_SAMPLES`` times whatever the format: every generated token pays it, and one
sample of the 1.5B model in bf16 read 315 ms, where the run that followed paid 307 ms a step on the whole and 269-412
by problem (``benchmarks/data/tune-check-avx512``): a step varies by itself, and one sample is a draw from that.

Where a format switches kernels inside the sizes (``PassTimer.switch_rows``: a bf16 model on a CPU without bf16
instructions runs passes of ``wide_passes.WIDE_FROM_ROWS`` rows or more in fp32), the sizes go on doubling until two
lie past the switch, so the slope ``costs.interpolate`` extrapolates prompts and catch-ups with is the fp32 regime's.
Without it, the slope from 16 positions (bf16) to 32 (fp32, weights converted per pass) was extrapolated: on the
2-core Xeon with AVX-512 and no AVX512-BF16, 1.36 s to 3.94 s, which priced a 100-token prompt at 14.9 s where the
run paid 3.7 and 4.6 s; measured to 64 positions (3.30 s, 4.16 s), 5.1 s (``benchmarks/data/tune-check-avx512``).

A size whose pass would overrun the budget is not run: the table then ends at the last measured size and
``costs.interpolate`` extrapolates (passes grow about linearly there). A format that cannot start before the budget
is spent, or that fails to load, is left out, and the candidates that need it are reported as unpriced.

The source of timings is an interface (:class:`PassTimer`), so tests count measurements with a scripted one.
"""

from __future__ import annotations

import gc
import logging
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Protocol

import torch

from ..engine.local.runner import cache_keyword
from ..engine.local.wide_passes import wide_pass, wide_pass_rows
from .costs import PassCostTable

POSITIONS = (1, 2, 4, 8, 16, 32)
CONTEXT = 256
DEFAULT_BUDGET_SECONDS = 60.0
STEP_SAMPLES = 3  # one-token steps timed per format (module docstring)
# This way of measuring, recorded on every cached table: 2 = steps the median of ``STEP_SAMPLES``, sizes past a kernel
# switch. ``tuner.load_cached`` measures a table recorded otherwise again (method 1 priced prompts several times over
# on CPUs without bf16 instructions: ``benchmarks/data/tune-check-avx512``).
MEASURE_METHOD = 2
# Repeat a format's sweep (median of up to 3) only when one sweep costs less than this share of the budget: on the
# AVX2 EPYC a bf16 sweep of the 1.5B model takes 14 s and an int8 sweep of the 0.5B one 0.8 s.
REPEAT_BELOW_SHARE = 0.05

logger = logging.getLogger(__name__)


class PassTimer(Protocol):
    """Times one model's passes in one format (``load`` first; ``close`` frees it)."""

    def load(self, role: str, fmt: str) -> None: ...

    def time_pass(self, positions: int) -> float: ...

    def switch_rows(self) -> int | None:
        """The pass width from which the loaded format computes another way (module docstring), or None."""
        ...

    def close(self) -> None: ...


def sizes_to_measure(positions: Sequence[int], switch_rows: int | None) -> list[int]:
    """``positions``, doubled on past the largest until two sizes lie at or past ``switch_rows`` (when there is one)."""
    sizes = sorted(positions)
    while switch_rows is not None and sum(k >= switch_rows for k in sizes) < 2:
        sizes.append(max(sizes[-1] * 2, switch_rows))
    return sizes


def expected_seconds(samples: dict[int, list[float]], positions: int) -> float:
    """What a pass over ``positions`` should cost, for the budget check: its own last sample, else the nearest smaller
    size's scaled by width (a pass at most grows as its positions), else nothing known (0)."""
    if positions in samples:
        return samples[positions][-1]
    smaller = [k for k in samples if k < positions]
    return samples[max(smaller)][-1] * positions / max(smaller) if smaller else 0.0


def measure_pass_costs(
    timer: PassTimer,
    plan: Sequence[tuple[str, str]],
    positions: Sequence[int] = POSITIONS,
    budget_seconds: float = DEFAULT_BUDGET_SECONDS,
    clock: Callable[[], float] = time.perf_counter,
    on_progress: Callable[[str], None] | None = None,
) -> PassCostTable:
    """Measures each (role, format) of ``plan`` in order (module docstring) and returns the table; the caller puts
    the machine's identity on it. ``on_progress`` is told of each measured pass (a progress bar's advance)."""
    table = PassCostTable(context=CONTEXT)
    deadline = clock() + budget_seconds
    for role, fmt in plan:
        if clock() >= deadline:
            break
        try:
            timer.load(role, fmt)
        except (OSError, ValueError, RuntimeError) as exc:
            # A format this model cannot take here (a GGUF whose tensors no kernel reads, a missing file): the rest
            # of the plan is still measured, and candidates needing this one are reported unpriced.
            logger.warning("tuning: %s in %s could not be loaded (%s); left out", role, fmt, exc)
            timer.close()
            continue
        try:
            sizes = sizes_to_measure(positions, timer.switch_rows())
            samples: dict[int, list[float]] = {}
            timer.time_pass(1)  # warm-up: the first call packs weights and picks kernels
            repeat = 0
            while True:
                grew = False
                for k in sizes:
                    expected = expected_seconds(samples, k)
                    if clock() + expected >= deadline:
                        break
                    times = STEP_SAMPLES if k == 1 and repeat == 0 else 1
                    samples.setdefault(k, []).extend(timer.time_pass(k) for _ in range(times))
                    grew = True
                    if on_progress is not None:
                        on_progress(f"{role} {fmt} k={k}")
                repeat += 1
                # A second (and third) repetition only for a cheap format: one whose sweep is a small part of the
                # budget (the expensive ones are slow because their passes are long, which one sample times well).
                sweep = sum(statistics.median(v) for v in samples.values())
                if not grew or repeat >= 3 or sweep > REPEAT_BELOW_SHARE * budget_seconds:
                    break
        finally:
            timer.close()
        if samples:
            table.put(role, fmt, {k: statistics.median(v) for k, v in samples.items()})
    return table


class ModelPassTimer:
    """The real timer: the pair's model in a format (``engine/local/weights.py``), a random cached context."""

    def __init__(self, load_model: Callable[[str, str], torch.nn.Module], context: int = CONTEXT) -> None:
        self.load_model = load_model
        self.context = context
        self.model: torch.nn.Module | None = None
        self.cache: object = None

    def load(self, role: str, fmt: str) -> None:
        from transformers import DynamicCache

        self.model = self.load_model(role, fmt)
        config = self.model.config
        cache = DynamicCache(config=config)
        dtype = next(p for p in self.model.parameters() if p.is_floating_point()).dtype
        device = next(self.model.parameters()).device
        heads = config.num_key_value_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        generator = torch.Generator().manual_seed(0)
        for layer in range(config.num_hidden_layers):
            keys = torch.randn(1, heads, self.context, head_dim, generator=generator).to(device, dtype)
            cache.update(keys, keys.clone(), layer)
        self.cache = cache

    @torch.inference_mode()
    def time_pass(self, positions: int) -> float:
        assert self.model is not None
        device = next(self.model.parameters()).device
        ids = torch.randint(1000, 20000, (1, positions), device=device)
        cache = {cache_keyword(self.model): self.cache}
        fp32_linears = wide_pass(wide_pass_rows(self.model), positions)  # as the engine's runner runs a pass this wide
        start = time.perf_counter()
        with fp32_linears:
            self.model(ids, use_cache=True, logits_to_keep=positions, **cache)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds = time.perf_counter() - start
        self.cache.crop(-positions)  # type: ignore[attr-defined]
        return seconds

    def close(self) -> None:
        self.model = self.cache = None
        gc.collect()

    def switch_rows(self) -> int | None:
        return None if self.model is None else wide_pass_rows(self.model)
