"""Exactness, caches, detokenization, sampling and async on a tiny random-weight pair (fp32)."""

from __future__ import annotations

import asyncio
import re

import pytest
import torch
from helpers import PROMPT, PassGate, cancel_while_held, tiny_qwen2

from relaygen_integrations import CueSet, FinalEvent, RelayEngine, RelayResult, TextEvent
from relaygen_integrations.engine import GenerationError
from relaygen_integrations.engine.core.detokenize import IncrementalDetokenizer

MESSAGES = [{"role": "user", "content": "Count the apples: two and three. So how many?"}]


def words_the_large_model_writes(tokenizer, pair) -> tuple[str, ...]:
    """Whole words from the large model's own greedy text: relay output equals it up to the first cue, so these
    cues are guaranteed to fire on random weights."""
    text = make_engine(tokenizer, pair, cues=()).generate(MESSAGES, max_new_tokens=60).text
    return tuple(sorted(set(re.findall(r"(?<![\w])[A-Za-z]{2,}(?![\w])", text))))


@pytest.fixture(scope="module")
def pair(tokenizer):
    return tiny_qwen2(tokenizer, seed=1, hidden=64, layers=2), tiny_qwen2(tokenizer, seed=2, hidden=32, layers=1)


def make_engine(tokenizer, pair, cues=("So", "Therefore", "The", "the", "a"), **kwargs) -> RelayEngine:
    large, small = pair
    return RelayEngine.from_models(large, small, tokenizer, cues=list(cues), policy={"min_large_tokens": 1, **kwargs})


def hf_greedy(model, prompt_ids: list[int], n: int) -> list[int]:
    out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=n, do_sample=False, min_new_tokens=n)
    return out[0, len(prompt_ids) :].tolist()


@pytest.mark.parametrize("mode", ["large", "small"])
def test_single_mode_matches_transformers_generate(tokenizer, pair, mode):
    engine = make_engine(tokenizer, pair)
    prompt_ids = engine.encode_messages(MESSAGES)
    reference = hf_greedy(pair[0] if mode == "large" else pair[1], prompt_ids, 40)
    # The eos ids are not reachable in 40 steps of these models only by chance, so compare the shared prefix length.
    result = engine.generate_ids(prompt_ids, max_new_tokens=40, mode=mode)
    assert result.completion_ids == reference[: len(result.completion_ids)]
    assert len(result.completion_ids) == 40 or reference[len(result.completion_ids)] in engine.eos_ids


def test_relay_without_cues_equals_large_only(tokenizer, pair):
    relay = make_engine(tokenizer, pair, cues=()).generate(MESSAGES, max_new_tokens=40)
    large = make_engine(tokenizer, pair).generate(MESSAGES, max_new_tokens=40, mode="large")
    assert relay.completion_ids == large.completion_ids
    assert relay.usage.small_tokens == 0


def test_relay_switches_and_keeps_invariants(tokenizer, pair):
    engine = make_engine(tokenizer, pair, cues=words_the_large_model_writes(tokenizer, pair), max_small_tokens=3)
    result = engine.generate(MESSAGES, max_new_tokens=60)
    assert result.usage.switches >= 1, "the cue list covers common tokens, so the small model must get a turn"
    assert "".join(s.text for s in result.spans) == result.text == tokenizer.decode(result.completion_ids)
    assert result.usage.large_tokens + result.usage.small_tokens == result.usage.completion_tokens


def test_relay_continuation_equals_a_fresh_prefill(tokenizer, pair):
    """After switches, each cache must hold exactly the sequence: the large model's next-token logits after a relay
    equal those of a fresh forward pass over prompt + completion."""
    engine = make_engine(tokenizer, pair, cues=words_the_large_model_writes(tokenizer, pair), max_small_tokens=3)
    prompt_ids = engine.encode_messages(MESSAGES)
    result = engine.generate_ids(prompt_ids, max_new_tokens=30)
    assert result.usage.switches >= 2
    ids = prompt_ids + result.completion_ids
    for role, model in (("large", pair[0]), ("small", pair[1])):
        cached = engine.backend.runners[role].logits_for(ids)  # catches up on what it missed
        with torch.no_grad():
            fresh = model(torch.tensor([ids])).logits[0, -1].float()
        torch.testing.assert_close(cached, fresh, atol=1e-4, rtol=1e-4)


def test_seed_makes_sampling_reproducible(tokenizer, pair):
    engine = make_engine(tokenizer, pair)
    settings = {"max_new_tokens": 25, "temperature": 1.0, "top_p": 0.9, "top_k": 50}
    a = engine.generate(MESSAGES, seed=7, **settings)
    b = engine.generate(MESSAGES, seed=7, **settings)
    c = engine.generate(MESSAGES, seed=8, **settings)
    assert a.completion_ids == b.completion_ids
    assert a.completion_ids != c.completion_ids


