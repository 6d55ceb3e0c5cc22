"""Verified calibration: cues are kept for what verified relay keeps after them, at the measured costs."""

from __future__ import annotations

import pytest
from helpers import PROMPT, ScriptedLM

from relaygen_integrations import RelayEngine
from relaygen_integrations.calibrate.margins import Trace, calibrate, token_char_ends
from relaygen_integrations.calibrate.verified import (
    PairCosts,
    SentenceTrial,
    cue_token_positions,
    run_trials,
    verified_calibrate,
)
from relaygen_integrations.engine.core.verify import VerifyRule

# After "So" the small model writes what the large model would (kept); after "Hence" it writes another sentence of
# the same length ("answer is 7" for "result is 9"), which the large model rejects at its second token.
LARGE = "We add them. So the sum is 5. Then we double. Hence the result is 9.\n"
SMALL = "We add them. So the sum is 5. Then we double. Hence the answer is 7.\n"
COSTS = PairCosts(small_token_ms=4.0, baseline_token_ms=10.0, pass_ms={1: 5.0, 32: 5.0})


def scripted_pair(tokenizer):
    prompt_ids = tokenizer.encode(
        tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True, tokenize=False), add_special_tokens=False
    )
    large, small = ScriptedLM(tokenizer, LARGE, len(prompt_ids)), ScriptedLM(tokenizer, SMALL, len(prompt_ids))
    engine = RelayEngine.from_models(large, small, tokenizer, cues="none")  # type: ignore[arg-type]
    trace = engine.generate_ids(prompt_ids, mode="large", max_new_tokens=64)
    assert trace.text == LARGE
    return engine, [Trace(prompt_ids, trace.completion_ids, trace.text)] * 3  # three problems, the same answer


def test_a_cue_the_large_model_rejects_is_dropped_and_one_it_keeps_is_selected(tokenizer):
    engine, traces = scripted_pair(tokenizer)
    runners = engine.backend.runners
    rule = VerifyRule.parse("greedy")
    calls: list[dict[int, set[int]]] = []

    def run(positions):
        calls.append(positions)
        return run_trials(traces, positions, runners["small"], runners["large"], tokenizer, rule, engine.eos_ids)

    margins = calibrate(traces, [[0.5] * len(t.completion_ids) for t in traces], tokenizer, ["So", "Hence", "Then"])
    result = verified_calibrate(traces, tokenizer, ["So", "Hence", "Never"], run, COSTS, rule, margins)
    rows = {row.cue: row for row in result.table}
    so, hence, never = rows["So"], rows["Hence"], rows["Never"]
    assert (so.occurrences, so.traces, hence.occurrences) == (3, 3, 3)
    assert so.kept == so.written > 0 and so.rejected_share == 0.0  # " the sum is 5." verbatim
    assert hence.kept == 3 and hence.written > hence.kept  # " the" kept, " answer ..." rejected, per occurrence
    assert so.saved_ms > 0 > hence.saved_ms
    assert result.selected == ["So"]
    assert never.occurrences == 0 and not never.selected
    assert so.mean_margin == pytest.approx(0.5)  # the margin test's column travels along
    # Each (trace, position) ran once, and only for cues that occur often enough.
    assert len(calls) == 1 and sum(len(p) for p in calls[0].values()) == 6


def test_cheap_enough_sentences_pay_even_when_partly_rejected(tokenizer):
    # Same trials, a machine where the small model costs nothing next to the baseline: "Hence" pays now, since one
    # verification pass gives its kept token plus the large model's correction.
    engine, traces = scripted_pair(tokenizer)
    runners, rule = engine.backend.runners, VerifyRule.parse("greedy")

    def run(positions):
        return run_trials(traces, positions, runners["small"], runners["large"], tokenizer, rule, engine.eos_ids)

    cheap = PairCosts(small_token_ms=0.1, baseline_token_ms=10.0, pass_ms={1: 5.0, 32: 5.0})
    assert verified_calibrate(traces, tokenizer, ["So", "Hence"], run, cheap, rule).selected == ["So", "Hence"]


def test_occurrences_start_after_the_cue_and_rare_cues_never_run(tokenizer):
    _engine, traces = scripted_pair(tokenizer)
    text, ends = token_char_ends(tokenizer, traces[0].completion_ids)
    (position,) = cue_token_positions(text, ends, "So")
    assert text[: ends[position - 1]].endswith("So") and text[ends[position - 1] :].startswith(" the sum")

    def run(positions):
        raise AssertionError("nothing should run")

    result = verified_calibrate(traces[:2], tokenizer, ["So"], run, COSTS, VerifyRule.parse("greedy"))
    assert result.selected == [] and result.table[0].occurrences == 2  # below min_traces=3: listed, never run


