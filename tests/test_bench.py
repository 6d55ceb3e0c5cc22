"""Benchmark harness: grading, summary maths, outputs (fast), and `relaygen bench --quick` on the real pair."""

from __future__ import annotations

import json

import pytest
from helpers import chat_engine

from relaygen_integrations.bench import (
    BenchConfig,
    Run,
    answers_match,
    extract_answer,
    render_markdown,
    rerender,
    run_benchmark,
    summarize,
)
from relaygen_integrations.cli import main


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so the answer is \\boxed{18}.", "18"),
        ("\\boxed{1,250} dollars, not 3", "1250"),
        ("first \\boxed{3} then \\boxed{\\frac{1}{2} = 7}", "1"),
        ("Total: 12 apples.\n#### 42", "42"),
        ("She pays $3.50 and then $4.25", "4.25"),
        ("no number here", None),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_answers_match_numerically():
    assert answers_match("18.0", "18") and answers_match("1250", "1,250")
    assert not answers_match(None, "3") and not answers_match("2", "3")


def run(mode: str, seconds: float, tokens: int, small: int = 0, correct: bool = True) -> Run:
    return Run(0, mode, seconds, tokens, "stop", "", "1", "1", correct, small_tokens=small, switches=2 if small else 0)


def test_summary_computes_ideal_and_measured_speedups():
    runs = [run("large", 10.0, 100), run("small", 4.0, 100), run("relay", 8.0, 100, small=30, correct=False)]
    summary = summarize(runs, ["large", "small", "relay"])
    relay = summary["relay"]
    assert relay["r"] == pytest.approx(0.4)
    assert relay["small_share"] == pytest.approx(0.3)
    assert relay["ideal_speedup"] == pytest.approx(1 / (0.7 + 0.3 * 0.4))
    assert relay["measured_speedup"] == pytest.approx(1.25)
    assert relay["efficiency"] == pytest.approx(1.25 * (0.7 + 0.3 * 0.4))
    assert relay["accuracy"] == 0.0 and summary["large"]["accuracy"] == 1.0
    assert relay["median_speedup_vs_large"] == pytest.approx(1.25)


def test_summary_splits_time_between_the_models():
    spec = Run(0, "large-spec", 6.0, 100, "stop", "", "1", "1", True, speculative_rounds=25, draft_tokens=120,
               accepted_draft_tokens=75, large_forward_seconds=3.0, small_forward_seconds=2.4)  # fmt: skip
    large = Run(0, "large", 10.0, 100, "stop", "", "1", "1", True, large_forward_seconds=9.5)
    summary = summarize([large, spec], ["large", "large-spec"])
    assert summary["large"]["large_forward_ms_per_token"] == pytest.approx(95.0)
    assert summary["large"]["other_ms_per_token"] == pytest.approx(5.0)
    entry = summary["large-spec"]
    assert entry["small_forward_ms_per_token"] == pytest.approx(24.0)
    assert entry["ms_per_verify_pass"] == pytest.approx(120.0)
    assert entry["ms_per_small_token"] == pytest.approx(20.0)
    assert entry["tokens_per_verify_pass"] == pytest.approx(4.0)
    assert entry["acceptance_rate"] == pytest.approx(75 / 120) and entry["mean_draft_length"] == pytest.approx(4.8)
    report = render_markdown({"config": BenchConfig(modes=["large"]).model_dump(mode="json"), "summary": summary,
                              "machine": {"cpu": "x", "cores": 2, "threads": 2, "torch": "t", "dtype": "bf16",
                                          "device": "cpu"}})  # fmt: skip
    assert "| large-spec | 30 | 24 | 6 | 60 | 120 | 20 | 4.00 |" in report
    # Under relay the small model's time also covers its own segments: each of its tokens is one decode step.
    relay_spec = Run(0, "relay-spec", 5.0, 100, "stop", "", "1", "1", True, small_tokens=30, speculative_rounds=20,
                     draft_tokens=90, large_forward_seconds=2.0, small_forward_seconds=2.4)  # fmt: skip
    entry = summarize([large, relay_spec], ["large", "relay-spec"])["relay-spec"]
    assert entry["ms_per_small_token"] == pytest.approx(20.0) and entry["tokens_per_verify_pass"] == pytest.approx(3.5)


