"""Cue calibration: margins against a hand-computed case, cue matching, pooling, profile round trip."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from relaygen_integrations.calibrate.margins import (
    Trace,
    calibrate,
    cue_occurrences,
    plot_margins,
    sentence_end,
    trace_candidates,
    write_profile,
)
from relaygen_integrations.engine import resolve_cues
from relaygen_integrations.engine.core.cues import load_profile
from relaygen_integrations.engine.local.backend import token_margins


class FixedLogits(torch.nn.Module):
    """Returns the same hand-chosen logits at every position."""

    def __init__(self, logits: list[float]) -> None:
        super().__init__()
        self.logits = torch.tensor(logits)
        self.anchor = torch.nn.Parameter(torch.zeros(1), requires_grad=False)

    @property
    def device(self) -> torch.device:
        return self.anchor.device

    def forward(self, input_ids: torch.Tensor) -> SimpleNamespace:
        return SimpleNamespace(logits=self.logits.expand(1, input_ids.shape[1], -1))


def overall_margin_by_hand(model: torch.nn.Module, traces_path: Path) -> tuple[float, int]:
    """The overall mean margin of a saved traces file and its token count, computed here rather than by the package:
    each trace teacher-forced through ``model``; at each position that predicts a completion token, the highest
    probability minus the second highest."""
    margins: list[float] = []
    for line in traces_path.read_text(encoding="utf-8").splitlines():
        trace = json.loads(line)
        prompt_ids, completion_ids = trace["prompt_ids"], trace["completion_ids"]
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([prompt_ids + completion_ids], device=model.device)).logits[0]
        predicting = logits[len(prompt_ids) - 1 : len(prompt_ids) - 1 + len(completion_ids)].float()
        ranked = torch.softmax(predicting, dim=-1).sort(dim=-1, descending=True).values
        margins.extend((ranked[:, 0] - ranked[:, 1]).tolist())
    return sum(margins) / len(margins), len(margins)


def test_the_calibrate_command_writes_the_mean_margin_of_its_traces(tokenizer, tmp_path):
    """The profile's overall mean margin is the small model's mean margin over the traces the command saved (a tiny
    random-weight fp32 pair, the margin test alone)."""
    from helpers import tiny_qwen2

    from relaygen_integrations.cli.main import main

    models = {"large": tiny_qwen2(tokenizer, seed=1), "small": tiny_qwen2(tokenizer, seed=2)}
    for role, model in models.items():
        model.save_pretrained(tmp_path / role)
        tokenizer.save_pretrained(tmp_path / role)
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"question": f"What is {i} + {i}?", "answer": f"#### {2 * i}"}) + "\n"
                            for i in range(2)))  # fmt: skip
    traces, out = tmp_path / "traces.jsonl", tmp_path / "pair.json"
    args = ["calibrate", "--large", str(tmp_path / "large"), "--small", str(tmp_path / "small"), "--data", str(data),
            "--n", "2", "--max-new-tokens", "12", "--dtype", "fp32", "--verify", "off", "--traces", str(traces),
            "--out", str(out)]  # fmt: skip
    assert main(args) == 0
    profile = json.loads(out.read_text())
    expected_margin, expected_tokens = overall_margin_by_hand(models["small"], traces)
    assert expected_tokens == 24  # two traces of 12 tokens: random weights seldom end early
    assert profile["total_tokens"] == expected_tokens
    assert profile["overall_mean_margin"] == pytest.approx(expected_margin, rel=1e-6)


def test_margin_matches_a_hand_computed_case():
    # softmax([ln 6, ln 3, ln 1]) = [0.6, 0.3, 0.1] -> margin 0.3 at every predicting position.
    model = FixedLogits([math.log(6), math.log(3), math.log(1)])
    margins = token_margins(model, prompt_ids=[0, 1], completion_ids=[2, 0, 1])
    assert margins == pytest.approx([0.3, 0.3, 0.3])
    assert token_margins(model, [0], []) == []


def test_cue_occurrences_respect_word_boundaries():
    text = "Also so. So the sum is 5. Sometimes So, yes. So"
    first, comma = text.index("So the"), text.index("So,")
    assert list(cue_occurrences(text, "So")) == [first + 2, comma + 2, len(text)]
    assert list(cue_occurrences(text, "So,")) == [comma + 3]


def test_sentence_end_uses_the_policy_rules():
    text = " the value is 3.14 and e.g. more. Next one."
    assert text[: sentence_end(text, 0)] == " the value is 3.14 and e.g. more."
    assert sentence_end("no end here", 0) == len("no end here")


def test_calibration_pools_the_sentence_after_each_cue(tokenizer):
    text = "We add. So the sum is 5. We stop. So it ends. Then done."
    ids = tokenizer.encode(text, add_special_tokens=False)
    # Hand-marked: the two sentences after "So" (" the sum is 5." and " it ends.") get margin 0.9, the rest 0.1.
    inside = [(text.index(" the"), text.index("5.") + 2), (text.index(" it"), text.index("ends.") + 5)]
    margins, offset = [], 0
    for token in ids:
        margins.append(0.9 if any(a <= offset < b for a, b in inside) else 0.1)
        offset += len(tokenizer.decode([token]))
    result = calibrate(
        [Trace([1], ids, text)], [margins], tokenizer, ["So", "Then", "We"], min_occurrences=2, min_traces=1
    )
    rows = {row.cue: row for row in result.table}
    assert rows["So"].occurrences == 2 and rows["So"].mean_margin == pytest.approx(0.9)
    assert rows["So"].delta == pytest.approx(0.9 - sum(margins) / len(margins))
    assert rows["We"].occurrences == 2 and rows["We"].delta < 0
    assert not rows["Then"].selected  # one occurrence: below min_occurrences
    assert result.selected == ["So"]


def test_cues_from_too_few_traces_are_not_selected(tokenizer):
    # "So" is confident in all three traces; "Bella" only in one (a name from one problem), however often.
    texts = ["So the sum is 5. Bella has 3. Bella has 4. Bella has 5.", "So it is 2.", "So we stop."]
    traces = [Trace([1], tokenizer.encode(t, add_special_tokens=False), t) for t in texts]
    margins = [[0.9] * len(t.completion_ids) for t in traces]
    margins[0][0] = 0.0  # the overall mean must sit below the pooled means
    result = calibrate(traces, margins, tokenizer, ["So"], ["Bella"], min_occurrences=3, min_traces=3)
    rows = {row.cue: row for row in result.table}
    assert (rows["Bella"].occurrences, rows["Bella"].traces) == (3, 1) and not rows["Bella"].selected
    assert rows["So"].traces == 3 and result.selected == ["So"]


def test_trace_candidates_propose_openers():
    texts = ["Step 1: add. Next, we add. Next, we sum.\n1. one\n2. two\nStep 2: go. Next, go."] * 3
    found = trace_candidates(texts, min_count=3)
    assert "Next," in found and "Step" in found and "We" not in found and "1." in found
    # Counted once per trace: a word opening many sentences of one answer is that problem's vocabulary.
    assert "Bella" not in trace_candidates(["Bella has 3. Bella has 4. Bella has 5. Bella wins."], min_count=2)


def test_profile_round_trip(tmp_path, tokenizer):
    text = "We add. So the sum is 5. So it ends. So yes."
    ids = tokenizer.encode(text, add_special_tokens=False)
    result = calibrate([Trace([1], ids, text)], [[0.5] * len(ids)], tokenizer, ["So"], threshold=-1.0, min_traces=1)
    path = tmp_path / "pair.json"
    profile = write_profile(path, result, {"large": "a", "small": "b", "tokenizer_hash": "x"}, {"n": 1})
    assert json.loads(path.read_text())["selected_cues"] == profile["selected_cues"] == ["So"]
    assert resolve_cues(str(path)).cues == ("So",)
    assert load_profile(path, key="candidates").cues == ("So",) == tuple(profile["candidates"])
    plot_margins(tmp_path / "pair.png", result)
    assert (tmp_path / "pair.png").stat().st_size > 0


@pytest.mark.real_pair
def test_calibrate_command_on_the_demo_pair(tmp_path):
    from pathlib import Path

    from relaygen_integrations.cli.main import main

    shared = Path(__file__).resolve().parents[2] / "shared" / "data" / "gsm8k" / "train_calib.jsonl"
    data = (
        shared
        if shared.exists()
        else Path(__file__).resolve().parents[1] / "relaygen_integrations/data/gsm8k_demo.jsonl"
    )
    out = tmp_path / "demo.json"
    traces = tmp_path / "traces.jsonl"
    costs, pass_cost = write_costs(tmp_path, "bf16")
    args = ["calibrate", "--data", str(data), "--n", "2", "--max-new-tokens", "48", "--min-occurrences", "1",
            "--min-traces", "1", "--traces", str(traces), "--out", str(out), "--costs", str(costs),
            "--pass-cost", str(pass_cost)]  # fmt: skip
    assert main(args) == 0
    profile = json.loads(out.read_text())
    assert profile["settings"]["n"] == 2 and profile["total_tokens"] > 0
    # The mean margin of the saved traces, computed here from the small model the command loaded (bf16, its default).
    from relaygen_integrations.engine.local.loading import load_model

    small, _ = load_model("demo:small", dtype="bf16")
    expected_margin, expected_tokens = overall_margin_by_hand(small, traces)
    del small
    assert profile["total_tokens"] == expected_tokens
    assert profile["overall_mean_margin"] == pytest.approx(expected_margin, rel=1e-5)
    from relaygen_integrations.engine.core.cues import PAPER_CANDIDATES

    assert {row["cue"] for row in profile["table"]} >= set(PAPER_CANDIDATES)
    assert len(traces.read_text().splitlines()) == 2 and out.with_suffix(".png").exists()
    # Verified: every cue seen was run through the small model and scored by the large one under the pair's rule.
    verified = profile["verified"]
    assert verified["rule"] == "prob:0.2" and profile["selected_cues"] == verified["selected_cues"]
    assert all(row["written"] >= row["kept"] for row in verified["table"])
    # Every cue that occurred (at least once in one trace: the test's thresholds) was run; 48-token traces may hold
    # none - the selection itself is tested on a scripted pair (tests/test_calibrate_verified.py).
    assert all(row["written"] > 0 for row in verified["table"] if row["occurrences"])
    assert out.with_name("demo-verified.png").exists()
    # A second run reuses the saved traces (no large-model generation) and selects the same cues.
    assert main(args) == 0 and json.loads(out.read_text())["selected_cues"] == profile["selected_cues"]


def write_costs(directory, large_format: str):
    """A saved bench run with a speculative baseline and a pass-cost table, as verified calibration reads them."""
    costs = directory / "bench"
    costs.mkdir()
    summary = {"large-spec": {"s_per_token": 0.1, "ms_per_small_token": 40.0}}
    (costs / "results.json").write_text(json.dumps({"summary": summary}))
    pass_cost = directory / "pass_cost.json"
    table = {"1": 0.09, "8": 0.15, "32": 0.32}
    pass_cost.write_text(json.dumps({"seconds": {"large": {large_format: table}}}))
    return costs, pass_cost
