"""Self-speculative relay: the small model drafts for the large model's segments; the output stays the large model's.

Exactness on scripted models (readable switch points) and on a tiny random-weight fp32 pair; the sampling
acceptance rule checked statistically against the target distribution.
"""

from __future__ import annotations

import pytest
import torch
from helpers import PROMPT, scripted_engine, tiny_qwen2

from relaygen_integrations import RelayEngine
from relaygen_integrations.engine import GenerationError
from relaygen_integrations.engine.local.sampling import Sampler, SamplingParams
from relaygen_integrations.engine.local.speculative import DraftLength, accept

LARGE = "we add two and three. so the total is five. then we check it. so it is five."
MESSAGES = [{"role": "user", "content": "Count the apples: two and three. So how many?"}]


def test_agreeing_drafts_are_all_accepted_and_the_text_is_the_large_models(tokenizer):
    engine, large, _ = scripted_engine(tokenizer, LARGE, small_text=LARGE, cues=[])
    plain = engine.generate(PROMPT, max_new_tokens=200, mode="large")
    large.fed.clear()
    spec = engine.generate(PROMPT, max_new_tokens=200, mode="large", speculative=4)
    assert spec.text == plain.text == LARGE and spec.completion_ids == plain.completion_ids
    usage = spec.usage
    assert usage.accepted_draft_tokens == usage.draft_tokens > 0 and usage.acceptance_rate == 1.0
    # Every round commits its accepted drafts plus one large-model token: far fewer large passes than tokens.
    assert usage.speculative_rounds == len(large.fed) < usage.completion_tokens / 2
    assert usage.large_tokens == usage.completion_tokens and usage.small_tokens == 0


def test_disagreeing_drafts_are_corrected_by_the_large_model(tokenizer):
    small_text = "we add two and four. so the sum is six. then we stop. so it is six."
    engine, _, _ = scripted_engine(tokenizer, LARGE, small_text=small_text, cues=[])
    spec = engine.generate(PROMPT, max_new_tokens=200, mode="large", speculative=True)
    assert spec.text == LARGE
    assert 0 < spec.usage.accepted_draft_tokens < spec.usage.draft_tokens


def test_cue_inside_an_accepted_run_switches_exactly_as_without_speculation(tokenizer):
    # The small model writes upper case: its drafts are rejected (except punctuation), so every large token is a
    # correction, and its own sentences differ visibly. Spans and text must equal the token-by-token relay.
    small_text = LARGE.upper()
    plain_engine, _, _ = scripted_engine(tokenizer, LARGE, small_text=small_text, cues=["so", "then"])
    spec_engine, _, _ = scripted_engine(tokenizer, LARGE, small_text=small_text, cues=["so", "then"])
    plain = plain_engine.generate(PROMPT, max_new_tokens=200)
    spec = spec_engine.generate(PROMPT, max_new_tokens=200, speculative=6)
    assert spec.text == plain.text and spec.completion_ids == plain.completion_ids
    assert [(s.model, s.trigger, s.text) for s in spec.spans] == [(s.model, s.trigger, s.text) for s in plain.spans]
    assert spec.usage.switches >= 3 and spec.usage.small_tokens == plain.usage.small_tokens


def test_relay_spec_matches_relay_on_agreeing_models_with_cues(tokenizer):
    # Same text for both models: drafts are accepted across cue words, so cutting at the cue is what keeps equality.
    engine, _, _ = scripted_engine(tokenizer, LARGE, small_text=LARGE, cues=["so", "then"])
    plain = engine.generate(PROMPT, max_new_tokens=200)
    spec = engine.generate(PROMPT, max_new_tokens=200, speculative=8)
    assert [(s.model, s.text) for s in spec.spans] == [(s.model, s.text) for s in plain.spans]
    assert spec.usage.rolled_back_tokens == plain.usage.rolled_back_tokens


