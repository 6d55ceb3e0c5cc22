"""Prompt lookup: drafts copied from the context, checked by the large model like the small model's.

The n-gram search on hand-made sequences; greedy output identical to the large model's own on a tiny random-weight
fp32 pair (whose repetitive text gives the search matches), alone and with the small model filling in; the copied
draft's point mass under the sampling acceptance rule (the target distribution kept); a grammar cutting a copy; the
counts and pass kinds in Usage. (The remote backend's refusal: tests/test_remote.py.)
"""

from __future__ import annotations

import pytest
import torch
from helpers import PROMPT, scripted_engine

from relaygen_integrations import RelayEngine
from relaygen_integrations.engine.local.prompt_lookup import PromptLookupDrafter, lookup
from relaygen_integrations.engine.local.sampling import Sampler, SamplingParams
from relaygen_integrations.engine.local.speculative import DraftLength, accept

MESSAGES = [{"role": "user", "content": "Repeat after me: the red fox jumps over the red fox jumps over the dog."}]
GREEDY = Sampler(SamplingParams())
REPEATING = "the red fox jumps over the dog. the red fox jumps over the cat. the red fox jumps over the hen."


def test_lookup_copies_what_followed_the_latest_earlier_match():
    #       0  1  2  3  4  5  6  7  8  9
    ids = [5, 6, 7, 1, 5, 6, 8, 2, 5, 6]
    assert lookup(ids, 3) == [8, 2, 5]  # suffix (5, 6): latest earlier occurrence at 4, followed by 8 2 5
    assert lookup(ids, 1) == [8]
    assert lookup(ids, 0) == []


def test_lookup_prefers_the_longest_suffix_ngram():
    # (6, 7) last occurred at 5 (followed by 3), but (5, 6, 7) only at 0 (followed by 9): the longer match wins.
    ids = [5, 6, 7, 9, 1, 6, 7, 3, 4, 5, 6, 7]
    assert lookup(ids, 2) == [9, 1]
    assert lookup(ids, 2, max_ngram=2) == [3, 4]


def test_lookup_needs_an_earlier_match_of_min_ngram_tokens():
    assert lookup([1, 2, 3, 4, 3], 4) == []  # only a one-token match (3): below MIN_NGRAM
    assert lookup([1, 2, 3, 4, 3], 4, min_ngram=1) == [4, 3]
    assert lookup([7, 7], 3) == []  # the suffix itself is no match
    assert lookup([7, 7, 7], 3) == [7]  # (7, 7) at 0 is followed by one 7


def relay_engine(tokenizer, large, small, **kwargs) -> RelayEngine:
    kwargs.setdefault("draft_confidence", 0.0)  # random weights: every draft would stop after one token otherwise
    return RelayEngine.from_models(large, small, tokenizer, cues=["the"], **kwargs)


@pytest.mark.parametrize("speculative", [0, 4])
def test_greedy_output_is_the_large_models_own(tokenizer, pair, speculative):
    engine = relay_engine(tokenizer, *pair)
    # Random weights rarely repeat themselves: a prompt that holds the model's own continuation of its end gives
    # the search a match at every step (whether the large model keeps a copy is its own affair).
    start = engine.encode_messages(MESSAGES)
    prompt_ids = start + engine.generate_ids(start, max_new_tokens=16, mode="large").completion_ids + start
    plain = engine.generate_ids(prompt_ids, max_new_tokens=40, mode="large")
    copied = engine.generate_ids(prompt_ids, max_new_tokens=40, mode="large", speculative=speculative,
                                 prompt_lookup=True)  # fmt: skip
    assert copied.completion_ids == plain.completion_ids
    usage = copied.usage
    assert 0 < usage.lookup_draft_tokens <= usage.draft_tokens
    assert 0 <= usage.lookup_accepted_tokens <= min(usage.lookup_draft_tokens, usage.accepted_draft_tokens)
    assert "lookup.search" in usage.time_split
    if not speculative:  # copies alone: the small model never runs
        assert "small" not in usage.passes and usage.draft_tokens == usage.lookup_draft_tokens


def test_copies_of_repeated_phrases_are_accepted_and_the_small_models_fill_in(tokenizer):
    text = REPEATING
    engine, _, _ = scripted_engine(tokenizer, text, cues=[])  # the small model writes upper case: rejected
    plain = engine.generate(PROMPT, max_new_tokens=200, mode="large")
    alone = engine.generate(PROMPT, max_new_tokens=200, mode="large", prompt_lookup=True)
    both = engine.generate(PROMPT, max_new_tokens=200, mode="large", prompt_lookup=True, speculative=4)
    assert alone.text == both.text == plain.text == text
    for result in (alone, both):
        usage = result.usage
        assert usage.lookup_accepted_tokens >= 6  # " red fox jumps over the" copied, at least in part
        # A round commits its accepted tokens and one of the large model's (the last round's: the end of sequence;
        # one more pass where a round's own token is followed by a catch-up of the prompt's tail).
        assert sum(usage.passes["large"].values()) <= usage.completion_tokens + 2 - usage.accepted_draft_tokens
        assert usage.time_split["large.verify_lookup"] > 0
    # With the small model too: its drafts (upper case) are refused, the copies kept.
    usage = both.usage
    assert usage.draft_tokens > usage.lookup_draft_tokens
    assert usage.accepted_draft_tokens - usage.lookup_accepted_tokens < usage.lookup_accepted_tokens