def test_benchmark_writes_every_output(tmp_path, tokenizer):
    engine = chat_engine(tokenizer, "We add them. So the total is 18. Thus \\boxed{18}.", cues=["So "])
    config = BenchConfig(n=2, modes=["large", "small", "relay", "reprompt"], max_new_tokens=60, out=tmp_path)
    report = run_benchmark(config, engine=engine)
    assert {r["mode"] for r in report["runs"]} == {"large", "small", "relay", "reprompt"}
    assert report["summary"]["large"]["accuracy"] == 0.5  # problem 1's answer is 18, problem 2's is 3
    assert report["summary"]["relay"]["small_share"] > 0
    for name in ("results.json", "report.md", "speed_accuracy.png", "traces.html"):
        assert (tmp_path / name).stat().st_size > 0
    assert "class='small'" in (tmp_path / "traces.html").read_text()
    assert json.loads((tmp_path / "results.json").read_text())["machine"]["cores"] >= 1
    # Resuming keeps finished problems and runs only the missing ones; settings must match.
    more = run_benchmark(config.model_copy(update={"n": 3, "resume": True}), engine=engine)
    assert [r["problem"] for r in more["runs"]] == [r["problem"] for r in report["runs"]] + [2] * 4
    assert more["runs"][: len(report["runs"])] == report["runs"]
    # The mode list may shrink: new problems run the kept modes, the dropped modes keep the problems they have.
    fewer = run_benchmark(
        config.model_copy(update={"n": 4, "resume": True, "modes": ["large", "relay"]}), engine=engine
    )
    assert sorted(r["mode"] for r in fewer["runs"] if r["problem"] == 3) == ["large", "relay"]
    assert fewer["summary"]["small"]["n"] == 3 and fewer["summary"]["large"]["n"] == 4
    with pytest.raises(ValueError, match="max_new_tokens"):
        run_benchmark(config.model_copy(update={"max_new_tokens": 7, "resume": True}), engine=engine)
    report = json.loads((tmp_path / "results.json").read_text())
    (tmp_path / "report.md").unlink()
    assert rerender(tmp_path)["summary"] == report["summary"] and (tmp_path / "report.md").exists()


def test_modes_compare_cue_sets_in_one_run(tmp_path, tokenizer):
    engine = chat_engine(tokenizer, "We add them. So the total is 18. Thus \\boxed{18}.", cues=["So "])
    modes = ["large", "relay", "relay@none", "reprompt@generic"]
    config = BenchConfig(n=1, modes=modes, max_new_tokens=60, out=tmp_path)
    summary = run_benchmark(config, engine=engine)["summary"]
    assert summary["relay"]["small_share"] > 0 and summary["relay@none"]["small_share"] == 0
    assert summary["reprompt@generic"]["small_share"] > 0
    assert summary["relay@none"]["switches_per_problem"] == 0 < summary["relay"]["switches_per_problem"]
    with pytest.raises(ValueError, match="relay@nonsense"):
        run_benchmark(BenchConfig(n=1, modes=["relay@nonsense"], out=tmp_path), engine=engine)


@pytest.mark.real_pair
def test_bench_quick_runs_every_mode_on_the_demo_pair(tmp_path):
    assert main(["bench", "--quick", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "results.json").read_text())
    modes = {"large", "small", "relay", "reprompt", "hf-large", "assisted"}
    assert {r["mode"] for r in report["runs"]} == modes and len(report["runs"]) == 12
    assert all(r["completion_tokens"] > 0 for r in report["runs"])
    assert all(r["finish_reason"] == "length" for r in report["runs"])  # 48 tokens never finish a GSM8K answer
    assert "| relay |" in (tmp_path / "report.md").read_text()
