"""What this machine's passes really cost, observed while the engine runs, and the cost table corrected by them.

A first-use table (``measure.py``) is one sweep of each pass size, taken within a minute, and the host it measures
moves: on the 2-core Xeon of ``benchmarks/data/tune-check-avx512`` the large model's one-token step read 315 ms, and
218 ms an hour later (``tune_table_later.json``); the AVX2-forced run there was priced from a table that read 221 ms
where its answers paid 278-337 ms a step, and predicted 0.72 of the measured. The engine times every forward pass it
runs anyway (``Usage.pass_seconds``), so an engine running a tuned configuration records them beside the table it
was tuned with (``CostRecorder``), and the next choice prices with the table corrected by them:

1. Observed passes are kept per (role, format, positions) as summed seconds and counts (:class:`ObservedCosts`).
   Once a format has ``REMEMBERED_PASSES`` of them every count and sum is halved, so old observations fade (the
   host's level moves within an hour).
2. Each observed pass is set against what the measured table prices it at, by bucket of sizes - the sizes up to
   each measured size (1; 2; 3-4; 5-8; ...) and one bucket past the last - giving a bucket's ratio
   ``sum of observed seconds / sum of measured cost(k) over the same passes``. A mismeasured step and a mismeasured
   wide pass are corrected each by its own ratio; the measured shape inside a bucket is kept.
3. A pass's corrected cost is its measured cost times its bucket's ratio where that bucket has ``MIN_PASSES``
   observed passes; else the ratio over every observed pass of its (role, format); else, for a format not observed
   here, the ratio over every observed pass of the machine - the host's level moves every format alike, and leaving
   the unobserved ones at their measured level would favour them by the drift alone; else 1 (nothing observed).

Pure functions over plain data, but for :class:`CostRecorder`, which writes the observations into the tuner's cache
file (atomically; a failure to write is logged, never raised into a generation).
"""

from __future__ import annotations

import bisect
import json
import logging
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .costs import PassCosts, PassCostTable

logger = logging.getLogger(__name__)

# Observed passes of a (role, format) bucket before its own ratio is trusted: one noisy pass (a page fault, another
# process's burst) moves a single time by 2-5x on a 2-core machine (``docs/tuning.md``), eight move a mean far less;
# one demo answer gives a speculative mode's main buckets dozens each.
MIN_PASSES = 8
# Passes of one format remembered at full weight: ~10-20 demo answers of a speculative mode, about the hour within
# which this Xeon's step moved by a third. Past it every observation's weight halves.
REMEMBERED_PASSES = 4000
OBSERVED_KEY = "observed"  # where the cache file keeps them, beside the measured table's "seconds"

Cells = dict[int, list[float]]  # positions -> [observed seconds, passes]


@dataclass
class ObservedCosts:
    """Summed seconds and counts of the forward passes an engine ran, by role, format and positions read."""

    cells: dict[str, dict[str, Cells]] = field(default_factory=dict)

    def add(
        self,
        formats: Mapping[str, str],
        passes: Mapping[str, Mapping[Any, int]],
        pass_seconds: Mapping[str, Mapping[Any, float]],
    ) -> None:
        """Adds one generation's passes (``Usage.passes`` and ``Usage.pass_seconds``; positions as ints or, read
        back from JSON, strings) for models running in ``formats`` (role -> format)."""
        for role, counts in passes.items():
            fmt = formats.get(role)
            if fmt is None:
                continue
            seconds = {int(k): float(v) for k, v in pass_seconds.get(role, {}).items()}
            cells = self.cells.setdefault(role, {}).setdefault(fmt, {})
            for key, count in counts.items():
                spent = seconds.get(int(key), 0.0)
                if count <= 0 or spent <= 0:
                    continue
                cell = cells.setdefault(int(key), [0.0, 0.0])
                cell[0] += float(spent)
                cell[1] += float(count)
            if sum(cell[1] for cell in cells.values()) > REMEMBERED_PASSES:
                for cell in cells.values():
                    cell[0], cell[1] = cell[0] / 2, cell[1] / 2

    def passes(self, role: str, fmt: str) -> float:
        return sum(cell[1] for cell in self.cells.get(role, {}).get(fmt, {}).values())

    def to_json(self) -> dict[str, Any]:
        return {
            role: {
                fmt: {str(k): [round(s, 6), n] for k, (s, n) in sorted(cells.items())} for fmt, cells in by_fmt.items()
            }
            for role, by_fmt in self.cells.items()
        }

    @classmethod
    def from_json(cls, data: Any) -> ObservedCosts:
        """Reads :meth:`to_json`'s layout; anything else (a hand-edited or truncated file) reads as nothing observed."""
        observed = cls()
        if not isinstance(data, Mapping):
            return observed
        try:
            for role, by_fmt in data.items():
                for fmt, cells in by_fmt.items():
                    observed.cells.setdefault(str(role), {})[str(fmt)] = {
                        int(k): [float(v[0]), float(v[1])] for k, v in cells.items()
                    }
        except (TypeError, ValueError, IndexError, AttributeError):
            return cls()
        return observed


