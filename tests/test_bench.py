"""Benchmark harness: grading, summary maths, outputs (fast), and `relaygen bench --quick` on the real pair."""

from __future__ import annotations

import json
import re
from dataclasses import asdict

import pytest
import torch
from helpers import chat_engine

from relaygen_integrations import RelayEngine
from relaygen_integrations.bench.run import (
    BenchConfig,
    Run,
    answers_match,
    extract_answer,
    is_relay_mode,
    load_completed_runs,
    machine_info,
    make_modes,
    render_markdown,
    rerender,
    run_benchmark,
    summarize,
)
from relaygen_integrations.bench.summary import paired_accuracy_gain, pareto_front
from relaygen_integrations.cli.main import main


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


def run(
    mode: str,
    seconds: float,
    tokens: int,
    small: int = 0,
    correct: bool = True,
    problem: int = 0,
    rejected: int = 0,
    verified: int = 0,
    spans: list[dict] | None = None,
) -> Run:
    return Run(problem, mode, seconds, tokens, "stop", "", "1", "1", correct, small_tokens=small,
               switches=2 if small else 0, verified_tokens=verified, rejected_tokens=rejected,
               spans=spans or [])  # fmt: skip


MACHINE = {"cpu": "x", "cores": 2, "threads": 2, "torch": "t", "dtype": "bf16", "device": "cpu"}


def markdown(summary: dict) -> str:
    return render_markdown({"config": BenchConfig().model_dump(mode="json"), "summary": summary, "machine": MACHINE})


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
    # An added mode runs on every saved problem; nothing already measured runs again.
    more_modes = run_benchmark(
        config.model_copy(update={"n": 4, "resume": True, "modes": ["large", "relay", "relay+verify@greedy"]}),
        engine=engine,
    )
    assert more_modes["runs"][: len(fewer["runs"])] == fewer["runs"]
    added = more_modes["runs"][len(fewer["runs"]) :]
    assert [(r["problem"], r["mode"]) for r in added] == [(p, "relay+verify@greedy") for p in range(4)]
    assert more_modes["config"]["modes"] == ["large", "small", "relay", "reprompt", "relay+verify@greedy"]
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


def test_summary_of_a_verify_mode_counts_the_rejected_share():
    verify = "relay+verify@prob:0.05"
    runs = [
        run("large", 10.0, 100),
        run("large", 10.0, 100, problem=1),
        run("small", 4.0, 100),
        run("relay", 8.0, 100, small=30),
        run("relay", 8.0, 100, small=30, problem=1),
        run(verify, 9.0, 100, small=30, rejected=10),
        run(verify, 9.0, 100, small=10, rejected=30, problem=1),
    ]
    summary = summarize(runs, ["large", "small", "relay", verify])
    entry = summary[verify]
    assert entry["rejected_share"] == pytest.approx(40 / 80)  # dropped / (dropped + kept) over both problems
    assert entry["rejected_per_problem"] == pytest.approx(20.0)
    assert entry["small_share"] == pytest.approx(40 / 200)  # a relay mode: it gets the relay columns too
    assert entry["measured_speedup"] == pytest.approx(10 / 9) and "efficiency" in entry
    assert "rejected_share" not in summary["relay"] and "rejected_share" not in summary["large"]
    main_table = markdown(summary).split("Paired against")[0]
    rows = {line.split(" | ")[0].removeprefix("| "): line for line in main_table.splitlines() if "×" in line}
    assert rows[verify].endswith(" | 50% |") and rows["relay"].endswith(" | – |") and rows["large"].endswith(" | – |")
    assert "| mode | accuracy |" in markdown(summary) and " | drafts accepted | rejected |" in markdown(summary)


def test_verification_cost_per_problem_counts_segments_checks_and_rejections():
    verify = "relay+verify@greedy"
    spans = [
        {"model": "large", "trigger": "start"},
        {"model": "small", "trigger": "cue:So"},
        {"model": "large", "trigger": "rejected"},  # the small segment above was cut after some kept tokens
        {"model": "large", "trigger": "rejected"},  # a whole segment rejected: no small span left behind
        {"model": "small", "trigger": "cue:Thus"},
        {"model": "large", "trigger": "sentence_end"},
    ]
    runs = [
        run("large", 10.0, 100),
        run(verify, 9.0, 100, small=12, verified=12, rejected=20, spans=spans),
        run("relay", 8.0, 100, small=30, spans=[{"model": "large"}, {"model": "small"}, {"model": "large"}]),
    ]
    summary = summarize(runs, ["large", "relay", verify])
    entry = summary[verify]
    assert entry["checked_per_problem"] == 32 and entry["rejected_per_problem"] == 20
    assert entry["rejections_per_problem"] == 2 and entry["segments_per_problem"] == 3
    assert entry["kept_small_per_problem"] == 12
    table = markdown(summary).split("Verification per problem")[1]
    assert f"| {verify} | 3.0 | 32 | 2.0 | 20 | 12 |" in table
    assert "| relay (unverified) | 1.0 | – | – | – | 30 |" in table


