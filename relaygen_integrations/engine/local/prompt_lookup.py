"""Prompt-lookup drafts: tokens copied from the context, proposed at no model cost, the small model where none fits.

Answers copy from their context: a GSM8K solution restates the question's numbers and phrases, a tool call the user's
words, a RAG answer the retrieved text. When the last few tokens written also occur earlier in the prompt or the text
so far, the tokens that followed them there are a draft that costs no forward pass (prompt lookup: transformers'
``prompt_lookup_num_tokens``, vLLM's n-gram proposer). Per speculative round::

    for n in MAX_NGRAM .. MIN_NGRAM:                        # the longest suffix n-gram first
        start = the latest earlier occurrence of ids[-n:]   # never the suffix itself
        if found: draft = ids[start + n : start + n + length]; stop
    no match:  draft = the small model's draft (``SmallModelDrafter``), and when it filled its whole length (every
               token sure), it is extended by a lookup on ids + draft (as long as the copy schedule allows)

The large model checks the draft in one pass as it checks the small model's (``speculative.speculative_step``), so
greedy output is the large model's own whatever the draft. Sampling: a copied token is a point mass ``q = one-hot(x)``;
the acceptance rule then keeps ``x`` with probability ``p(x)`` and otherwise samples from ``max(0, p - q)``, which is
``p`` without ``x`` - the large model's distribution unchanged. Under a grammar each copied token must be allowed at
its position (the draft ends before the first that is not) and advances the state like a drafted token.

A copied draft's length - first or as an extension - adapts as the small model's does (``DraftLength``: +2 after a
fully accepted copy, -1 after a rejection), its own schedule: a copy is free to propose but each position costs the
verify pass (flat on AMX or AVX512-BF16 CPUs, growing with positions on AVX2: ``benchmarks/data/pass-cost-*``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ..constraints.grammar import GrammarState
from ..core.settings import DEFAULT_MAX_DRAFT
from .sampling import Sampler
from .speculative import DraftLength, SmallModelDrafter

# A 1-token match ("the", ",") is followed by its earlier continuation little more often than by chance, and a copied
# draft replaces the small model's (accepted ~90 % in bf16: benchmarks/data/spec-bf16): matches of 2 to 4 tokens
# only, as transformers' prompt lookup (max_matching_ngram_size=2) and vLLM's n-gram proposer (up to 4) look.
MIN_NGRAM = 2
MAX_NGRAM = 4
# Only the last SEARCH_WINDOW tokens are searched: a GSM8K prompt and answer fit (~600 tokens), and a search stays
# under a millisecond on a long agent transcript.
SEARCH_WINDOW = 4096


def lookup(ids: Sequence[int], length: int, min_ngram: int = MIN_NGRAM, max_ngram: int = MAX_NGRAM) -> list[int]:
    """Up to ``length`` tokens that followed the latest earlier occurrence of the longest suffix n-gram of ``ids``
    (``max_ngram`` down to ``min_ngram`` tokens); empty when no suffix of those sizes occurs earlier."""
    if length <= 0 or len(ids) <= min_ngram:
        return []
    window = torch.as_tensor(list(ids[-SEARCH_WINDOW:]), dtype=torch.long)
    total = window.numel()
    for n in range(min(max_ngram, total - 1), min_ngram - 1, -1):
        suffix = window[total - n :]
        # Windows starting at 0 .. total - n - 1: each ends before the suffix's last token, so a token follows it.
        candidates = window[: total - 1].unfold(0, n, 1)
        hits = torch.nonzero((candidates == suffix).all(dim=1)).flatten()
        if hits.numel():
            start = int(hits[-1]) + n
            return window[start : start + length].tolist()
    return []


@dataclass
class LookupCounts:
    """What the context drafted in one request: rounds whose draft it began, tokens copied, tokens kept, and the
    seconds spent searching (the only cost a copied draft has before its check)."""

    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    search_seconds: float = 0.0


@dataclass
class PromptLookupDrafter:
    """Drafts copied from the context, the small model's where none matches (module docstring). ``fallback``
    None: no draft where nothing matches (the round is a plain decode step: n-gram speculation of the large model
    alone). ``width``: the large model's logits width (a copied token's point mass when sampling)."""

    fallback: SmallModelDrafter | None
    width: int
    length: DraftLength = field(default_factory=lambda: DraftLength(DEFAULT_MAX_DRAFT))
    min_ngram: int = MIN_NGRAM
    max_ngram: int = MAX_NGRAM
    counts: LookupCounts = field(default_factory=LookupCounts)
    _small: int = 0  # of the last proposal: its leading tokens the small model drafted
    _copied: int = 0  # and the copied ones after them

    @property
    def verify_kind(self) -> str:
        """The large model's check of a wholly copied draft is its own pass kind in ``time_split``; a round without
        a draft is a decode step."""
        if not self._copied and not self._small:
            return "decode"
        return "verify_lookup" if not self._small else "verify_drafts"

    def propose(
        self,
        ids: list[int],
        sampler: Sampler,
        budget: int,
        eos_ids: frozenset[int],
        grammar: GrammarState | None = None,
    ) -> tuple[list[int], list[torch.Tensor]]:
        self._small = self._copied = 0
        copied = self._copy(ids, min(self.length.current, budget), eos_ids, grammar)
        if copied:
            self._copied = len(copied)
            self.counts.rounds += 1
            return copied, self._point_masses(copied, sampler)
        if self.fallback is None:
            return [], []
        tokens, probs = self.fallback.propose(ids, sampler, budget, eos_ids, grammar)
        self._small = len(tokens)
        room = budget - len(tokens)
        filled = len(tokens) == min(self.fallback.length.current, budget)
        if tokens and room > 0 and filled and tokens[-1] not in eos_ids:
            # A copy is as long as the copy schedule allows, never the whole budget: the check's positions cost.
            extension = self._copy(ids + tokens, min(room, self.length.current), eos_ids, grammar)
            self._copied = len(extension)
            tokens, probs = tokens + extension, probs + self._point_masses(extension, sampler)
        return tokens, probs

    def update(self, drafted: int, accepted: int) -> None:
        if self._small and self.fallback is not None:
            self.fallback.update(self._small, min(accepted, self._small))
        if self._copied:
            kept = max(0, accepted - self._small)
            self.counts.drafted += self._copied
            self.counts.accepted += kept
            self.length.update(self._copied, kept)

    def _copy(self, ids: list[int], length: int, eos_ids: frozenset[int], grammar: GrammarState | None) -> list[int]:
        started = time.perf_counter()
        tokens = lookup(ids, length, self.min_ngram, self.max_ngram)
        self.counts.search_seconds += time.perf_counter() - started
        kept: list[int] = []
        for token in tokens:
            if grammar is not None and not bool(grammar.allowed()[token]):
                break
            kept.append(token)
            if token in eos_ids:
                break  # nothing follows an end of sequence (the grammar never consumes one)
            if grammar is not None:
                grammar.advance(token)
        return kept

    def _point_masses(self, tokens: list[int], sampler: Sampler) -> list[torch.Tensor]:
        if sampler.params.greedy:
            return []
        masses = torch.zeros(len(tokens), self.width)
        masses[torch.arange(len(tokens)), torch.tensor(tokens)] = 1.0
        return list(masses)
