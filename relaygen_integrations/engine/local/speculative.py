"""Self-speculative decoding for the large model's own segments: the small model drafts, the large model verifies.

The relay pair already shares a tokenizer and keeps two KV caches, so the small model can propose ``k`` tokens
(``k`` cheap decode steps) and the large model check them all in one forward pass over ``k + 1`` positions. Greedy:
the accepted prefix is exactly what the large model would have written token by token, plus its own next token
(the correction at the first mismatch, or a bonus token when every draft token matched). Sampling: the standard
speculative-sampling acceptance rule (accept draft token ``x`` with probability ``min(1, p(x) / q(x))``, else
resample from ``max(0, p - q)``), which leaves the large model's distribution unchanged.

The generation loop feeds accepted tokens to the switching policy one at a time, exactly as if they had been
decoded one by one; when a cue completes inside an accepted run the rest is discarded and both caches are cropped.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..core.settings import DEFAULT_MAX_DRAFT
from .runner import ModelRunner
from .sampling import Sampler

# A draft stops after a token the small model gave less than this probability: such a token is likely rejected, and
# every further draft token would cost a small-model step for nothing (the idea of Dynamic Speculation Lookahead,
# arXiv 2405.04304; transformers' assisted generation starts at 0.4). On the demo pair (GSM8K, 800 large-model tokens
# teacher-forced through the small model) its greedy token matched the large model's 97-100 % of the time at
# probability >= 0.8 and ~62 % below it, hence 0.8. The low-confidence token itself is kept: it costs nothing.
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
) -> tuple[list[int], list[torch.Tensor]]:
    """Up to ``length`` tokens proposed by the small model after ``ids``; stops after an end-of-sequence token or a
    token the small model gave a probability below ``min_confidence``.

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
    and after each draft prefix)."""
    committed: list[int] = []
    if sampler.params.greedy:
        choices = torch.argmax(target_logits, dim=-1).tolist()
        for token, choice in zip(draft_tokens, choices, strict=False):
            if token != choice:
                return [*committed, int(choice)], len(committed)
            committed.append(token)
        return [*committed, int(choices[len(draft_tokens)])], len(committed)
    for index, token in enumerate(draft_tokens):
        p = sampler.probabilities(target_logits[index], ids + committed)
        q = draft_probs[index]
        u = float(torch.rand((), generator=sampler.generator))
        if q[token] > 0 and u * float(q[token]) <= float(p[token]):
            committed.append(token)
            continue
        residual = torch.clamp(p - q, min=0.0)
        total = float(residual.sum())
        # p == q up to rounding: any token drawn from p is then a correct sample.
        distribution = residual / total if total > 1e-12 else p
        resampled = int(torch.multinomial(distribution, num_samples=1, generator=sampler.generator))
        return [*committed, resampled], len(committed)
    bonus_probs = sampler.probabilities(target_logits[len(draft_tokens)], ids + committed)
    bonus = int(torch.multinomial(bonus_probs, num_samples=1, generator=sampler.generator))
    return [*committed, bonus], len(committed)


def speculative_step(
    large: ModelRunner,
    small: ModelRunner,
    ids: list[int],
    sampler: Sampler,
    length: DraftLength,
    budget: int,
    eos_ids: frozenset[int],
    stats: SpeculationStats,
    min_confidence: float = DEFAULT_DRAFT_CONFIDENCE,
) -> list[int]:
    """One draft-and-verify round for the large model: 1 to ``length.current + 1`` tokens (at most ``budget``), each
    one the large model's own choice. Caches may hold tokens past what the caller keeps; it crops them
    (``ModelRunner.sync_to``) once it has decided how many tokens it keeps."""
    draft_tokens, draft_probs = draft(small, ids, sampler, min(length.current, budget - 1), eos_ids, min_confidence)
    target_logits = large.verify(ids, draft_tokens)
    committed, accepted = accept(draft_tokens, target_logits, draft_probs, sampler, ids)
    stats.rounds += 1
    stats.drafted += len(draft_tokens)
    stats.accepted += accepted
    length.update(len(draft_tokens), accepted)
    return committed


def shipped_speculative(pair_name: str | None) -> bool | int:
    """Whether a known pair speculates by default: its shipped profile's ``"speculative"`` entry (``{"draft": true
    or a maximum draft length, "benchmark": ..., "why": ...}``, chosen from a benchmark run), else False."""
    from ..core.cues import profile_entry

    entry = profile_entry(pair_name, "speculative")
    value = entry.get("draft", False) if isinstance(entry, dict) else entry
    return value if isinstance(value, (bool, int)) else False
