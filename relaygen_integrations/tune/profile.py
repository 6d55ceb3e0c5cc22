"""A pair's tuning entry: its benchmarked modes' work and accuracy, read from benchmark runs, kept in its profile.

``relaygen tune --profile-from RESULTS[:MODE,...] ...`` reads saved runs (``relaygen bench``'s ``results.json``) and
writes the profile's ``"tuning"`` entry; the engine reads it back with :func:`profiled_modes`. A mode is taken from
the run that has the most problems of it; its evidence compares it with ``large`` on the problems both solved or
attempted in that run (never across runs: problems and machines differ).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .candidates import Evidence, ProfiledMode, join_mode, split_mode
from .work import work_from_runs

TUNING_KEY = "tuning"


def _canonical(name: str, run_formats: str) -> str:
    """The mode's name with its formats spelled out (``large`` in a bf16 run -> ``large#bf16``), its ``@N`` draft
    vocabulary dropped (the vocabulary is recorded beside it)."""
    base, large, small = split_mode(name, run_formats)
    head, at, arg = base.partition("@")
    if at and arg.isdigit():
        base = head
    return join_mode(base, large, small)


def modes_from_results(sources: Sequence[tuple[Path, Sequence[str] | None]]) -> dict[str, ProfiledMode]:
    """Profiled modes from saved runs: ``sources`` = (results.json path, modes to take or None for all)."""
    chosen: dict[str, ProfiledMode] = {}
    for path, wanted in sources:
        saved = json.loads(Path(path).read_text(encoding="utf-8"))
        machine, config = saved.get("machine", {}), saved.get("config", {})
        run_formats = str(machine.get("dtype") or config.get("dtype") or "bf16")
        draft_vocab = machine.get("draft_vocab", config.get("draft_vocab"))
        runs: list[dict[str, Any]] = saved["runs"]
        by_mode: dict[str, list[dict[str, Any]]] = {}
        for run in runs:
            by_mode.setdefault(run["mode"], []).append(run)
        reference = {run["problem"]: run for run in by_mode.get("large", [])}
        for mode, mode_runs in by_mode.items():
            if wanted is not None and mode not in wanted:
                continue
            base = mode.split("#")[0]
            vocab = int(base.split("@")[1]) if "@" in base and base.split("@")[1].isdigit() else draft_vocab
            speculative = "spec" in base.split("@")[0]
            name = _canonical(mode, run_formats)
            paired = [run for run in mode_runs if run["problem"] in reference]
            evidence = None
            if paired and mode != "large":
                evidence = Evidence(
                    problems=len(paired),
                    solved=sum(bool(run["correct"]) for run in paired),
                    reference_solved=sum(bool(reference[run["problem"]]["correct"]) for run in paired),
                    benchmark=str(Path(path).parent),
                )
            profiled = ProfiledMode(name, work_from_runs(mode_runs), evidence, vocab if speculative else None)
            if name not in chosen or profiled.work.runs > chosen[name].work.runs:
                chosen[name] = profiled
    return chosen


def tuning_entry(modes: Mapping[str, ProfiledMode], sources: Iterable[str]) -> dict[str, Any]:
    return {
        "why": "each benchmarked mode's work (passes per token: machine-independent) and accuracy against large; "
        "relaygen tune prices the work with this machine's pass costs and picks the fastest backed mode",
        "sources": sorted(set(sources)),
        "modes": {name: mode.to_json() for name, mode in sorted(modes.items())},
    }


def profiled_modes(profile: Mapping[str, Any]) -> dict[str, ProfiledMode]:
    """The profile's tuning modes (empty when it has none)."""
    entry = profile.get(TUNING_KEY)
    if not isinstance(entry, Mapping):
        return {}
    return {name: ProfiledMode.from_json(name, data) for name, data in entry.get("modes", {}).items()}