def test_stop_sequence_and_length_limit_inside_an_accepted_run(tokenizer):
    engine, _, _ = scripted_engine(tokenizer, LARGE, small_text=LARGE, cues=[])
    stopped = engine.generate(PROMPT, max_new_tokens=200, speculative=8, stop=["total"])
    assert stopped.text == LARGE[: LARGE.index("total")] and stopped.finish_reason == "stop_sequence"
    capped = engine.generate(PROMPT, max_new_tokens=7, speculative=8, mode="large")
    assert capped.usage.completion_tokens == 7 and capped.finish_reason == "length"
    assert capped.completion_ids == engine.generate(PROMPT, max_new_tokens=7, mode="large").completion_ids


def relay_engine(tokenizer, large, small, **kwargs) -> RelayEngine:
    cues = ["the", "a", "The", "and", "to", "of", "is", "in"]
    # Random weights give flat distributions: without ``draft_confidence=0`` every draft would stop after one token.
    kwargs.setdefault("draft_confidence", 0.0)
    return RelayEngine.from_models(
        large, small, tokenizer, cues=cues, policy={"min_large_tokens": 1, "max_small_tokens": 3}, **kwargs
    )


@pytest.mark.parametrize("mode", ["relay", "large"])
def test_greedy_speculation_is_token_identical_on_a_real_pair(tokenizer, pair, mode):
    engine = relay_engine(tokenizer, *pair)
    prompt_ids = engine.encode_messages(MESSAGES)
    plain = engine.generate_ids(prompt_ids, max_new_tokens=48, mode=mode)
    spec = engine.generate_ids(prompt_ids, max_new_tokens=48, mode=mode, speculative=5)
    assert spec.completion_ids == plain.completion_ids
    assert [(s.model, s.text) for s in spec.spans] == [(s.model, s.text) for s in plain.spans]
    assert spec.usage.speculative_rounds > 0 and spec.usage.draft_tokens > 0
    # Where the time went: the small model's passes are drafts (and, under relay, its own segments); the small
    # model's share comes from its own segments only without speculation.
    # Parts within the whole, on one clock (perf_counter, passes timed inside the request): no bound, cannot flake.
    assert 0 < spec.usage.large_forward_seconds + spec.usage.small_forward_seconds <= spec.elapsed
    assert spec.usage.small_forward_seconds > 0
    assert (plain.usage.small_forward_seconds > 0) == (plain.usage.small_tokens > 0)


def test_an_unconfident_draft_stops_early_and_changes_nothing_but_the_cost(tokenizer, pair):
    prompt_ids = relay_engine(tokenizer, *pair).encode_messages(MESSAGES)
    eager = relay_engine(tokenizer, *pair).generate_ids(prompt_ids, max_new_tokens=40, mode="large", speculative=5)
    cautious = relay_engine(tokenizer, *pair, draft_confidence=1.0)  # no token is that certain: one-token drafts
    careful = cautious.generate_ids(prompt_ids, max_new_tokens=40, mode="large", speculative=5)
    assert careful.completion_ids == eager.completion_ids
    # At most one token per round (the last round may have no room left to draft at all).
    assert careful.usage.draft_tokens <= careful.usage.speculative_rounds < eager.usage.draft_tokens
    with pytest.raises(GenerationError, match="draft_confidence"):
        relay_engine(tokenizer, *pair, draft_confidence=1.5)


def test_caches_hold_exactly_the_sequence_after_speculation(tokenizer, pair):
    engine = relay_engine(tokenizer, *pair)
    prompt_ids = engine.encode_messages(MESSAGES)
    result = engine.generate_ids(prompt_ids, max_new_tokens=40, speculative=4)
    ids = prompt_ids + result.completion_ids
    for role, model in (("large", pair[0]), ("small", pair[1])):
        runner = engine.backend.runners[role]
        assert runner.cached_ids == ids[: len(runner.cached_ids)], "no rejected draft token may stay cached"
        cached = runner.logits_for(ids)
        with torch.no_grad():
            fresh = model(torch.tensor([ids])).logits[0, -1].float()
        torch.testing.assert_close(cached, fresh, atol=1e-4, rtol=1e-4)


