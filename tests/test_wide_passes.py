"""Wide passes of a bf16 model run their linear layers in fp32 on a CPU without bf16 instructions
(``engine/local/wide_passes.py``), narrow ones stay bf16, and the logits agree with an all-bf16 run."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from helpers import tiny_qwen2
from torch.overrides import TorchFunctionMode

from relaygen_integrations.engine.local import wide_passes
from relaygen_integrations.engine.local.runner import ModelRunner
from relaygen_integrations.engine.local.wide_passes import WIDE_FROM_ROWS, wide_pass_rows


class LinearInputs(TorchFunctionMode):
    """Records the dtype and row count of every ``F.linear`` that reaches it. Entered outside the runner's pass, it
    sees what ``Fp32WideLinears`` hands on: the fp32 matmuls it makes, and the narrow bf16 calls it lets through."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[torch.dtype, int]] = []

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        if func is F.linear:
            self.calls.append((args[0].dtype, args[0].numel() // args[0].shape[-1]))
        return func(*args, **(kwargs or {}))


@pytest.fixture
def bf16_model(tokenizer):
    return tiny_qwen2(tokenizer, seed=3, hidden=64, layers=2).to(torch.bfloat16)


@pytest.fixture
def no_bf16_instructions(monkeypatch):
    monkeypatch.setattr(wide_passes, "has_native_bf16", lambda: False)
    monkeypatch.delenv(wide_passes.ENV, raising=False)


def _prefill_then_step(model: torch.nn.Module, prompt: list[int]) -> tuple[torch.Tensor, list[Any], list[Any]]:
    runner = ModelRunner("large", model)
    runner.begin_request(prompt, reuse_prefix=False)
    with LinearInputs() as prefill:
        logits = runner.logits_for(prompt)
    with LinearInputs() as step:
        runner.logits_for([*prompt, int(logits.argmax())])
    return logits, prefill.calls, step.calls


def test_a_wide_pass_runs_its_linears_in_fp32_and_a_narrow_one_in_bf16(bf16_model, no_bf16_instructions):
    prompt = list(range(100, 100 + WIDE_FROM_ROWS + 6))
    _, prefill, step = _prefill_then_step(bf16_model, prompt)
    # The prompt up to its last token is one pass (ModelRunner._prefill_up_to_the_last_prompt_token): 29 rows.
    body = [call for call in prefill if call[1] == len(prompt) - 1]
    assert body and all(dtype == torch.float32 for dtype, _ in body)  # every projection of those positions
    assert prefill[-1] == (torch.bfloat16, 1)  # the output layer reads one row (logits_to_keep=1): not worth it
    assert step and all(dtype == torch.bfloat16 for dtype, _ in step)  # a decode step stays bf16


def test_a_pass_just_below_the_threshold_stays_bf16(bf16_model, no_bf16_instructions):
    _, prefill, _ = _prefill_then_step(bf16_model, list(range(100, 100 + WIDE_FROM_ROWS - 1)))
    assert prefill and all(dtype == torch.bfloat16 for dtype, _ in prefill)


def test_upcast_logits_agree_with_an_all_bf16_run(bf16_model, no_bf16_instructions, monkeypatch):
    prompt = list(range(200, 260))
    upcast, prefill, _ = _prefill_then_step(bf16_model, prompt)
    assert any(dtype == torch.float32 for dtype, _ in prefill)
    monkeypatch.setenv(wide_passes.ENV, "bf16")
    plain, prefill, _ = _prefill_then_step(bf16_model, prompt)
    assert all(dtype == torch.bfloat16 for dtype, _ in prefill)
    assert int(upcast.argmax()) == int(plain.argmax())
    torch.testing.assert_close(upcast, plain, atol=0.05, rtol=0.05)


def test_only_bf16_models_on_cpus_without_bf16_instructions_upcast(tokenizer, bf16_model, monkeypatch):
    monkeypatch.delenv(wide_passes.ENV, raising=False)
    monkeypatch.setattr(wide_passes, "has_native_bf16", lambda: True)
    assert wide_pass_rows(bf16_model) is None  # AVX512-BF16 / AMX: bf16 matmuls are the fast ones
    monkeypatch.setattr(wide_passes, "has_native_bf16", lambda: False)
    assert wide_pass_rows(bf16_model) == WIDE_FROM_ROWS
    assert wide_pass_rows(tiny_qwen2(tokenizer, seed=3, hidden=64, layers=1)) is None  # fp32 weights: nothing to gain
    monkeypatch.setenv(wide_passes.ENV, "bf16")
    assert wide_pass_rows(bf16_model) is None
