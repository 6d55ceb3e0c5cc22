"""The static-cache runner (``kv_cache="static"``) and its compiled decode step (``compile=True``) write exactly the
eager ``DynamicCache`` runner's tokens on an fp32 pair: every mode, with and without speculation, verified relay's
rejections and the policy's look-ahead rollbacks, prefix reuse across requests, and a cache that must grow."""

from __future__ import annotations

import functools
import re

import pytest
import torch

from relaygen_integrations import RelayEngine
from relaygen_integrations.engine.core.settings import GenerationError
from relaygen_integrations.engine.local.kv import CacheOptions, static_capacity

MESSAGES = [{"role": "user", "content": "Tell me about the sea and the sky."}]
CASES = [
    ("relay", {}),
    ("large", {}),
    ("small", {}),
    ("relay", {"speculative": 4}),
    ("large", {"speculative": 4}),
    ("relay", {"verify": "greedy"}),
    ("relay", {"verify": "prob:0.3", "speculative": 3}),
]


@pytest.fixture(scope="module")
def cues(tokenizer, pair):
    """Words the large model writes: random weights seldom write English, so cues must come from its own text."""
    probe = RelayEngine.from_models(*pair, tokenizer, cues=[])
    text = probe.generate(MESSAGES, max_new_tokens=40, mode="large").text
    return sorted(set(re.findall(r"(?<![\w])[A-Za-z]{2,}(?![\w])", text)))


@pytest.fixture
def engine_over(tokenizer, pair, cues):
    def build(**cache) -> RelayEngine:
        return RelayEngine.from_models(
            *pair, tokenizer, cues=cues, policy={"min_large_tokens": 1, "max_small_tokens": 4}, draft_confidence=0.0,
            **cache,
        )  # fmt: skip

    return build


def outcome(result):
    return result.completion_ids, [(s.model, s.text) for s in result.spans], result.usage.rejected_tokens


@pytest.mark.parametrize(("mode", "settings"), CASES)
def test_static_cache_writes_the_eager_runners_tokens(engine_over, mode, settings):
    eager, static = engine_over(), engine_over(kv_cache="static")
    prompt_ids = eager.encode_messages(MESSAGES)
    expected = eager.generate_ids(prompt_ids, max_new_tokens=40, mode=mode, **settings)
    got = static.generate_ids(prompt_ids, max_new_tokens=40, mode=mode, **settings)
    assert outcome(got) == outcome(expected)
    assert all(runner.options.static for runner in static.backend.runners.values())


def test_static_layers_without_crop_roll_back_the_same(engine_over, monkeypatch):
    """transformers releases before 5.2x (5.17 on the GPU image, benchmarks/data/gpu-h200) have static layers without
    ``crop``: the rollbacks of speculation and verified relay must still give the eager runner's tokens there."""
    from transformers.cache_utils import StaticLayer

    eager = engine_over()
    prompt_ids = eager.encode_messages(MESSAGES)
    settings = {"verify": "prob:0.3", "speculative": 3}
    expected = eager.generate_ids(prompt_ids, max_new_tokens=40, **settings)
    monkeypatch.delattr(StaticLayer, "crop")
    got = engine_over(kv_cache="static").generate_ids(prompt_ids, max_new_tokens=40, **settings)
    assert outcome(got) == outcome(expected)
    assert expected.usage.rejected_tokens > 0  # the run rolled back


def test_the_cases_cover_switches_rollbacks_and_rejections(engine_over):
    """The exactness above means something only if the runs switch, roll back and reject."""
    engine = engine_over()
    prompt_ids = engine.encode_messages(MESSAGES)
    relay = engine.generate_ids(prompt_ids, max_new_tokens=40)
    assert relay.usage.small_tokens > 0 and len({s.model for s in relay.spans}) == 2
    verified = engine.generate_ids(prompt_ids, max_new_tokens=40, verify="greedy")
    assert verified.usage.rejected_tokens > 0


def test_a_static_cache_is_reused_across_requests_and_grows_when_outrun(engine_over):
    engine = engine_over(kv_cache="static")
    eager = engine_over()
    prompt_ids = engine.encode_messages(MESSAGES)
    first = engine.generate_ids(prompt_ids, max_new_tokens=8, mode="large")
    runner = engine.backend.runners["large"]
    cache, size = runner.cache, static_capacity(runner.cache)
    # The same conversation, continued: the cached prefix is reused, and the buffers stay the same.
    longer = prompt_ids + first.completion_ids
    second = engine.generate_ids(longer, max_new_tokens=8, mode="large")
    assert second.usage.reused_prefix_tokens > 0 and runner.cache is cache
    assert second.completion_ids == eager.generate_ids(longer, max_new_tokens=8, mode="large").completion_ids
    # A larger budget outruns the block the cache was sized for: it grows, copying the reused prefix, and the
    # tokens stay the eager runner's.
    grown = engine.generate_ids(longer, max_new_tokens=250, mode="large")
    assert grown.usage.reused_prefix_tokens > 0 and static_capacity(runner.cache) > size
    assert grown.completion_ids == eager.generate_ids(longer, max_new_tokens=250, mode="large").completion_ids