def test_copied_drafts_reach_the_metadata(tokenizer):
    engine, _, _ = scripted_engine(tokenizer, REPEATING, cues=[])
    result = engine.generate(PROMPT, max_new_tokens=200, mode="large", speculative=3, prompt_lookup=True)
    speculation = result.relay_metadata()["speculation"]
    assert speculation["copied"] == result.usage.lookup_draft_tokens > 0
    assert speculation["copied_accepted"] == result.usage.lookup_accepted_tokens > 0


def test_sampled_output_is_seeded_and_a_copy_is_a_point_mass(tokenizer, pair):
    engine = relay_engine(tokenizer, *pair)
    settings = {"max_new_tokens": 40, "temperature": 0.7, "seed": 3, "mode": "large", "prompt_lookup": True}
    first, second = engine.generate(MESSAGES, **settings), engine.generate(MESSAGES, **settings)
    assert first.completion_ids == second.completion_ids


def test_a_copied_token_keeps_the_target_distribution():
    """A copy proposes token 1 with q = one-hot(1): the rule accepts it with probability p(1) and otherwise
    samples p without it, so the committed token is distributed as p. 20,000 draws."""
    p = torch.tensor([0.5, 0.2, 0.2, 0.1])
    drafter = PromptLookupDrafter(None, width=4)
    sampler = Sampler(SamplingParams(temperature=1.0, seed=0))
    (mass,) = drafter._point_masses([1], sampler)
    assert mass.tolist() == [0.0, 1.0, 0.0, 0.0]
    logits = torch.log(p).repeat(2, 1)
    counts = torch.zeros(4)
    accepted_count = 0
    for _ in range(20_000):
        committed, accepted = accept([1], logits, [mass], sampler, [0])
        counts[committed[0]] += 1
        accepted_count += accepted
    assert 0.5 * float((counts / counts.sum() - p).abs().sum()) < 0.015
    assert abs(accepted_count / 20_000 - 0.2) < 0.015


class OnlyTokens:
    """A grammar state that allows only ``allowed`` tokens (what ``GrammarState`` offers a drafter)."""

    def __init__(self, allowed: set[int], width: int = 16) -> None:
        self.allowed_ids, self.width, self.consumed = allowed, width, []

    def allowed(self) -> torch.Tensor:
        mask = torch.zeros(self.width, dtype=torch.bool)
        mask[list(self.allowed_ids)] = True
        return mask

    def advance(self, token: int) -> None:
        self.consumed.append(token)


def test_a_grammar_cuts_a_copy_before_its_first_forbidden_token():
    drafter = PromptLookupDrafter(None, width=16, length=DraftLength(6, current=6))
    ids = [1, 2, 3, 4, 9, 5, 1, 2]  # (1, 2) was followed by 3 4 9 5 1 2
    grammar = OnlyTokens({3, 4, 5})
    tokens, probs = drafter.propose(ids, GREEDY, 6, frozenset({15}), grammar)  # type: ignore[arg-type]
    assert tokens == [3, 4] and grammar.consumed == [3, 4] and probs == []
    assert drafter.verify_kind == "verify_lookup"
    drafter.update(2, 1)
    assert (drafter.counts.drafted, drafter.counts.accepted, drafter.counts.rounds) == (2, 1, 1)


def test_a_copy_ends_at_an_end_of_sequence_token():
    drafter = PromptLookupDrafter(None, width=16, length=DraftLength(6, current=6))
    tokens, _ = drafter.propose([1, 2, 7, 8, 1, 2], GREEDY, 6, frozenset({7}))
    assert tokens == [7]


def test_no_match_and_no_small_model_is_a_plain_step():
    drafter = PromptLookupDrafter(None, width=16)
    assert drafter.propose([1, 2, 3, 4], GREEDY, 6, frozenset()) == ([], [])
    assert drafter.verify_kind == "decode"


def test_the_engine_default_applies_unless_a_request_says(tokenizer, pair):
    engine = relay_engine(tokenizer, *pair, prompt_lookup=True)
    assert engine.plan([1, 2]).prompt_lookup and not engine.plan([1, 2], prompt_lookup=False).prompt_lookup
    assert not relay_engine(tokenizer, *pair).plan([1, 2]).prompt_lookup


def test_an_extension_is_as_long_as_the_copy_schedule_allows():
    class Sure:  # a small-model drafter whose drafts always fill their length
        length = DraftLength(2, current=2)

        def propose(self, ids, sampler, budget, eos_ids, grammar=None):
            return [1, 2][: min(2, budget)], []

        def update(self, drafted, accepted):
            self.kept = accepted

    drafter = PromptLookupDrafter(Sure(), width=16, length=DraftLength(6, current=3))  # type: ignore[arg-type]
    ids = [9, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 5]  # no copy for (0, 5); after the draft, (1, 2) was followed by 3 4 5...
    tokens, _ = drafter.propose(ids, GREEDY, 500, frozenset())
    assert tokens == [1, 2, 3, 4, 5] and drafter.verify_kind == "verify_drafts"
    drafter.update(5, 5)
    assert drafter.length.current == 5 and drafter.counts.accepted == 3 and drafter.fallback.kept == 2
