"""The docs checker takes a run's speed-up, percentage or solved count only as the quantity the figure's text names
(issue 44).

A fake bench run of three modes, summarized by the bench's own ``summarize``, and one-block docs quoting it: a figure
that the run holds under another mode or another metric fails, the same figure beside the right mode and metric
passes. A percentage is taken as the named modes' named share (``percents_of``, through ``percent_backed``), on the
fake run and on the 60-problem run.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import pytest
from docs_data import DATA, ROOT, Block, Evidence, figures, rounds_to
from docs_quantities import BENCH_MODES, bench_mode, percents_of, quantity_of, run_modes

from relaygen_integrations.bench.summary import Run, summarize

# Per mode: seconds and completion tokens per problem, and which problems it solved. Chosen so that every speed-up
# differs: large-spec answers 2.00× faster in total, 2.25× in the median over problems, and 2.40× per token.
FAKE_RUN = {
    "large": ([10, 10, 10, 10], 100, [True, True, True, False]),
    "large-spec": ([2, 4, 5, 9], 120, [True, True, False, False]),
    "relay-spec": ([3, 3, 3, 3], 90, [True, False, False, False]),
}
# Per problem: speculative rounds, drafted and accepted tokens. large-spec accepts 75 % of its drafts - the run's 75 %
# is also large's accuracy, and its 25 % relay-spec's: a percentage that exists under another quantity.
DRAFTS = {"large-spec": {"speculative_rounds": 10, "draft_tokens": 40, "accepted_draft_tokens": 30}}


Summary = dict[str, dict[str, float]]
Backed = Callable[[str, str], bool]


def fake_runs() -> list[Run]:
    return [
        Run(problem, mode, seconds[problem], tokens, "stop", "", "1", "1", solved, **DRAFTS.get(mode, {}))
        for mode, (seconds, tokens, correct) in FAKE_RUN.items()
        for problem, solved in enumerate(correct)
    ]


@pytest.fixture(scope="module")
def summary() -> Summary:
    return summarize(fake_runs(), list(FAKE_RUN))


@pytest.fixture(scope="module")
def backed(summary: Summary) -> Backed:
    """Whether the checker accepts ``figure`` in a block whose text is ``text`` and that names the fake run."""
    saved = {"summary": summary, "runs": [asdict(r) for r in fake_runs()]}
    evidence = Evidence.of("", "", (run_modes(saved),))

    def check(text: str, figure: str) -> bool:
        block = Block(ROOT / "docs" / "fake.md", 1, f"In the fake run (`benchmarks/data/fake/`): {text}", ())
        found = [f for f in figures(block.text) if f.text == figure]
        assert found, f"{figure!r} is not a figure of {block.text!r}"
        return evidence.backs(found[0], block)

    return check


def speedup(summary: Summary, mode: str, key: str) -> str:
    return f"{summary[mode][key]:.2f}×"


def test_the_fake_run_tells_its_quantities_apart(summary: Summary) -> None:
    values = [
        speedup(summary, mode, key)
        for mode in ("large-spec", "relay-spec")
        for key in ("answer_speedup_vs_large", "speedup_vs_large")
    ] + [speedup(summary, "large-spec", "median_answer_speedup_vs_large")]
    assert len(set(values)) == len(values), values


def test_a_speedup_of_another_mode_fails_and_of_the_named_mode_passes(summary: Summary, backed: Backed) -> None:
    own = speedup(summary, "large-spec", "answer_speedup_vs_large")
    other = speedup(summary, "relay-spec", "answer_speedup_vs_large")
    assert backed(f"`large-spec` answers {own} faster than `large` per answer.", own)
    assert not backed(f"`large-spec` answers {other} faster than `large` per answer.", other)
    assert backed(f"relay-spec answers {other} faster than `large` per answer.", other)  # a bare name counts
    # A mode the run lacks: none of its values is that mode's.
    assert not backed(f"`relay` answers {own} faster than `large` per answer.", own)


def test_a_speedup_of_another_metric_fails(summary: Summary, backed: Backed) -> None:
    per_answer = speedup(summary, "large-spec", "answer_speedup_vs_large")
    per_token = speedup(summary, "large-spec", "speedup_vs_large")
    median = speedup(summary, "large-spec", "median_answer_speedup_vs_large")
    assert not backed(f"`large-spec` answers {per_token} faster than `large` per answer.", per_token)
    assert backed(f"`large-spec` writes {per_token} faster than `large` per token.", per_token)
    assert not backed(f"`large-spec` writes {per_answer} faster than `large` per token.", per_answer)
    # A median over problems is a median only where the text says so.
    assert not backed(f"`large-spec` answers {median} faster than `large` per answer.", median)
    assert backed(f"`large-spec` answers {per_answer} faster per answer (median per problem {median}).", median)


def test_a_table_row_names_its_mode_and_its_column_the_metric(summary: Summary, backed: Backed) -> None:
    answer, token = (speedup(summary, "large-spec", k) for k in ("answer_speedup_vs_large", "speedup_vs_large"))
    other = speedup(summary, "relay-spec", "answer_speedup_vs_large")
    header = "\n\n| mode | speed-up per answer | per token |\n|---|---|---|\n"
    assert backed(f"{header}| `large-spec` | {answer} | {token} |", answer)
    assert backed(f"{header}| `large-spec` | {answer} | {token} |", token)
    assert not backed(f"{header}| `large-spec` | {token} | {answer} |", token)  # the columns swapped
    assert not backed(f"{header}| `large-spec` | {other} | {token} |", other)  # relay-spec's row value


def test_a_text_that_names_no_mode_takes_any_modes_speedup_but_nothing_else(summary: Summary, backed: Backed) -> None:
    other = speedup(summary, "relay-spec", "answer_speedup_vs_large")
    assert backed(f"the fastest mode answers {other} faster per answer.", other)
    assert not backed("the fastest mode answers 10.00× faster per answer.", "10.00×")  # large's mean s, not a ratio


def test_a_solved_count_is_the_named_modes(backed: Backed) -> None:
    assert backed("`large-spec` solved 2/4.", "2/4")
    assert not backed("`large-spec` solved 1/4.", "1/4")  # relay-spec's count
    assert backed("the run's modes solved 1/4 to 3/4.", "1/4")


def test_bench_modes_cover_every_saved_run() -> None:
    """A saved run's modes are the bench's: a new mode name belongs in ``BENCH_MODES``, or the docs' mentions of it go
    unseen and a figure after one is taken as the mode named before it."""
    modes = {m for p in DATA.rglob("results.json") for m in json.loads(p.read_text(encoding="utf-8"))["summary"]}
    assert modes and not {m for m in modes if bench_mode(m) not in BENCH_MODES}


def percent_backed(text: str, figure: str, saved: dict[str, Any]) -> bool:
    """Whether a bench run backs the percentage ``figure`` of ``text`` as the quantity the text names: one of the
    named modes' named shares, rounded as the text writes it."""
    run = run_modes(saved)
    found = [f for f in figures(text) if f.text == figure and f.unit == "%"]
    assert found, f"{figure!r} is not a percentage of {text!r}"
    quantity = quantity_of(text, found[0].start, [list(run)])
    return any(rounds_to(n, found[0].value, found[0].decimals, (1.0,)) for n in percents_of([run], quantity))