def test_a_drafter_identical_to_the_large_model_is_always_accepted(tokenizer, pair):
    twin = tiny_qwen2(tokenizer, seed=1, hidden=64, layers=2)
    engine = relay_engine(tokenizer, pair[0], twin)
    result = engine.generate(MESSAGES, max_new_tokens=40, mode="large", speculative=6)
    assert result.usage.acceptance_rate == 1.0
    assert result.completion_ids == engine.generate(MESSAGES, max_new_tokens=40, mode="large").completion_ids


def test_speculative_sampling_is_seeded_and_reproducible(tokenizer, pair):
    engine = relay_engine(tokenizer, *pair)
    settings = {"max_new_tokens": 30, "temperature": 1.0, "top_k": 20, "seed": 7, "speculative": 4}
    first, second = engine.generate(MESSAGES, **settings), engine.generate(MESSAGES, **settings)
    assert first.completion_ids == second.completion_ids and first.usage.draft_tokens > 0


def test_acceptance_rule_preserves_the_target_distribution():
    """Draft from q, accept/resample against p: the first committed token must be distributed as p (and the second,
    after an accepted first token, too). 20,000 draws; total-variation distance well under sampling noise."""
    p = torch.tensor([0.5, 0.2, 0.2, 0.1, 0.0])
    q = torch.tensor([0.1, 0.1, 0.3, 0.2, 0.3])
    sampler = Sampler(SamplingParams(temperature=1.0, seed=0))
    # Logits whose softmax is p (the sampler applies temperature 1 and softmax); -inf keeps token 4 impossible.
    target_logits = torch.log(p).repeat(3, 1)
    counts = torch.zeros(5)
    second = torch.zeros(5)
    for _ in range(20_000):
        drafts = [int(torch.multinomial(q, 1, generator=sampler.generator)) for _ in range(2)]
        committed, accepted = accept(drafts, target_logits, [q, q], sampler, [0])
        counts[committed[0]] += 1
        if accepted >= 1:
            second[committed[1]] += 1
    assert 0.5 * float((counts / counts.sum() - p).abs().sum()) < 0.015
    assert 0.5 * float((second / second.sum() - p).abs().sum()) < 0.02
    assert counts[4] == 0, "a token the large model cannot write must never be committed"


def test_draft_length_adapts_within_bounds():
    length = DraftLength(maximum=5, current=3)
    length.update(drafted=3, accepted=3)
    assert length.current == 5
    length.update(drafted=5, accepted=5)
    assert length.current == 5
    for _ in range(6):
        length.update(drafted=length.current, accepted=0)
    assert length.current == 1


@pytest.mark.parametrize("value", [-1, 65, "4", 2.5])
def test_bad_speculative_settings_raise(tokenizer, pair, value):
    engine = relay_engine(tokenizer, *pair)
    with pytest.raises(GenerationError, match="speculative"):
        engine.generate(MESSAGES, max_new_tokens=4, speculative=value)


def test_speculation_needs_a_drafter(tokenizer, pair):
    with pytest.raises(GenerationError, match="needs a small model"):
        RelayEngine.from_models(pair[0], None, tokenizer, speculative=True)
    engine = RelayEngine.from_models(pair[0], None, tokenizer)
    with pytest.raises(GenerationError, match="needs a small model"):
        engine.generate(MESSAGES, max_new_tokens=4, mode="large", speculative=2)


def test_engine_default_applies_to_every_request(tokenizer, pair):
    engine = relay_engine(tokenizer, *pair, speculative=3)
    assert engine.generate(MESSAGES, max_new_tokens=12, mode="large").usage.speculative_rounds > 0
    assert engine.generate(MESSAGES, max_new_tokens=12, mode="large", speculative=False).usage.draft_tokens == 0
