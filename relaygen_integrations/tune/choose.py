"""The choice: every candidate priced on this machine, the fastest whose accuracy is backed wins.

1. ``candidates.expand`` turns the pair's profiled modes into the variants this machine's cost table can price.
2. Each gets its predicted seconds per token and per answer (``cost_model``) and its speed-up over the reference,
   ``large`` at the large model's bf16 (the large model alone, as a user without this package runs it).
3. The winner is the fastest backed candidate (``candidates``: lossless by construction, or evidence within
   ``MAX_LOST_PROBLEMS`` of ``large`` on at least ``MIN_EVIDENCE_PROBLEMS`` problems). An unbacked candidate is
   listed with its speed and why it lost, never chosen.

Candidates within ``TIE_MARGIN`` of the winner's predicted time are ties: the one with fewer moving parts wins (no
speculation over speculation, no relay over relay), since a prediction is only as good as the work it was priced
with (the cost model matched 60-problem runs to 0-10 %, ``docs/tuning.md``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .candidates import Candidate, ProfiledMode, expand
from .cost_model import missing_costs, seconds_by_role, seconds_per_token
from .costs import PassCostTable

TIE_MARGIN = 0.02
REFERENCE = "large#bf16"


@dataclass(frozen=True)
class Priced:
    candidate: Candidate
    seconds_per_token: float
    seconds_per_answer: float
    by_role: dict[str, float]
    speedup: float  # against the reference's predicted seconds per answer (1.0 where there is no reference)


@dataclass(frozen=True)
class Choice:
    winner: Priced
    ranked: list[Priced]  # every priced candidate, fastest first
    unpriced: list[tuple[Candidate, list[str]]]  # candidates the table could not price, with the costs they lacked
    reason: str

    def by_name(self, name: str) -> Priced | None:
        return next((p for p in self.ranked if p.candidate.name == name), None)


def _simplicity(candidate: Candidate) -> int:
    """Fewer moving parts first: one model alone, then drafting, then relay."""
    return 0 if candidate.base == "large" else 1 if candidate.base == "large-spec" else 2


def choose(modes: Mapping[str, ProfiledMode], table: PassCostTable) -> Choice:
    """Prices every candidate on ``table`` and picks the winner (module docstring). Raises ``ValueError`` when no
    backed candidate can be priced (the table lacks every format the profile's modes need)."""
    priced: list[Priced] = []
    unpriced: list[tuple[Candidate, list[str]]] = []
    candidates = expand(modes, table)
    raw: dict[str, float] = {}
    for candidate in candidates:
        per_token = seconds_per_token(candidate.work, table, candidate.formats)
        if per_token is None:
            unpriced.append((candidate, missing_costs(candidate.work, table, candidate.formats)))
            continue
        raw[candidate.name] = per_token * candidate.work.tokens_per_answer
    reference = raw.get(REFERENCE)
    for candidate in candidates:
        if candidate.name not in raw:
            continue
        per_answer = raw[candidate.name]
        per_token = per_answer / candidate.work.tokens_per_answer
        speedup = reference / per_answer if reference else 1.0
        by_role = seconds_by_role(candidate.work, table, candidate.formats)
        priced.append(Priced(candidate, per_token, per_answer, by_role, speedup))
    priced.sort(key=lambda p: p.seconds_per_answer)
    backed = [p for p in priced if p.candidate.backed]
    if not backed:
        raise ValueError(
            "no accuracy-backed configuration can be priced on this machine: the cost table has "
            f"{ {role: table.formats(role) for role in table.costs} }; measure the formats the profile's modes use"
        )
    fastest = backed[0]
    ties = [p for p in backed if p.seconds_per_answer <= fastest.seconds_per_answer * (1 + TIE_MARGIN)]
    winner = min(ties, key=lambda p: (_simplicity(p.candidate), p.seconds_per_answer))
    faster_unbacked = [p.candidate.name for p in priced if not p.candidate.backed and p.seconds_per_answer <
                       winner.seconds_per_answer]  # fmt: skip
    reason = f"fastest accuracy-backed candidate ({winner.speedup:.2f}x the large model alone in bf16, predicted)"
    if winner is not fastest:
        reason += f"; within {TIE_MARGIN:.0%} of {fastest.candidate.name} and simpler"
    if faster_unbacked:
        reason += f"; faster but not backed: {', '.join(faster_unbacked)}"
    return Choice(winner, priced, unpriced, reason)