@dataclass(frozen=True)
class Ratio:
    """Observed over measured for one bucket of pass sizes (``upto``: its largest size, ``math.inf`` past the table)."""

    upto: float
    ratio: float
    passes: float


def _bucket(ks: list[int], positions: int) -> float:
    index = bisect.bisect_left(ks, positions)
    return float(ks[index]) if index < len(ks) else math.inf


def _sums(measured: PassCosts, cells: Cells) -> dict[float, list[float]]:
    """Per bucket: [observed seconds, measured seconds of the same passes, passes]."""
    ks = sorted(measured.seconds)
    sums: dict[float, list[float]] = {}
    for positions, (seconds, count) in cells.items():
        row = sums.setdefault(_bucket(ks, positions), [0.0, 0.0, 0.0])
        row[0] += seconds
        row[1] += count * measured.at(positions)
        row[2] += count
    return sums


def bucket_ratios(measured: PassCosts, cells: Cells) -> list[Ratio]:
    """Step 2 of the module docstring for one (role, format): every observed bucket's ratio, smallest sizes first."""
    return [
        Ratio(upto, obs / priced, n) for upto, (obs, priced, n) in sorted(_sums(measured, cells).items()) if priced > 0
    ]


def _overall(rows: list[list[float]]) -> float | None:
    observed, priced, passes = (sum(row[i] for row in rows) for i in range(3))
    return observed / priced if passes >= MIN_PASSES and priced > 0 else None


def corrected_table(measured: PassCostTable, observed: ObservedCosts) -> PassCostTable:
    """``measured`` with every cost scaled as step 3 of the module docstring says; the measured table is unchanged
    (the corrected one is for pricing, never saved as a measurement)."""
    per_format: dict[tuple[str, str], dict[float, list[float]]] = {}
    for role, by_fmt in measured.costs.items():
        for fmt, costs in by_fmt.items():
            cells = observed.cells.get(role, {}).get(fmt)
            if cells:
                per_format[role, fmt] = _sums(costs, cells)
    machine_ratio = _overall([row for sums in per_format.values() for row in sums.values()]) or 1.0
    corrected = PassCostTable(machine=dict(measured.machine), context=measured.context)
    for role, by_fmt in measured.costs.items():
        for fmt, costs in by_fmt.items():
            sums = per_format.get((role, fmt), {})
            format_ratio = _overall(list(sums.values())) or machine_ratio
            bounds = [*(float(k) for k in sorted(costs.seconds)), math.inf]
            scale = tuple(
                (bound, sums[bound][0] / sums[bound][1])
                if bound in sums and sums[bound][2] >= MIN_PASSES and sums[bound][1] > 0
                else (bound, format_ratio)
                for bound in bounds
            )
            corrected.costs.setdefault(role, {})[fmt] = PassCosts(dict(costs.seconds), scale)
    return corrected


def read_observed(path: Path) -> ObservedCosts:
    """The observations kept in a tuner cache file (nothing when it has none or cannot be read)."""
    try:
        return ObservedCosts.from_json(json.loads(path.read_text(encoding="utf-8")).get(OBSERVED_KEY))
    except (OSError, ValueError, AttributeError):
        return ObservedCosts()


def write_observed(path: Path, observed: ObservedCosts) -> None:
    """Puts ``observed`` into the cache file at ``path`` beside its table, replacing the file atomically."""
    data = json.loads(path.read_text(encoding="utf-8"))
    data[OBSERVED_KEY] = observed.to_json()
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    os.replace(temporary, path)


@dataclass
class CostRecorder:
    """Adds each finished generation's passes to the tuner cache file an engine's configuration came from.

    Called with the generation's ``Usage`` (``RelayEngine.on_usage``). Reads the file each time rather than keeping
    its own copy, so two engines (or processes) on one machine add to the same observations; a lost update between
    them costs one answer's passes."""

    path: Path
    formats: dict[str, str]

    def __call__(self, usage: Any) -> None:
        if not getattr(usage, "passes", None) or not getattr(usage, "pass_seconds", None):
            return  # a remote backend's generation: no local passes to learn from
        try:
            observed = read_observed(self.path)
            observed.add(self.formats, usage.passes, usage.pass_seconds)
            write_observed(self.path, observed)
        except (OSError, ValueError) as exc:
            logger.warning("could not record this machine's pass costs in %s (%s)", self.path, exc)