def test_detokenizer_handles_split_multibyte_characters(tokenizer):
    text = "Price: 5€ — naïve 🦩 café 日本語 𓀀 done"
    ids = tokenizer.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer)
    pieces = [detok.push(i) for i in ids]
    assert "".join(pieces) == detok.text == tokenizer.decode(ids) == text
    assert not any("\ufffd" in p for p in pieces)
    assert any(p == "" for p in pieces), "the emoji spans several byte tokens, so some pushes must hold text back"


def test_multibyte_character_split_across_a_switch(tokenizer, pair):
    """A character whose bytes come from two models lands whole in one span; text stays decode(ids)."""
    emoji_ids = tokenizer.encode("🦩", add_special_tokens=False)
    assert len(emoji_ids) >= 2
    from relaygen_integrations.engine.core.loop import drive
    from relaygen_integrations.engine.core.policy import PolicyConfig, RelayPolicy
    from relaygen_integrations.engine.core.transcript import Transcript
    from relaygen_integrations.engine.local.runner import ModelRunner
    from relaygen_integrations.engine.local.session import LocalSession

    script = (
        tokenizer.encode("Ok. So", add_special_tokens=False)
        + emoji_ids
        + tokenizer.encode(" done.", add_special_tokens=False)
    )

    prompt_ids = tokenizer.encode("hi", add_special_tokens=False)

    def replay(logits, ids):
        """A sampler that writes the script by position, whoever writes (the models still run for real)."""
        position = len(ids) - len(prompt_ids)
        return script[position] if position < len(script) else tokenizer.convert_tokens_to_ids("<|im_end|>")

    runners = {"large": ModelRunner("large", pair[0]), "small": ModelRunner("small", pair[1])}
    # "So" fires; the small model's one-token cap falls between the two byte tokens of the character.
    policy = RelayPolicy(CueSet(("So",)), PolicyConfig(min_large_tokens=0, max_small_tokens=1))
    transcript = Transcript(tokenizer, prompt_ids, policy, (), frozenset({151645}), 50)
    events = list(drive(transcript, LocalSession(runners, transcript, replay)))
    result = events[-1].result
    assert result.text == tokenizer.decode(result.completion_ids)
    assert "".join(s.text for s in result.spans) == result.text
    assert "🦩" in result.text and result.usage.switches >= 2
    assert sum(1 for s in result.spans if "🦩" in s.text) == 1


async def test_async_matches_sync_and_never_blocks_the_loop(tokenizer, pair):
    engine = make_engine(tokenizer, pair)
    expected = engine.generate(MESSAGES, max_new_tokens=30)
    pieces = []

    async def consume() -> RelayResult:
        async for event in engine.astream(MESSAGES, max_new_tokens=30):
            if isinstance(event, TextEvent):
                pieces.append(event.text)
            elif isinstance(event, FinalEvent):
                final = event.result
        return final

    # The 3rd forward pass waits until this coroutine releases it: were the generation run on the event loop's
    # thread, the loop could never get here, and the held pass would fail after the gate's 60 s.
    gate = PassGate(*pair, hold_at=3, allowed=10**6)
    task = asyncio.create_task(consume())
    try:
        await asyncio.to_thread(gate.wait_held)
        assert not task.done()
    finally:
        gate.release()
        gate.remove()
    final = await task
    assert "".join(pieces) == final.text == expected.text
    assert (await engine.agenerate(MESSAGES, max_new_tokens=30)).text == expected.text


async def test_cancellation_stops_generation_and_leaves_a_clean_engine(tokenizer, pair):
    engine = make_engine(tokenizer, pair)
    expected = engine.generate(MESSAGES, max_new_tokens=40)

    async def consume() -> None:
        async for _ in engine.astream(MESSAGES, max_new_tokens=2000):
            pass

    # The worker is held in its 5th forward pass while the task is cancelled: the passes after that are counted.
    gate = PassGate(*pair, hold_at=5)
    assert await cancel_while_held(gate, asyncio.create_task(consume())) <= 1  # at most the round it was in
    again = await engine.agenerate(MESSAGES, max_new_tokens=40)
    assert again.text == expected.text


def test_abandoned_stream_releases_the_engine(tokenizer, pair):
    engine = make_engine(tokenizer, pair)
    expected = engine.generate(MESSAGES, max_new_tokens=20)
    stream = engine.stream(MESSAGES, max_new_tokens=500)
    next(stream)
    stream.close()
    assert engine.generate(MESSAGES, max_new_tokens=20).text == expected.text


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"temperature": -1.0}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"mode": "medium"}, "mode"),
        ({"stop": [""]}, "stop"),
    ],
)
def test_bad_settings_raise_before_any_work(tokenizer, pair, settings, message):
    engine = make_engine(tokenizer, pair)
    with pytest.raises(GenerationError, match=message):
        engine.generate(PROMPT, **settings)


def test_prompt_longer_than_the_context_window_names_the_numbers(tokenizer, pair):
    engine = make_engine(tokenizer, pair)
    with pytest.raises(GenerationError, match=r"has 3000 tokens but the context window is 2048"):
        engine.generate_ids([100] * 3000)