def test_paired_view_against_large():
    large = [run("large", 1.0, 10, correct=c, problem=p) for p, c in enumerate([True, True, True, False, False])]
    # relay ran problems 0, 1, 3, 4 (not 2): both solve 0, only large solves 1, only relay solves 3, neither 4.
    relay = [run("relay", 1.0, 10, small=3, correct=c, problem=p) for p, c in [(0, True), (1, False), (3, True),
                                                                              (4, False)]]  # fmt: skip
    summary = summarize(large + relay, ["large", "relay"])
    entry = summary["relay"]
    assert (entry["paired"], entry["both"], entry["only_large"], entry["only_mode"]) == (4, 1, [1], [3])
    assert (summary["large"]["only_large"], summary["large"]["only_mode"], summary["large"]["both"]) == ([], [], 3)
    report = markdown(summary)
    assert (
        "| mode | problems | both solve | only large | only mode | accuracy gained | speed-up per answer | per token |"
        in report
    )
    assert "| relay | 4 | 1 | 1 (#2) | 1 (#4) | +0 pts | 1.00× |" in report  # numbered from 1, as in traces.html
    assert "| large | 5 |" not in report
    # Without the large model there is nothing to pair with.
    alone = summarize(relay, ["relay"])
    assert "only_large" not in alone["relay"] and "Paired against large" not in markdown(alone)


def test_pareto_front_compares_each_mode_with_large_on_the_problems_they_share():
    large = [run("large", 10.0, 100, correct=p < 2, problem=p) for p in range(4)]  # solves 0 and 1
    # Faster on its own problems (2 and 3 only), where large solves neither and it solves one: +50 points, 2x.
    fast = [run("fast", 5.0, 100, correct=p == 3, problem=p) for p in (2, 3)]
    # Slower than large and loses problem 1: dominated by large itself.
    slow = [run("slow", 20.0, 100, correct=p == 0, problem=p) for p in range(4)]
    # Faster than large, loses problem 0: on the front, below large.
    lossy = [run("lossy", 8.0, 100, correct=p == 1, problem=p) for p in range(4)]
    # As fast as fast and less accurate: dominated by it.
    dominated = [run("dominated", 5.0, 100, correct=False, problem=p) for p in range(4)]
    summary = summarize(large + fast + slow + lossy + dominated, ["large", "fast", "slow", "lossy", "dominated"])
    assert summary["fast"]["paired_speedup"] == pytest.approx(2.0)
    assert paired_accuracy_gain(summary["fast"]) == pytest.approx(0.5)
    assert paired_accuracy_gain(summary["lossy"]) == pytest.approx(-0.25)
    assert summary["slow"]["paired_speedup"] == pytest.approx(0.5)
    assert pareto_front(summary) == ["fast"]  # fast beats large (2x, +50) and lossy; large is dominated too
    del summary["fast"]
    assert pareto_front(summary) == ["dominated", "lossy", "large"]  # fastest first
    report = markdown(summary)
    assert "Pareto front (no other mode" in report and "`dominated`, `lossy`, `large`." in report
    assert "| lossy | 4 | 1 | 1 (#1) | 0 | -25 pts | 1.25× |" in report


def test_verify_modes_are_parsed_and_checked_up_front(tmp_path, tokenizer):
    engine = chat_engine(tokenizer, "We add them. So the total is 18. Thus \\boxed{18}.", cues=["So "])
    names = ["relay+verify@greedy", "relay-spec+verify@ratio:0.1+answer", "relay@none"]
    assert sorted(make_modes(engine, BenchConfig(modes=names))) == sorted(names)
    assert all(is_relay_mode(name) for name in names) and not is_relay_mode("large-spec+verify@greedy")
    for bad in ("relay+verify@nonsense", "relay+verify@prob:2", "relay-spec+verify@greedy+draft"):
        with pytest.raises(ValueError, match=re.escape(f"benchmark mode {bad!r}")):
            run_benchmark(BenchConfig(n=1, modes=["large", bad], out=tmp_path), engine=engine)
    assert not (tmp_path / "results.json").exists()  # rejected before any problem ran
    with pytest.raises(ValueError, match="unknown benchmark modes"):
        run_benchmark(BenchConfig(n=1, modes=["reprompt+verify@greedy"], out=tmp_path), engine=engine)
    # The small model writes upper case, so the greedy rule rejects each of its segments whole: relay+verify writes
    # the large model's text, and the run records what was dropped.
    config = BenchConfig(n=1, modes=["large", "relay", "relay+verify@greedy"], max_new_tokens=60, out=tmp_path)
    report = run_benchmark(config, engine=engine)
    runs = {r["mode"]: r for r in report["runs"]}
    assert runs["relay+verify@greedy"]["text"] == runs["large"]["text"] != runs["relay"]["text"]
    assert runs["relay+verify@greedy"]["rejected_tokens"] > 0 and runs["relay"]["rejected_tokens"] == 0
    entry = report["summary"]["relay+verify@greedy"]
    assert entry["rejected_share"] == 1.0 and entry["small_share"] == 0 and "only_large" in entry


