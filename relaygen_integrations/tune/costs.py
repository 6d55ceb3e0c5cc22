"""What a forward pass costs on one machine: seconds per pass over k positions, per model and weight format.

A pass over ``k`` new positions (on top of a cached context) is the unit every mode is made of: a decode step is
``k = 1``, a speculative check of a ``d``-token draft ``k = d + 1``, a catch-up or a verified-relay sentence check
``k`` = the tokens it reads. Its cost is flat in ``k`` where the machine has compute to spare (native bf16 or AMX, a
GPU with captured passes) and grows with ``k`` where it has not (bf16 emulated on AVX2, eager passes on a GPU) -
which is why one configuration cannot be right on every machine.

Between measured ``k`` a cost is interpolated linearly; past the last one it grows with the last segment's slope
(passes grow about linearly there: ``pass-cost-avx2.json`` 16 -> 32 positions, 3.03 -> 6.08 s), and below the first
it is the first. A table is keyed ``role -> format -> {k: seconds}``; the format names are those of
``engine/local/weights.py`` plus ``+compile`` where one-token steps run compiled (GPU: ``bf16+compile``).
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROLES = ("large", "small")


def interpolate(seconds: Mapping[int, float], positions: int) -> float:
    """A pass's cost over ``positions`` from measured ``{k: cost}``: piecewise linear between measured ``k``, the
    last segment's slope past the table (never below the last measured cost), the first cost below it."""
    ks = sorted(seconds)
    if not ks:
        raise ValueError("no measured pass costs to interpolate")
    if positions <= ks[0] or len(ks) == 1:
        return seconds[ks[0]] if positions <= ks[0] else seconds[ks[0]] * positions / ks[0]
    if positions >= ks[-1]:
        a, b = ks[-2], ks[-1]
    else:
        index = bisect.bisect_left(ks, positions)
        a, b = ks[index - 1], ks[index]
    slope = (seconds[b] - seconds[a]) / (b - a)
    value = seconds[a] + slope * (positions - a)
    return max(value, seconds[ks[-1]]) if positions >= ks[-1] else value


@dataclass(frozen=True)
class PassCosts:
    """One model in one format on one machine: measured seconds per pass over ``k`` positions, and (a corrected
    table's, ``observed.py``) a scale per bucket of sizes: ``(largest size, factor)`` pairs, smallest first, the
    last one's size ``inf``. Only ``seconds`` is ever saved."""

    seconds: dict[int, float]
    scale: tuple[tuple[float, float], ...] = ()

    def at(self, positions: int) -> float:
        cost = interpolate(self.seconds, positions)
        return cost * next((factor for upto, factor in self.scale if positions <= upto), 1.0)

    @property
    def step(self) -> float:
        """One decode step (a one-position pass)."""
        return self.at(1)


@dataclass
class PassCostTable:
    """Every measured (role, format) of one machine, with the machine it was measured on (``machine.py``)."""

    costs: dict[str, dict[str, PassCosts]] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=dict)
    context: int = 300  # cached positions under each measured pass

    def get(self, role: str, fmt: str) -> PassCosts | None:
        return self.costs.get(role, {}).get(fmt)

    def has(self, role: str, fmt: str) -> bool:
        return self.get(role, fmt) is not None

    def put(self, role: str, fmt: str, seconds: Mapping[int, float]) -> None:
        self.costs.setdefault(role, {})[fmt] = PassCosts({int(k): float(v) for k, v in seconds.items()})

    def formats(self, role: str) -> list[str]:
        return sorted(self.costs.get(role, {}))

    def to_json(self) -> dict[str, Any]:
        """The layout ``benchmarks/pass_cost.py`` has always written (``seconds: role -> format -> {k: s}``)."""
        seconds = {
            role: {fmt: {str(k): v for k, v in sorted(c.seconds.items())} for fmt, c in by_format.items()}
            for role, by_format in self.costs.items()
        }
        return {"machine": self.machine, "context": self.context, "seconds": seconds}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PassCostTable:
        seconds = data.get("seconds")
        if not isinstance(seconds, Mapping):
            raise ValueError("a pass-cost table has 'seconds': role -> format -> {positions: seconds}")
        table = cls(machine=dict(data.get("machine") or {}), context=int(data.get("context", 300)))
        for role, by_format in seconds.items():
            for fmt, per_k in by_format.items():
                table.put(role, fmt, {int(k): float(v) for k, v in per_k.items()})
        return table

    @classmethod
    def load(cls, path: str | Path) -> PassCostTable:
        return cls.from_json(json.loads(Path(path).read_text(encoding="utf-8")))

    @classmethod
    def load_layered(cls, *paths: str | Path) -> PassCostTable:
        """One machine's table from several files, a later file's (role, format) replacing an earlier one's (a
        remeasure of one format on the same machine, like the row-scaled int8 of ``pass-cost-avx512bf16``)."""
        table = cls()
        for path in paths:
            part = cls.load(path)
            table.machine, table.context = part.machine, part.context
            for role, by_format in part.costs.items():
                for fmt, costs in by_format.items():
                    table.put(role, fmt, costs.seconds)
        return table

    def save(self, path: str | Path) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=2) + "\n", encoding="utf-8")
