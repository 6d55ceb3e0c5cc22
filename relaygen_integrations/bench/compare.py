"""`relaygen bench --compare A B`: one mode of two saved runs side by side, on the problems both ran.

A run's report compares modes within one run. Comparing what differs between runs - a weight format (int8 against
bf16), an engine (a server against local models), a machine - needs the same pairing across two ``results.json``
files: which problems only one of them solved, and seconds per token on the shared problems only. Speed-ups across
runs are as comparable as the two machines were: both machine lines are printed with the table.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .report import machine_text
from .summary import Run, paired_with_large


class CompareError(ValueError):
    """A saved run that cannot be compared; ``field`` names the argument at fault."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def load_saved(out: Path, field: str) -> tuple[dict[str, Any], list[Run]]:
    """The machine line and runs of a saved bench directory."""
    path = out / "results.json"
    if not path.is_file():
        raise CompareError(field, f"{path} does not exist (a `relaygen bench --out` directory holds it)")
    saved = json.loads(path.read_text())
    return saved["machine"], [Run(**run) for run in saved["runs"]]


def compare_runs(a_runs: list[Run], b_runs: list[Run], mode_a: str, mode_b: str) -> dict[str, Any]:
    """``mode_a`` of run A against ``mode_b`` of run B, on the problems both ran: problems each solved, those only
    one solved (0-based), and B's speed-up over A in seconds per token."""
    a = [r for r in a_runs if r.mode == mode_a]
    b = [r for r in b_runs if r.mode == mode_b]
    for runs, mode, field in ((a, mode_a, "A"), (b, mode_b, "B")):
        if not runs:
            raise CompareError(field, f"run {field} has no {mode!r} runs")
    paired = paired_with_large(a, b)
    if not paired["paired"]:
        raise CompareError("B", f"runs A and B share no problem for {mode_a!r} / {mode_b!r}")
    shared = {r.problem for r in a} & {r.problem for r in b}
    return {
        "paired": paired["paired"],
        "correct_a": paired["both"] + len(paired["only_large"]),
        "correct_b": paired["both"] + len(paired["only_mode"]),
        "only_a": paired["only_large"],
        "only_b": paired["only_mode"],
        "speedup_b_over_a": paired.get("paired_speedup", 0.0),
        "tok_per_s_a": _tokens_per_second(a, shared),
        "tok_per_s_b": _tokens_per_second(b, shared),
    }


def _tokens_per_second(runs: list[Run], problems: set[int]) -> float:
    seconds = sum(r.seconds for r in runs if r.problem in problems)
    return sum(r.completion_tokens for r in runs if r.problem in problems) / seconds if seconds else 0.0


def _numbers(problems: list[int]) -> str:
    return f"{len(problems)} ({', '.join(f'#{p + 1}' for p in problems)})" if problems else "0"


def render_comparison(
    comparison: dict[str, Any], labels: tuple[str, str], machines: tuple[dict[str, Any], dict[str, Any]]
) -> str:
    """Markdown: both machine lines, then one table row (problem numbers from 1, as in traces.html)."""
    c = comparison
    return "\n".join([
        f"A: {labels[0]} - {machine_text(machines[0])}",
        "",
        f"B: {labels[1]} - {machine_text(machines[1])}",
        "",
        "| problems | A solves | B solves | only A | only B | A tok/s | B tok/s | B speed-up (s/token) |",
        "|---|---|---|---|---|---|---|---|",
        f"| {c['paired']} | {c['correct_a']} | {c['correct_b']} | {_numbers(c['only_a'])} | {_numbers(c['only_b'])} "
        f"| {c['tok_per_s_a']:.2f} | {c['tok_per_s_b']:.2f} | {c['speedup_b_over_a']:.2f}× |",
    ])  # fmt: skip


def compare_saved(dir_a: Path, dir_b: Path, mode_a: str, mode_b: str) -> str:
    """The comparison of two saved bench directories, rendered (``relaygen bench --compare``)."""
    machine_a, runs_a = load_saved(dir_a, "A")
    machine_b, runs_b = load_saved(dir_b, "B")
    comparison = compare_runs(runs_a, runs_b, mode_a, mode_b)
    return render_comparison(comparison, (f"{dir_a} `{mode_a}`", f"{dir_b} `{mode_b}`"), (machine_a, machine_b))