def test_results_saved_before_verification_still_summarize(tmp_path):
    config = BenchConfig(n=2, modes=["large", "relay"], out=tmp_path)
    runs = [run("large", 10.0, 100, problem=p, correct=p == 0) for p in (0, 1)]
    runs += [run("relay", 8.0, 100, small=30, problem=p, correct=p == 1) for p in (0, 1)]
    saved = [asdict(r) for r in runs]
    for entry in saved:
        del entry["verified_tokens"], entry["rejected_tokens"]
    results = {"config": config.model_dump(mode="json"), "machine": machine_info(config), "runs": saved, "summary": {}}
    (tmp_path / "results.json").write_text(json.dumps(results))
    summary = rerender(tmp_path)["summary"]
    assert summary["relay"]["small_share"] == pytest.approx(0.3) and "rejected_share" not in summary["relay"]
    assert (summary["relay"]["only_large"], summary["relay"]["only_mode"]) == ([0], [1])
    assert "| relay | 2 | 0 | 1 (#1) | 1 (#2) |" in (tmp_path / "report.md").read_text()
    resumed, modes = load_completed_runs(config.model_copy(update={"resume": True}))
    assert modes == ["large", "relay"] and [(r.verified_tokens, r.rejected_tokens) for r in resumed] == [(0, 0)] * 4


@pytest.mark.real_pair
def test_bench_quick_runs_every_mode_on_the_demo_pair(tmp_path):
    assert main(["bench", "--quick", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "results.json").read_text())
    modes = {"large", "small", "relay", "reprompt", "hf-large", "assisted"}
    assert {r["mode"] for r in report["runs"]} == modes and len(report["runs"]) == 6
    assert all(r["completion_tokens"] > 0 for r in report["runs"])
    assert all(r["finish_reason"] == "length" for r in report["runs"])  # 32 tokens never finish a GSM8K answer
    assert "| relay |" in (tmp_path / "report.md").read_text()


def test_compare_pairs_one_mode_of_two_saved_runs(tmp_path, capsys):
    def save(name: str, dtype: str, runs: list[Run]) -> None:
        (tmp_path / name).mkdir()
        machine = {**MACHINE, "dtype": dtype}
        saved = {"config": {}, "machine": machine, "runs": [asdict(r) for r in runs]}
        (tmp_path / name / "results.json").write_text(json.dumps(saved))

    # bf16 ran problems 0-3, int8 problems 1-4 at half the seconds per token: shared 1, 2, 3.
    save("bf16", "bf16", [run("large", 2.0, 10, correct=c, problem=p) for p, c in enumerate([True, True, False, True])])
    save("int8", "int8", [run("large", 1.0, 10, correct=c, problem=p)
                          for p, c in [(1, False), (2, True), (3, True), (4, True)]]
         + [run("relay", 1.0, 10, small=3, correct=False, problem=p) for p in (1, 2)])  # fmt: skip
    assert main(["bench", "--compare", str(tmp_path / "bf16"), str(tmp_path / "int8")]) == 0
    out = capsys.readouterr().out
    assert "bf16 on cpu" in out and "int8 on cpu" in out  # both machine lines
    assert "| 3 | 2 | 2 | 1 (#2) | 1 (#3) | 5.00 | 10.00 | 2.00× |" in out
    # A mode of A against another mode of B, on the problems they share (1 and 2).
    assert main(["bench", "--compare", str(tmp_path / "bf16"), str(tmp_path / "int8"), "--compare-mode",
                 "large,relay"]) == 0  # fmt: skip
    assert "| 2 | 1 | 0 | 1 (#2) | 0 |" in capsys.readouterr().out
    # Bad input names the argument at fault, before any work.
    assert main(["bench", "--compare", str(tmp_path / "bf16"), str(tmp_path / "missing")]) == 1
    assert "B: " in capsys.readouterr().err
    assert main(["bench", "--compare", str(tmp_path / "bf16"), str(tmp_path / "int8"), "--compare-mode", "small"]) == 1
    assert "A: run A has no 'small' runs" in capsys.readouterr().err


