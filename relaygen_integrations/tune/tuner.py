"""Tuning a pair on this machine: its pass costs, measured once and cached, priced against its profiled modes.

``tune_pair`` is what the engine's first use of a known pair and ``relaygen tune`` run:

1. The machine's identity (``machine.py``) keys a cache file ``$RELAYGEN_HOME/tune/<pair>-<key>.json``; a cached
   table that covers the formats asked for is used as it is (no measurement).
2. Otherwise the formats the pair's candidates need are measured (``measure.py``, at most ``budget`` seconds with a
   progress bar) and cached.
3. ``choose.choose`` prices every candidate and picks the fastest accuracy-backed one, on the table corrected by
   what an engine's passes cost here since (``observed.py``: kept in the same file, and kept when it is measured
   again).

``RELAYGEN_TUNE=off`` in the environment turns this off everywhere: the engine then runs the profile's shipped
configuration. Passing any of the configuration's settings explicitly never measures either (``configuration.py``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..engine.core.pairs import ModelLoadError, resolve_reference
from ..engine.local.loading import gguf_source, in_format, load_causal_lm
from ..engine.local.weights import pick_weights
from ..registry.cache import relaygen_home
from .choose import Choice, choose
from .costs import PassCostTable
from .machine import MachineIdentity, this_machine
from .measure import DEFAULT_BUDGET_SECONDS, MEASURE_METHOD, POSITIONS, ModelPassTimer, PassTimer, measure_pass_costs
from .observed import ObservedCosts, corrected_table, read_observed, write_observed
from .profile import profiled_modes

TUNE_ENV = "RELAYGEN_TUNE"
# What a machine measures, in priority order: the shipped default's formats first (large bf16, small int8), so a
# cut-short budget still prices it, then the small bf16 drafter. Then the large model in the GGUF's own 4-bit weights
# (``gguf``, only for a pair whose GGUF is kept here: ``default_plan``): its one-token step took 144 ms against bf16's
# 275 on a 2-core AVX512-BF16 EPYC, but loading it took 14.2 s there (``benchmarks/data/pass-cost-gguf``), so it
# comes after the cheap small-model loads; and it is accuracy-backed only by a run's evidence (``candidates.py``).
# fp32 for the large model last: a faithful format whose wide passes beat bf16's where bf16 is emulated (AVX2 only:
# 1.41 s against 1.77 over 8 positions, but 435 ms against 292 for one; measuring its copy peaked at 10.4 GiB,
# ``tune-avx2-epyc``), the largest load of the plan. int8 for the large model is left out: no mode with it is
# accuracy-backed, and quantizing the 1.5B model alone takes 27 s on the AVX2 EPYC (``relaygen tune --formats`` can
# ask for it).
# A table cached before a format joined the plan does not cover it, so ``load_cached`` measures that machine once
# more at its next first use (a pair whose GGUF is kept later, or a cache from before ``gguf`` was planned): intended,
# the new format is then priced.
CPU_PLAN: tuple[tuple[str, str], ...] = (
    ("large", "bf16"),
    ("small", "int8"),
    ("small", "bf16"),
    ("large", "gguf"),
    ("large", "fp32"),
)
CUDA_PLAN: tuple[tuple[str, str], ...] = (("large", "bf16"), ("small", "bf16"))
GGUF_FORMAT = "gguf"


def tuning_enabled() -> bool:
    return os.environ.get(TUNE_ENV, "").strip().lower() not in {"off", "0", "false", "no"}


def pair_has_gguf(pair: str) -> bool:
    """Whether ``pair_model_loader`` can load the pair's large model in ``gguf``: ``gguf_source``, which it calls,
    finds the file (a known pair's kept GGUFs, ``relaygen models fetch`` keeps them; for another name, the one
    ``*.gguf`` in the directory it names). Reads the disk only; never downloads."""
    try:
        gguf_source(pair, pair, "large")
    except (ModelLoadError, ValueError, OSError):
        return False
    return True


def default_plan(device: torch.device, pair: str | None = None) -> tuple[tuple[str, str], ...]:
    """What ``device`` measures for ``pair`` (``CPU_PLAN``'s comment): ``gguf`` only where the pair has a GGUF."""
    if device.type == "cuda":
        return CUDA_PLAN
    if pair is not None and pair_has_gguf(pair):
        return CPU_PLAN
    return tuple(item for item in CPU_PLAN if item[1] != GGUF_FORMAT)


def cache_path(pair: str, machine: MachineIdentity | str, home: Path | None = None) -> Path:
    """Where ``pair``'s table for ``machine`` (or its ``key()``) is cached."""
    key = machine if isinstance(machine, str) else machine.key()
    return (home or relaygen_home()) / "tune" / f"{pair}-{key}.json"


def load_cached(path: Path, plan: Sequence[tuple[str, str]]) -> PassCostTable | None:
    """The cached table when it was measured as ``measure.py`` measures now (``MEASURE_METHOD``) and covers every
    (role, format) of ``plan``: measured, or tried when it was measured (a format the budget left out stays out,
    rather than making every later start measure again); else None."""
    try:
        table = PassCostTable.from_json(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if table.machine.get("method") != MEASURE_METHOD:
        return None
    tried = set(table.machine.get("plan", []))
    return table if all(table.has(role, fmt) or f"{role}:{fmt}" in tried for role, fmt in plan) else None


def pair_model_loader(pair: str, device: torch.device) -> Callable[[str, str], torch.nn.Module]:
    """Loads the known pair's model for ``role`` in ``fmt`` as the engine would hold it. fp32 is timed on the bf16
    copy upcast (the same shapes and kernels; the fp32 copy's values only matter for what it writes)."""

    def load(role: str, fmt: str) -> torch.nn.Module:
        weights = pick_weights(fmt, device)
        reference, _ = resolve_reference(pair, role, "bf16")  # type: ignore[arg-type]
        model = load_causal_lm(reference, torch.bfloat16, device)
        if weights.quantized or weights.gguf_int4:
            return in_format(model, weights, gguf_source(pair, reference, role) if weights.gguf_int4 else None)
        return model.to(weights.dtype)

    return load


@dataclass
class Tuned:
    choice: Choice
    table: PassCostTable
    machine: MachineIdentity
    cached: bool  # the table came from the cache (nothing was measured)
    path: Path
    observed: ObservedCosts  # an engine's passes on this machine since (``observed.py``); ``choice`` priced with them


def measure_with_progress(
    timer: PassTimer, plan: Sequence[tuple[str, str]], budget: float, show_progress: bool
) -> PassCostTable:
    if not show_progress:
        return measure_pass_costs(timer, plan, budget_seconds=budget)
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("[bold]tuning[/bold] {task.description}"), BarColumn(), TimeElapsedColumn(),
                  transient=True) as progress:  # fmt: skip
        task = progress.add_task("pass costs", total=len(plan) * len(POSITIONS))

        def advance(what: str) -> None:
            progress.update(task, advance=1, description=what)

        return measure_pass_costs(timer, plan, budget_seconds=budget, on_progress=advance)


def tune_pair(
    pair: str,
    profile: Mapping[str, Any],
    device: torch.device,
    *,
    refresh: bool = False,
    plan: Sequence[tuple[str, str]] | None = None,
    budget: float = DEFAULT_BUDGET_SECONDS,
    timer: PassTimer | None = None,
    home: Path | None = None,
    show_progress: bool = True,
) -> Tuned:
    """Measures (or reads the cached) pass costs of ``pair`` on this machine and chooses (module docstring)."""
    modes = profiled_modes(profile)
    if not modes:
        raise ValueError(f"the {pair!r} profile has no 'tuning' entry: run relaygen tune --profile-from first")
    plan = tuple(plan or default_plan(device, pair))
    machine = this_machine(device)
    path = cache_path(pair, machine, home)
    table = None if refresh else load_cached(path, plan)
    cached = table is not None
    if table is None:
        timer = timer or ModelPassTimer(pair_model_loader(pair, device))
        table = measure_with_progress(timer, plan, budget, show_progress)
        table.machine = machine.to_json() | {"plan": [f"{role}:{fmt}" for role, fmt in plan], "method": MEASURE_METHOD}
        path.parent.mkdir(parents=True, exist_ok=True)
        observed = read_observed(path)  # facts about this machine whatever the table: kept
        table.save(path)
        if observed.cells:
            write_observed(path, observed)
    observed = read_observed(path)
    return Tuned(choose(modes, corrected_table(table, observed)), table, machine, cached, path, observed)
