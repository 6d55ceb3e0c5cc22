"""The tuner beside the benchmark: each mode's predicted seconds per token next to the measured, and ``--modes auto``.

A run on a machine the tuner has measured (``relaygen tune``: ``$RELAYGEN_HOME/tune/``) keeps that machine's pass
costs in its ``results.json`` (``pass_costs``), so its report - rerendered anywhere - prices each mode's own work
(``tune/work.py``: its passes per token, recorded by every run) with them: a check of the cost model on every run.
Each mode is priced twice: with the table as measured, and with the table corrected (``tune/observed.py``) by what
the run's *other* modes paid for their passes - the same host at the same hours, since a run interleaves its modes -
which checks the cost model's work and overhead apart from how far the host has moved since the table was measured.
``--modes auto`` runs ``large`` and the tuner's fastest accuracy-backed candidates on this machine.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ..engine.core.pairs import known_pair
from ..engine.core.shipped import shipped_profile
from ..tune.candidates import split_mode
from ..tune.cost_model import seconds_per_token
from ..tune.costs import PassCostTable
from ..tune.machine import this_machine
from ..tune.observed import ObservedCosts, corrected_table
from ..tune.tuner import cache_path, tune_pair, tuning_enabled
from ..tune.work import work_from_runs
from .summary import Run

AUTO_MODES = "auto"
AUTO_CANDIDATES = 3  # the tuner's fastest backed candidates that ``--modes auto`` runs beside ``large``


def _device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def machine_pass_costs(large: str, small: str) -> dict[str, Any] | None:
    """This machine's cached pass-cost table for the pair (as saved); None when it was never tuned here, or tuning
    is off (``RELAYGEN_TUNE=off``)."""
    pair = known_pair(large, small)
    if pair is None or not tuning_enabled():
        return None
    path = cache_path(pair, this_machine(_device()))
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def auto_modes(large: str, small: str) -> list[str]:
    """``large`` and the tuner's fastest backed candidates on this machine (tuning it first if it never was), as
    benchmark modes; candidates the benchmark cannot name (``+compile`` formats) are left out."""
    pair = known_pair(large, small)
    profile = shipped_profile(pair)
    if pair is None or profile is None:
        raise ValueError("--modes auto needs a known pair with a profile (e.g. demo)")
    choice = tune_pair(pair, profile.data, _device()).choice
    picked: list[str] = []
    for priced in choice.ranked:
        candidate = priced.candidate
        if not candidate.backed or "+compile" in candidate.name or len(picked) == AUTO_CANDIDATES:
            continue
        base, _, formats = candidate.name.partition("#")
        vocab = f"@{candidate.draft_vocab}" if candidate.draft_vocab and "@" not in base else ""
        picked.append(f"{base}{vocab}#{formats}")
    return ["large", *[m for m in picked if m.split("#")[0] != "large" or m.split("#")[1] != "bf16"]]


def mode_formats(mode: str, run_formats: str, configurations: Mapping[str, Mapping[str, Any]]) -> tuple[str, str]:
    """The (large, small) formats a bench mode ran in: its own (``#...``), else its engine configuration's
    (``default``: whatever the bench's ``--dtype``), else the run's."""
    _, large, small = split_mode(mode, str(configurations.get(mode, {}).get("dtype", run_formats)))
    return large, small


def predicted_rows(
    runs: Sequence[Run],
    modes: Sequence[str],
    pass_costs: Mapping[str, Any],
    run_formats: str,
    configurations: Mapping[str, Mapping[str, Any]],
) -> dict[str, dict[str, float]]:
    """Per mode: its runs' work priced with ``pass_costs`` against its measured seconds per token; where the other
    modes recorded their passes' seconds, also priced with the table those correct (module docstring)."""
    table = PassCostTable.from_json(pass_costs)
    rows: dict[str, dict[str, float]] = {}

    def formats_of(mode: str) -> dict[str, str]:
        large, small = mode_formats(mode, run_formats, configurations)
        compiled = "+compile" if configurations.get(mode, {}).get("compile") else ""
        return {"large": large + compiled, "small": small + compiled}

    for mode in modes:
        mode_runs = [r for r in runs if r.mode == mode and r.passes]
        tokens = sum(r.completion_tokens for r in mode_runs)
        if not mode_runs or not tokens:
            continue
        work = work_from_runs([{"passes": r.passes, "completion_tokens": r.completion_tokens} for r in mode_runs])
        predicted = seconds_per_token(work, table, formats_of(mode))
        if predicted is None:
            continue
        measured = sum(r.seconds for r in mode_runs) / tokens
        rows[mode] = {"predicted_s_per_token": predicted, "measured_s_per_token": measured,
                      "ratio": predicted / measured}  # fmt: skip
        others = ObservedCosts()
        for run in runs:
            if run.mode != mode and run.mode in modes and run.pass_seconds:
                others.add(formats_of(run.mode), run.passes, run.pass_seconds)
        corrected = seconds_per_token(work, corrected_table(table, others), formats_of(mode)) if others.cells else None
        if corrected is not None:
            rows[mode] |= {"corrected_s_per_token": corrected, "corrected_ratio": corrected / measured}
    return rows


def render_predicted(report: Mapping[str, Any]) -> list[str]:
    rows = report.get("predicted") or {}
    if not rows:
        return []
    lines = [
        "",
        "## Predicted against measured (the tuner's cost model)",
        "",
        "Each mode's own work (its forward passes by size, per token) priced with this machine's pass costs "
        "(`relaygen tune`), against its measured seconds per token; then with those costs corrected by what the "
        "run's other modes paid for their passes (`tune/observed.py`: the host's level during the run).",
        "",
        "| mode | predicted ms/token | measured ms/token | predicted / measured | corrected ms/token | "
        "corrected / measured |",
        "|---|---|---|---|---|---|",
    ]
    for mode, row in rows.items():
        corrected = (f"{row['corrected_s_per_token'] * 1000:.1f} | {row['corrected_ratio']:.2f}"
                     if "corrected_s_per_token" in row else "- | -")  # fmt: skip
        lines.append(f"| {mode} | {row['predicted_s_per_token'] * 1000:.1f} | "
                     f"{row['measured_s_per_token'] * 1000:.1f} | {row['ratio']:.2f} | {corrected} |")  # fmt: skip
    configurations = report.get("configurations") or {}
    if "default" in configurations:
        lines += ["", f"`default` ran the engine's own configuration: `{json.dumps(configurations['default'])}`."]
    return lines