def test_pass_costs_interpolate_and_extrapolate():
    costs = PairCosts(1.0, 10.0, {1: 100.0, 8: 150.0, 32: 300.0})
    assert costs.verify_pass_ms(1) == 100.0
    assert costs.verify_pass_ms(20) == pytest.approx(150.0 + 150.0 * 12 / 24)
    assert costs.verify_pass_ms(64) == pytest.approx(300.0 + 150.0 * 32 / 24)
    assert costs.saved_ms(written=10, kept=10) == pytest.approx(110.0 - (10.0 + costs.verify_pass_ms(11)))
    assert SentenceTrial(4, 2) == SentenceTrial(written=4, kept=2)


def test_the_calibrate_command_runs_verified_calibration_and_refuses_missing_costs(tokenizer, tmp_path, capsys):
    import json

    from helpers import tiny_qwen2
    from test_calibrate import write_costs

    from relaygen_integrations.cli.main import main

    for role, seed in (("large", 1), ("small", 2)):
        tiny_qwen2(tokenizer, seed=seed).save_pretrained(tmp_path / role)
        tokenizer.save_pretrained(tmp_path / role)
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"question": f"What is {i} + {i}?", "answer": f"#### {2 * i}"}) + "\n"
                            for i in range(2)))  # fmt: skip
    costs, pass_cost = write_costs(tmp_path, "fp32")
    base = ["calibrate", "--large", str(tmp_path / "large"), "--small", str(tmp_path / "small"), "--data", str(data),
            "--n", "2", "--max-new-tokens", "12", "--dtype", "fp32",
            "--out", str(tmp_path / "new" / "p.json")]  # fmt: skip
    with pytest.raises(SystemExit, match="--costs BENCH_DIR and --pass-cost"):
        main(base)
    with pytest.raises(SystemExit, match="no large-model row for 'fp32'"):
        main([*base, "--costs", str(costs), "--pass-cost", str(write_costs(_mkdir(tmp_path / "x"), "int8")[1])])
    assert main([*base, "--costs", str(costs), "--pass-cost", str(pass_cost), "--verify", "ratio:0.5",
                 "--min-occurrences", "1", "--min-traces", "1"]) == 0  # fmt: skip
    profile = json.loads((tmp_path / "new" / "p.json").read_text())
    assert (tmp_path / "new" / "p-verified.png").exists()
    assert profile["verified"]["rule"] == "ratio:0.5"
    assert profile["verified"]["costs"]["small_token_ms"] == 40.0
    assert profile["selected_cues"] == profile["verified"]["selected_cues"]


def _mkdir(path):
    path.mkdir()
    return path


def test_costs_come_from_the_baseline_mode_or_a_relay_mode_time_split():
    from relaygen_integrations.calibrate.verified import costs_from_runs

    pass_cost = {"seconds": {"large": {"int8": {"1": 0.1, "8": 0.15}}}}
    summary = {
        "large#int8": {"s_per_token": 0.097},
        "large-spec#int8": {"s_per_token": 0.12, "ms_per_small_token": 44.0},
        "relay+verify@prob:0.2#int8": {
            "s_per_token": 0.06,
            "time_split_s": {"small.decode": 3.0},
            "kept_small_per_problem": 50.0,
            "rejected_per_problem": 10.0,
        },
    }
    spec = costs_from_runs({"summary": summary}, pass_cost, "int8")
    assert (spec.small_token_ms, spec.baseline_token_ms, spec.pass_ms) == (50.0, 120.0, {1: 100.0, 8: 150.0})
    plain = costs_from_runs({"summary": summary}, pass_cost, "int8", mode="large#int8")
    assert plain.small_token_ms == pytest.approx(50.0) and plain.baseline_token_ms == pytest.approx(97.0)
    del summary["relay+verify@prob:0.2#int8"]  # no sentences measured: a drafted token's cost
    assert costs_from_runs({"summary": summary}, pass_cost, "int8").small_token_ms == 44.0
    with pytest.raises(ValueError, match="no baseline mode 'large'"):
        costs_from_runs({"summary": summary}, pass_cost, "int8", mode="large")