@pytest.mark.parametrize("kv_cache", ["static", "dynamic"])
def test_a_forward_pass_that_raises_mid_request_leaves_the_engine_as_a_fresh_one(engine_over, monkeypatch, kv_cache):
    """docs/reliability.md, "a forward pass that raises": both caches are dropped (``reset``) rather than trusted, so
    the next request is what a fresh engine writes. The pass fails inside the large model's last layer, after the
    layers before it wrote the new position into the cache: a half-written cache, as a real failure leaves one."""
    engine = engine_over(kv_cache=kv_cache)
    prompt_ids = engine.encode_messages(MESSAGES)
    finished = engine_over(kv_cache=kv_cache).generate_ids(prompt_ids, max_new_tokens=40)
    # The next request continues the conversation past where the failed one broke off: a runner that trusted its
    # cache would keep every position it believes it holds (nothing to crop) and run on after the stale one.
    continued = prompt_ids + finished.completion_ids
    expected = engine_over(kv_cache=kv_cache).generate_ids(continued, max_new_tokens=16)

    large = engine.backend.runners["large"]
    last_layer = large.model.model.layers[-1]
    real_forward = last_layer.forward
    # Per call of the last layer: positions the first layer has written beyond the ids the runner has committed.
    written_ahead: list[int] = []
    fail_at = 6  # the large model's sixth pass: after the prompt and some of its own and the small model's tokens

    def failing_forward(*args: object, **kwargs: object) -> object:
        written_ahead.append(int(large.cache.layers[0].get_seq_length()) - len(large.cached_ids))
        if len(written_ahead) == fail_at:
            raise RuntimeError("injected failure in the large model's last layer")
        return real_forward(*args, **kwargs)

    monkeypatch.setattr(last_layer, "forward", failing_forward)
    streamed: list[str] = []
    with pytest.raises(RuntimeError, match="injected failure"):
        for event in engine.stream_ids(prompt_ids, max_new_tokens=40):
            streamed.append(event.text)
    monkeypatch.undo()
    # The request failed mid-way (text had reached the caller) and left the first layer a position ahead.
    assert "".join(streamed) and written_ahead[-1] > 0, (streamed, written_ahead)

    got = engine.generate_ids(continued, max_new_tokens=16)
    assert outcome(got) == outcome(expected)
    assert got.usage.reused_prefix_tokens == expected.usage.reused_prefix_tokens == 0  # neither cache was trusted


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"kv_cache": "paged"}, "kv_cache"),
        ({"compile": "yes"}, "compile"),
        ({"kv_cache": "dynamic", "compile": True}, "compile"),
    ],
)
def test_bad_cache_settings_are_typed_errors_naming_the_field(engine_over, options, field):
    with pytest.raises(GenerationError) as caught:
        engine_over(**options)
    assert caught.value.field == field


def test_cache_options_say_what_they_run():
    assert CacheOptions().label == "dynamic" and CacheOptions(kv_cache="static").label == "static"
    assert CacheOptions(compile=True).label == "static+compiled" and CacheOptions(compile=True).static


@pytest.mark.compiled
@pytest.mark.parametrize(("mode", "settings"), [CASES[0], CASES[3], CASES[6]])
def test_the_compiled_step_writes_the_eager_runners_tokens(engine_over, mode, settings):
    torch._dynamo.reset()
    eager, compiled = engine_over(), engine_over(compile=True)
    prompt_ids = eager.encode_messages(MESSAGES)
    expected = eager.generate_ids(prompt_ids, max_new_tokens=32, mode=mode, **settings)
    got = compiled.generate_ids(prompt_ids, max_new_tokens=32, mode=mode, **settings)
    assert outcome(got) == outcome(expected)
    # One-token steps run compiled: the large model's own steps, the small model's segments and drafts (under
    # speculation the large model only runs multi-position verify passes, which stay eager).
    steps = {role: runner.stats.compiled_steps for role, runner in compiled.backend.runners.items()}
    assert steps["small"] > 0 and (steps["large"] > 0 or "speculative" in settings)


def test_an_option_at_its_default_shares_the_engine_loaded_without_it(monkeypatch):
    loads = []

    @functools.wraps(RelayEngine.from_pretrained.__func__)  # keeps the signature (and so its defaults)
    def load(cls, **kwargs):
        loads.append(kwargs)
        return object()

    monkeypatch.setattr(RelayEngine, "from_pretrained", classmethod(load))
    monkeypatch.setattr("relaygen_integrations.engine.local.loading._SHARED_PAIRS", {})
    plain = RelayEngine.shared("a", "b", device="cpu", dtype="fp32")
    assert RelayEngine.shared("a", "b", device="cpu", dtype="fp32", compile=False) is plain
    assert RelayEngine.shared("a", "b", device="cpu", dtype="fp32", compile=True) is not plain
    assert len(loads) == 2 and loads[1]["compile"] is True
