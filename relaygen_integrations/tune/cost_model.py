"""Predicted seconds per token of a mode on a machine: its work (``work.py``) priced at the machine's pass costs.

For a mode whose models run in ``formats`` (role -> format), with ``w[role][k]`` passes over ``k`` positions per
generated token and ``cost[role, format](k)`` seconds per such pass on this machine (``costs.py``)::

    seconds_per_token = sum over role, k of  w[role][k] * cost[role, formats[role]](k)  +  overhead_per_token
    seconds_per_answer = seconds_per_token * tokens_per_answer

The prompt's prefill is one of those passes (per answer, so ``1 / tokens_per_answer`` per token). ``overhead`` is
what runs outside forward passes - sampling, the policy, detokenizing, Python: 0.6-0.8 ms per token in the
60-problem run on the AVX512-BF16 EPYC (``relay-vs-spec-60``: each run's seconds minus its forward seconds, over its
tokens, for ``large`` and ``large-spec#bf16/int8``), so 1 ms is charged on every machine.

Where the pass table lacks a (role, format) the mode needs, there is no prediction (None): the tuner then leaves
that candidate out and says why, rather than guess another machine's costs.

Known blind spot: a speculative draft step over a reduced draft vocabulary (``draft_vocab``) skips most of the
output layer, which the tables (full-vocabulary passes) do not; drafts are priced as full steps, so a mode that
drafts is predicted up to ~5 % slow (the small model's output layer is ~17 % of its step, drafts ~40 % of a round).
"""

from __future__ import annotations

from collections.abc import Mapping

from .costs import PassCostTable
from .work import ModeWork

OVERHEAD_SECONDS_PER_TOKEN = 0.001


def seconds_per_token(
    work: ModeWork,
    table: PassCostTable,
    formats: Mapping[str, str],
    overhead: float = OVERHEAD_SECONDS_PER_TOKEN,
) -> float | None:
    """The predicted seconds per generated token (module docstring); None when a needed cost is unmeasured."""
    total = overhead
    for role, by_k in work.passes_per_token.items():
        if not by_k:
            continue
        fmt = formats.get(role)
        costs = table.get(role, fmt) if fmt is not None else None
        if costs is None:
            return None
        total += sum(rate * costs.at(k) for k, rate in by_k.items())
    return total


def seconds_by_role(work: ModeWork, table: PassCostTable, formats: Mapping[str, str]) -> dict[str, float]:
    """Where the predicted time per token goes, per model (for ``--explain``); roles with unmeasured costs left out."""
    split: dict[str, float] = {}
    for role, by_k in work.passes_per_token.items():
        costs = table.get(role, formats.get(role, ""))
        if costs is not None and by_k:
            split[role] = sum(rate * costs.at(k) for k, rate in by_k.items())
    return split


def missing_costs(work: ModeWork, table: PassCostTable, formats: Mapping[str, str]) -> list[str]:
    """The ``role:format`` pairs a mode needs that ``table`` has not measured."""
    return [
        f"{role}:{formats.get(role, '?')}"
        for role, by_k in work.passes_per_token.items()
        if by_k and table.get(role, formats.get(role, "")) is None
    ]
