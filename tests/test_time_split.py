"""Usage.time_split: every forward second of a request, by model and by what each pass was for."""

from __future__ import annotations

import pytest
from helpers import PROMPT, scripted_engine

from relaygen_integrations import RelayEngine
from relaygen_integrations.engine.local.runner import PASS_KINDS

MESSAGES = [{"role": "user", "content": "Say something about the sea and the sky."}]


def split_of(engine: RelayEngine, messages=MESSAGES, **settings):
    result = engine.generate(messages, max_new_tokens=32, **settings)
    usage = result.usage
    assert {key.split(".", 1)[1] for key in usage.time_split} <= set(PASS_KINDS)
    # The split is the forward time, all of it, attributed once.
    large = sum(v for k, v in usage.time_split.items() if k.startswith("large."))
    small = sum(v for k, v in usage.time_split.items() if k.startswith("small."))
    assert large == pytest.approx(usage.large_forward_seconds) and small == pytest.approx(usage.small_forward_seconds)
    # The same seconds by pass size, one entry for each size a pass read (what tune/observed.py learns from).
    for role, spent in (("large", usage.large_forward_seconds), ("small", usage.small_forward_seconds)):
        assert set(usage.pass_seconds.get(role, {})) == set(usage.passes.get(role, {}))
        assert sum(usage.pass_seconds.get(role, {}).values()) == pytest.approx(spent)
    return result, {k for k, v in usage.time_split.items() if v > 0}


def test_each_mode_reports_the_passes_it_ran(tokenizer, pair):
    large, small = pair
    engine = RelayEngine.from_models(large, small, tokenizer, cues=["the", "The"])
    _, alone = split_of(engine, mode="large")
    assert alone == {"large.prefill", "large.decode"}
    _, spec = split_of(engine, mode="large", speculative=True)
    assert {"large.prefill", "small.prefill", "large.verify_drafts"} <= spec
    # A draft's first token comes from the pass that catches the small model up on the accepted tokens.
    assert spec & {"small.draft", "small.catchup"}
    assert "small.decode" not in spec and "large.decode" not in spec  # nobody wrote a token of its own


def test_verified_relay_reports_sentences_and_their_verification(tokenizer):
    # Scripted: the small model writes the upper-cased sentence after "So", which the greedy rule rejects.
    engine, _, _ = scripted_engine(tokenizer, "We add them. So the sum is 5. Then it is 10. So we stop.")
    result, verified = split_of(engine, PROMPT, mode="relay", verify="greedy")
    assert result.usage.rejected_tokens > 0 and result.usage.small_tokens == 0
    assert {"large.prefill", "large.decode", "small.prefill", "small.decode", "large.verify_sentences"} <= verified
