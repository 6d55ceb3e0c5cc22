"""Self-speculative decoding for the large model's own segments: the small model drafts, the large model verifies.

The relay pair already shares a tokenizer and keeps two KV caches, so the small model can propose ``k`` tokens
(``k`` cheap decode steps) and the large model check them all in one forward pass over ``k + 1`` positions. Greedy:
the accepted prefix is exactly what the large model would have written token by token, plus its own next token
(the correction at the first mismatch, or a bonus token when every draft token matched). Sampling: the standard
speculative-sampling acceptance rule (accept draft token ``x`` with probability ``min(1, p(x) / q(x))``, else
resample from ``max(0, p - q)``), which leaves the large model's distribution unchanged.

Per round (:func:`speculative_step`)::

    draft, q = drafter.propose(ids, sampler, budget, eos_ids)   # k tokens (and, sampling, their distributions q)
    rows = large.check_draft(ids, draft)                        # ONE pass: k + 1 rows of the large model's logits
    committed, accepted = accept(draft, rows, q, sampler, ids)  # one host transfer, no per-token sync
    drafter.update(len(draft), accepted)                        # adapt the next draft's length

The drafter is an interface (:class:`Drafter`, after transformers' candidate generators: ``get_candidates`` /
``update_candidate_strategy``); :class:`SmallModelDrafter` is the relay pair's small model, and
``prompt_lookup.PromptLookupDrafter`` copies drafts from the context, the small model's where none fits. The
generation loop feeds accepted tokens to the switching policy one at a time, exactly as if they had been decoded one
by one; when a cue completes inside an accepted run the rest is discarded and both caches are cropped.

Under a grammar (``constraints/grammar.py``) every draft step is masked by the grammar state at its position and
advances it; the check's rows are masked by the same states (row ``i`` by the state after draft tokens ``[:i]``), so
the accepted tokens and the large model's own token all keep to the grammar. The state then holds every draft token:
the session's next ``follow`` rolls back those it did not keep.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from ..constraints.grammar import GrammarState
from ..core.settings import DEFAULT_MAX_DRAFT
from .runner import ModelRunner
from .sampling import Sampler

# A draft stops after a token the small model gave less than this probability: such a token is likely rejected, and
# every further draft token would cost a small-model step for nothing (the idea of Dynamic Speculation Lookahead,
# arXiv 2405.04304; transformers' assisted generation starts at 0.4). 0.8 is a guess from short exploratory runs on
# the demo pair that are not kept (no kept evidence for it over other values, nor for ``DEFAULT_MAX_DRAFT``); with it
# the large model accepted 89-90 % of the drafted tokens on 20 GSM8K problems in bf16 (benchmarks/data/spec-bf16/), a
# measurement of the default, not a comparison. The low-confidence token itself is kept: it costs nothing.
DEFAULT_DRAFT_CONFIDENCE = 0.8


@dataclass
class DraftLength:
    """Adaptive draft length (the schedule transformers' assisted generation uses): +2 after a fully accepted
    draft, -1 after a rejection, bounded to ``[1, maximum]``."""

    maximum: int = DEFAULT_MAX_DRAFT
    current: int = 3

    def __post_init__(self) -> None:
        self.current = max(1, min(self.current, self.maximum))

    def update(self, drafted: int, accepted: int) -> None:
        if accepted == drafted:
            self.current = min(self.current + 2, self.maximum)
        else:
            self.current = max(1, self.current - 1)


@dataclass
class SpeculationStats:
    rounds: int = 0  # verify passes of the large model
    drafted: int = 0
    accepted: int = 0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0


def draft(
    small: ModelRunner,
    ids: list[int],
    sampler: Sampler,
    length: int,
    eos_ids: frozenset[int],
    min_confidence: float = DEFAULT_DRAFT_CONFIDENCE,
    grammar: GrammarState | None = None,
) -> tuple[list[int], list[torch.Tensor]]:
    """Up to ``length`` tokens proposed by the small model after ``ids``; stops after an end-of-sequence token or a
    token the small model gave a probability below ``min_confidence``. Under ``grammar`` each step is masked and
    advances the state; a draft also stops where the grammar leaves the small model nothing it can score (a reduced
    draft vocabulary without the token the grammar needs).

    Returns the tokens and, when sampling, the draft distribution ``q`` each was drawn from (empty when greedy).
    """
    if length <= 0:
        return [], []
    logits = small.draft_logits(ids)  # catch-up on everything committed since the last draft
    tokens: list[int] = []
    draft_probs: list[torch.Tensor] = []
    context = [] if sampler.params.greedy else list(ids)  # only sampling's processors read the sequence
    for step in range(length):
        if step:
            logits = small.draft_step(tokens[-1])
        if grammar is not None:
            logits = grammar.masked(logits)
            if not torch.isfinite(logits).any():
                break
        if sampler.params.greedy:
            token = int(torch.argmax(logits))
            confidence = float(torch.softmax(logits, dim=-1)[token]) if min_confidence > 0 else 1.0
        else:
            q = sampler.probabilities(logits, context)
            token = int(torch.multinomial(q, num_samples=1, generator=sampler.generator))
            confidence = float(q[token])
            draft_probs.append(q)
            context.append(token)
        tokens.append(token)
        if grammar is not None and token not in eos_ids:
            grammar.advance(token)
        if token in eos_ids or confidence < min_confidence:
            break
    return tokens, draft_probs


def accept(
    draft_tokens: list[int],
    target_logits: torch.Tensor,
    draft_probs: list[torch.Tensor],
    sampler: Sampler,
    ids: list[int],
) -> tuple[list[int], int]:
    """The tokens to commit — accepted draft prefix plus the large model's own next token — and how many draft tokens
    were accepted. ``target_logits`` has one row per draft token plus one (the large model's logits after ``ids``
    and after each draft prefix).

    Vectorized as gpt-fast accepts a draft: every row is decided in one tensor step and read back to the host once
    (a per-token ``float()`` would be a device sync per token on a GPU). Sampling draws all ``k`` uniforms at once,
    then one token from the residual (or bonus) row: the same acceptance rule, another order of RNG draws than a
    token-by-token loop, so a seeded sampled run draws other tokens than before this change (greedy is unchanged)."""
    k = len(draft_tokens)
    if sampler.params.greedy:
        choices = torch.argmax(target_logits, dim=-1).tolist()  # the one host transfer
        accepted = next(
            (i for i, (token, choice) in enumerate(zip(draft_tokens, choices, strict=False)) if token != choice), k
        )
        return [*draft_tokens[:accepted], int(choices[accepted])], accepted
    p = sampler.row_probabilities(target_logits, ids)  # k + 1 rows on the CPU: the one transfer
    accepted = 0
    if k:
        q = torch.stack(draft_probs)
        rows, tokens = torch.arange(k), torch.tensor(draft_tokens)
        p_token, q_token = p[rows, tokens], q[rows, tokens]
        u = torch.rand(k, generator=sampler.generator)
        kept = (q_token > 0) & (u * q_token <= p_token)  # accept x with probability min(1, p(x) / q(x))
        accepted = int(kept.long().cumprod(0).sum())  # the accepted prefix ends at the first refusal
    if accepted < k:
        residual = torch.clamp(p[accepted] - q[accepted], min=0.0)
        total = float(residual.sum())
        # p == q up to rounding: any token drawn from p is then a correct sample.
        distribution = residual / total if total > 1e-12 else p[accepted]
    else:
        distribution = p[k]  # every draft token accepted: the bonus token comes from the last row
    token = int(torch.multinomial(distribution, num_samples=1, generator=sampler.generator))
    return [*draft_tokens[:accepted], token], accepted


class Drafter(Protocol):
    """What proposes tokens for the large model to check in one pass (transformers' candidate generator:
    ``get_candidates`` / ``update_candidate_strategy``)."""

    def propose(
        self,
        ids: list[int],
        sampler: Sampler,
        budget: int,
        eos_ids: frozenset[int],
        grammar: GrammarState | None = None,
    ) -> tuple[list[int], list[torch.Tensor]]:
        """At most ``budget`` tokens to follow ``ids`` and, when sampling, the distribution each was drawn from
        (the acceptance rule needs ``q``); greedy drafters return no distributions. Under ``grammar``: only tokens
        it allows, each advancing its state."""
        ...

    def update(self, drafted: int, accepted: int) -> None:
        """How many of the last proposal's tokens the large model kept (adapts the next proposal)."""
        ...

    @property
    def verify_kind(self) -> str:
        """The pass kind of the large model's check of the last proposal (``runner.PASS_KINDS``)."""
        ...


@dataclass
class SmallModelDrafter:
    """The relay pair's small model as the drafter: ``length.current`` decode steps of its own cache (through its
    reduced draft vocabulary when it has one), stopping early after an unsure token (``min_confidence``)."""

    runner: ModelRunner
    length: DraftLength = field(default_factory=DraftLength)
    min_confidence: float = DEFAULT_DRAFT_CONFIDENCE

    def propose(
        self,
        ids: list[int],
        sampler: Sampler,
        budget: int,
        eos_ids: frozenset[int],
        grammar: GrammarState | None = None,
    ) -> tuple[list[int], list[torch.Tensor]]:
        length = min(self.length.current, budget)
        return draft(self.runner, ids, sampler, length, eos_ids, self.min_confidence, grammar)

    def update(self, drafted: int, accepted: int) -> None:
        self.length.update(drafted, accepted)

    @property
    def verify_kind(self) -> str:
        return "verify_drafts"


def speculative_step(
    large: ModelRunner,
    drafter: Drafter,
    ids: list[int],
    sampler: Sampler,
    budget: int,
    eos_ids: frozenset[int],
    stats: SpeculationStats,
    grammar: GrammarState | None = None,
) -> tuple[list[int], torch.Tensor]:
    """One draft-and-check round for the large model: 1 to ``draft + 1`` tokens (at most ``budget``), each one the
    large model's own choice, and the large model's logits rows (row ``i`` is the distribution token ``i`` was
    chosen from, before any grammar mask; extra rows follow). Caches - and ``grammar``'s state - may hold tokens
    past what the caller keeps; it crops them (``ModelRunner.sync_to``, ``GrammarState.follow``) once it has decided
    how many tokens it keeps."""
    draft_tokens, draft_probs = drafter.propose(ids, sampler, budget - 1, eos_ids, grammar)
    target_logits = large.check_draft(ids, draft_tokens, drafter.verify_kind)
    checked = target_logits
    if grammar is not None:  # row i under the state after draft_tokens[:i] (each computed while drafting)
        checked = grammar.masked_rows(target_logits, len(ids) - grammar.prompt_len)
    committed, accepted = accept(draft_tokens, checked, draft_probs, sampler, ids)
    stats.rounds += 1
    stats.drafted += len(draft_tokens)
    stats.accepted += accepted
    drafter.update(len(draft_tokens), accepted)
    return committed, target_logits
