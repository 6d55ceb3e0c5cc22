"""A pair's tuning entry: its benchmarked modes' work and accuracy, read from benchmark runs, kept in its profile.

``relaygen tune --profile-from RESULTS[:MODE,...] ... [--reference RESULTS.json]`` reads saved runs (``relaygen
bench``'s ``results.json``) and writes the profile's ``"tuning"`` entry; the engine reads it back with
:func:`profiled_modes`. A mode is taken from the run that has the most problems of it; its evidence compares it with
``large`` on the problems both solved or attempted in that run (across runs only as below: problems and machines
may differ).

A run without a ``large`` of its own (one that measured only new formats, say ``large#gguf``) is compared with the
``large`` runs of ``--reference`` instead, on the problems both have: the bf16 ``large`` greedy text is reproducible
on one CPU class (29 of 30 texts identical between ``relay-vs-spec-60`` and ``tune-check-avx512bf16``, runs many
commits apart), so another run's ``large`` stands for it. Only where nothing that decides that text differs:
:data:`REFERENCE_CONFIG_KEYS` of the runs' ``config`` and :data:`REFERENCE_MACHINE_KEYS` of their ``machine`` (another
CPU class or torch can write other greedy text), else :class:`ReferenceMismatchError`. Such evidence names both runs
(``benchmarks/data/x (reference large: benchmarks/data/y)``). A run with its own ``large`` ignores the reference.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..engine.core.shipped import TUNING_KEY
from ..engine.local.cpu import kernel_flags
from .candidates import Evidence, ProfiledMode, join_mode, split_mode
from .work import work_from_runs

REFERENCE_OPTION = "--reference"
# What decides the greedy text of ``large`` besides the model: the problems, how long an answer may run, sampling.
REFERENCE_CONFIG_KEYS = ("data", "max_new_tokens", "temperature")
# And the kernels that compute it: the CPU class (its instruction sets) and the torch build.
REFERENCE_MACHINE_KEYS = ("cpu_flags", "torch")


class ReferenceMismatchError(ValueError):
    """``--reference`` cannot stand for a run's ``large``: it has none, or it ran under other settings."""


def _canonical(name: str, run_formats: str) -> str:
    """The mode's name with its formats spelled out (``large`` in a bf16 run -> ``large#bf16``), its ``@N`` draft
    vocabulary dropped (the vocabulary is recorded beside it)."""
    base, large, small = split_mode(name, run_formats)
    head, at, arg = base.partition("@")
    if at and arg.isdigit():
        base = head
    return join_mode(base, large, small)


def _large_runs(saved: Mapping[str, Any]) -> dict[Any, dict[str, Any]]:
    return {run["problem"]: run for run in saved["runs"] if run["mode"] == "large"}


def _comparable(value: Any) -> Any:
    """A config or machine value as it decides the text: a flag list as the kernels it selects (``cpu.py``)."""
    return kernel_flags(value) if isinstance(value, list) else value


def check_reference(saved: Mapping[str, Any], path: Path, reference: Mapping[str, Any], reference_path: Path) -> None:
    """Raises :class:`ReferenceMismatchError` unless ``reference``'s ``large`` may stand for ``saved``'s (module
    docstring): every key of :data:`REFERENCE_CONFIG_KEYS` and :data:`REFERENCE_MACHINE_KEYS` the same."""
    for section, keys in (("config", REFERENCE_CONFIG_KEYS), ("machine", REFERENCE_MACHINE_KEYS)):
        ours, theirs = saved.get(section, {}), reference.get(section, {})
        for key in keys:
            if _comparable(ours.get(key)) != _comparable(theirs.get(key)):
                raise ReferenceMismatchError(
                    f"{REFERENCE_OPTION} {reference_path}: its {section} {key!r} is {theirs.get(key)!r} but {path}'s "
                    f"is {ours.get(key)!r}; its large may write other text, so it is no reference for that run"
                )


def load_reference(path: Path) -> dict[str, Any]:
    """The reference run, refused (:class:`ReferenceMismatchError`) when it has no ``large`` runs."""
    saved: dict[str, Any] = json.loads(Path(path).read_text(encoding="utf-8"))
    if not _large_runs(saved):
        raise ReferenceMismatchError(f"{REFERENCE_OPTION} {path}: it has no 'large' runs to compare with")
    return saved


def modes_from_results(
    sources: Sequence[tuple[Path, Sequence[str] | None]], reference: Path | None = None
) -> dict[str, ProfiledMode]:
    """Profiled modes from saved runs: ``sources`` = (results.json path, modes to take or None for all);
    ``reference``: the results.json whose ``large`` runs stand for those of a run that has none (module docstring)."""
    reference_saved = load_reference(reference) if reference is not None else None
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
        large = _large_runs(saved)
        benchmark = str(Path(path).parent)
        if not large and reference is not None and reference_saved is not None:  # both or neither: for mypy
            check_reference(saved, Path(path), reference_saved, reference)
            large = _large_runs(reference_saved)
            benchmark = f"{benchmark} (reference large: {Path(reference).parent})"
        for mode, mode_runs in by_mode.items():
            if wanted is not None and mode not in wanted:
                continue
            base = mode.split("#")[0]
            vocab = int(base.split("@")[1]) if "@" in base and base.split("@")[1].isdigit() else draft_vocab
            speculative = "spec" in base.split("@")[0]
            name = _canonical(mode, run_formats)
            paired = [run for run in mode_runs if run["problem"] in large]
            evidence = None
            if paired and mode != "large":
                evidence = Evidence(
                    problems=len(paired),
                    solved=sum(bool(run["correct"]) for run in paired),
                    reference_solved=sum(bool(large[run["problem"]]["correct"]) for run in paired),
                    benchmark=benchmark,
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