def test_spec_modes_take_a_draft_vocabulary_size_and_write_the_same_text(tmp_path, tokenizer):
    from helpers import tiny_qwen2

    from relaygen_integrations import RelayEngine

    large, small = tiny_qwen2(tokenizer, seed=1), tiny_qwen2(tokenizer, seed=2, hidden=32, layers=1)
    engine = RelayEngine.from_models(large, small, tokenizer, cues=["the"], draft_confidence=0.0)
    modes = ["large-spec", "large-spec@2000", "relay-spec@generic"]
    report = run_benchmark(BenchConfig(n=1, modes=modes, max_new_tokens=16, out=tmp_path), engine=engine)
    runs = {r["mode"]: r for r in report["runs"]}
    assert runs["large-spec@2000"]["text"] == runs["large-spec"]["text"]  # drafts over a subset change no token
    assert runs["large-spec@2000"]["draft_tokens"] > 0 and runs["relay-spec@generic"]["speculative_rounds"] > 0
    assert is_relay_mode("relay-spec@generic") and not is_relay_mode("large-spec@2000")
    with pytest.raises(ValueError, match=re.escape("benchmark mode 'large-spec@generic'")):
        run_benchmark(BenchConfig(n=1, modes=["large-spec@generic"], out=tmp_path / "bad"), engine=engine)


def test_speed_up_per_answer_leads_and_orders_the_summary():
    # A mode that writes fewer tokens in less time per answer but more per token: per answer and per token disagree,
    # and the summary (and so the report and the Pareto front) follow per answer.
    large = [run("large", 10.0, 100, problem=p) for p in range(3)]
    short = [run("relay", s, 40, problem=p) for p, s in enumerate([5.0, 4.0, 6.0])]  # 0.125 s/token vs large's 0.1
    spec = [run("large-spec", 6.0, 100, problem=p) for p in range(3)]
    summary = summarize(large + short + spec, ["large", "large-spec", "relay"])
    assert summary["relay"]["answer_speedup_vs_large"] == pytest.approx(30 / 15)
    assert summary["relay"]["median_answer_speedup_vs_large"] == pytest.approx(2.0)
    assert summary["relay"]["speedup_vs_large"] == pytest.approx(0.8)
    assert summary["large-spec"]["answer_speedup_vs_large"] == pytest.approx(10 / 6)
    assert list(summary) == ["relay", "large-spec", "large"]
    assert pareto_front(summary)[0] == "relay"
    assert "| relay | 100% | **2.00×** | 2.00× |" in markdown(summary)


def test_time_split_per_answer_interprets_the_passes():
    split = {"large.decode": 4.0, "large.verify_sentences": 1.0, "small.decode": 2.0, "small.draft": 1.0}
    runs = [
        Run(
            0,
            "relay-spec+verify@greedy",
            9.0,
            100,
            "stop",
            "",
            "1",
            "1",
            True,
            small_tokens=30,
            rejected_tokens=10,
            verified_tokens=30,
            speculative_rounds=5,
            draft_tokens=20,
            accepted_draft_tokens=15,
            time_split=split,
        ),
        run("large", 10.0, 100),
    ]
    summary = summarize(runs, ["large", "relay-spec+verify@greedy"])
    got = summary["relay-spec+verify@greedy"]["time_split_s"]
    assert got["small.decode.thrown_away"] == pytest.approx(2.0 * 10 / 40)  # 10 of the 40 written were rejected
    assert got["small.draft.rejected"] == pytest.approx(1.0 * 5 / 20)
    assert got["other"] == pytest.approx(9.0 - 8.0)
    assert "time_split_s" not in summary["large"]  # no split recorded (results saved before it existed)
    report = markdown(summary)
    assert "Where the time goes, per answer" in report
    assert (
        "| relay-spec+verify@greedy | 9.0 | 4.0 | – | – | – | – | 1.0 | 2.0 | 0.5 | 1.0 | 0.2 | – | – | 1.0 |" in report
    )


def test_resume_refuses_a_run_measured_on_another_cpu(tmp_path):
    config = BenchConfig(out=tmp_path, n=1, modes=["large"], resume=True)
    machine = machine_info(config) | {"cpu": "Another CPU", "cpu_flags": ["avx2"]}
    runs = [asdict(run("large", 1.0, 10))]
    (tmp_path / "results.json").write_text(json.dumps({"config": config.model_dump(mode="json"), "machine": machine,
                                                       "runs": runs}))  # fmt: skip
    with pytest.raises(ValueError, match="measured on Another CPU"):
        load_completed_runs(config)