def test_a_percentage_is_the_named_modes_named_share(summary: Summary) -> None:
    saved = {"summary": summary, "runs": [asdict(r) for r in fake_runs()]}

    def backed(text: str, figure: str) -> bool:
        return percent_backed(f"In the fake run (`benchmarks/data/fake/`): {text}", figure, saved)

    assert backed("`large-spec` solves 50 % of the problems.", "50 %")
    assert not backed("`large-spec` solves 25 % of the problems.", "25 %")  # relay-spec's accuracy
    assert not backed("`large-spec` solves 75 % of the problems.", "75 %")  # its acceptance, and large's accuracy
    assert backed("`large-spec` accepts 75 % of its drafts.", "75 %")
    assert not backed("`large-spec` accepts 50 % of its drafts.", "50 %")  # its accuracy
    assert not backed("`large` accepts 75 % of the drafts.", "75 %")  # large drafts nothing
    header = "\n\n| mode | accuracy | drafts accepted |\n|---|---|---|\n"
    assert backed(f"{header}| `large-spec` | 50 % | 75 % |", "75 %")
    assert not backed(f"{header}| `large-spec` | 75 % | 50 % |", "75 %")  # the columns swapped
    # A text that names no mode and no share takes any mode's share, but nothing else of the run: not 12 %.
    assert backed("a mode reaches 25 %.", "25 %")
    assert not backed("a mode reaches 12 %.", "12 %")


@pytest.mark.parametrize(
    ("sentence", "figure", "holds"),
    [
        ("verified relay over int8 threw away {} of the small model's tokens", "51 %", True),
        ("verified relay over int8 threw away {} of the small model's tokens", "56 %", True),  # the other verified
        ("verified relay over int8 threw away {} of the small model's tokens", "36 %", False),  # an accuracy
        ("verified relay over int8 threw away {} of the small model's tokens", "11 %", False),  # a small share
        ('the default (`mode="large"`, `speculative=True`, `dtype="bf16/int8"`) solves {}', "60 %", True),
        ('the default (`mode="large"`, `speculative=True`, `dtype="bf16/int8"`) solves {}', "65 %", False),  # large's
        ('the default (`mode="large"`, `speculative=True`, `dtype="bf16/int8"`) solves {}', "86 %", False),  # accepted
    ],
)
def test_a_percentage_of_the_60_problem_run_is_the_named_one(sentence: str, figure: str, holds: bool) -> None:
    """Issue 44 on the 60-problem run: each figure here is in the run, only some as the quantity the text names."""
    saved = json.loads((DATA / "relay-vs-spec-60" / "results.json").read_text(encoding="utf-8"))
    text = "On this pair ([run](benchmarks/data/relay-vs-spec-60/report.md)) " + sentence.format(figure) + "."
    assert percent_backed(text, figure, saved) is holds