def test_a_mode_may_run_in_other_weight_formats_in_the_same_run(tmp_path, tokenizer):
    from helpers import tiny_qwen2

    for role, seed in (("large", 1), ("small", 2)):
        tiny_qwen2(tokenizer, seed=seed).to(torch.bfloat16).save_pretrained(tmp_path / role)
        tokenizer.save_pretrained(tmp_path / role)
    pair = {"large": str(tmp_path / "large"), "small": str(tmp_path / "small"), "cues": "generic"}
    modes = ["large", "large#bfloat16", "large#int8", "large-spec#bf16/int8", "relay+verify@greedy#int8"]
    config = BenchConfig(n=1, modes=modes, max_new_tokens=6, out=tmp_path / "out", dtype="bf16", **pair)
    engine = RelayEngine.from_pretrained(pair["large"], pair["small"], cues="generic", dtype="bf16")
    loaded: list[str] = []
    original = RelayEngine.from_pretrained.__func__  # type: ignore[attr-defined]

    def spy(cls, *args, **kwargs):
        loaded.append(kwargs["dtype"])
        return original(cls, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(RelayEngine, "from_pretrained", classmethod(spy))
        report = run_benchmark(config, engine=engine)
    # One load per distinct combination; "bfloat16" is the run's own bf16 and reuses its engine.
    assert loaded == ["int8", "bf16/int8"]
    assert {r["mode"] for r in report["runs"]} == set(modes)
    assert set(report["summary"]) == set(modes) and is_relay_mode("relay+verify@greedy#int8")
    runs = {r["mode"]: r for r in report["runs"]}
    assert runs["large#bfloat16"]["text"] == runs["large"]["text"]  # the same weights
    assert runs["large-spec#bf16/int8"]["text"] == runs["large"]["text"]  # an int8 drafter: the large model's text
    assert runs["large-spec#bf16/int8"]["draft_tokens"] > 0
    with pytest.raises(ValueError, match=r"benchmark mode 'large#int4'.*the large model's dtype"):
        run_benchmark(config.model_copy(update={"modes": ["large", "large#int4"]}), engine=engine)


def test_each_mode_is_predicted_beside_the_measured_where_the_machine_was_tuned(tmp_path, tokenizer):
    """A run on a tuned machine keeps its pass costs: each mode's own recorded passes priced with them stand beside
    its measured seconds per token, in results.json and report.md, and survive a rerender."""
    from helpers import tiny_qwen2

    large, small = tiny_qwen2(tokenizer, seed=1), tiny_qwen2(tokenizer, seed=2)
    engine = RelayEngine.from_models(large, small, tokenizer, cues="generic")
    costs = {"seconds": {role: {"fp32": {"1": 0.01, "8": 0.02}} for role in ("large", "small")}}
    config = BenchConfig(n=1, modes=["large", "large-spec"], max_new_tokens=8, out=tmp_path, dtype="fp32")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("relaygen_integrations.bench.run.machine_pass_costs", lambda large, small: costs)
        report = run_benchmark(config, engine=engine)
    runs = {r["mode"]: r for r in report["runs"]}
    assert runs["large-spec"]["passes"]["large"] and runs["large-spec"]["passes"]["small"]
    large_run = runs["large"]
    steps = sum(large_run["passes"]["large"].values())
    # The prompt in two passes (up to its last token, then that token), then one step per token but the first.
    assert steps == large_run["completion_tokens"] + 1
    predicted = report["predicted"]["large"]["predicted_s_per_token"]
    by_size = {int(k): n for k, n in large_run["passes"]["large"].items()}
    expected = sum(n * (0.01 if k == 1 else 0.01 + (0.02 - 0.01) / 7 * (k - 1)) for k, n in by_size.items())
    assert predicted == pytest.approx(expected / large_run["completion_tokens"] + 0.001)
    assert "Predicted against measured" in (tmp_path / "report.md").read_text()
    (tmp_path / "report.md").unlink()
    assert rerender(tmp_path)["predicted"] == report["predicted"]
    assert "Predicted against measured" in (tmp_path / "report.md").read_text()


def test_machine_pass_costs_are_not_read_while_tuning_is_off(monkeypatch):
    from relaygen_integrations.bench.predicted import machine_pass_costs

    monkeypatch.setenv("RELAYGEN_TUNE", "off")
    assert machine_pass_costs("demo", "demo") is None
