"""GenerationSettings (one merge, one set of rules for every entry point) and the Backend protocol (a new backend
plugs into the front and gets text, spans, stops and usage from the one loop)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from transformers import PreTrainedTokenizerBase

from relaygen_integrations.engine import (
    BackendCapabilityError,
    CueSet,
    GenerationError,
    GenerationSettings,
    RelayEngine,
    SettingsError,
    merge_settings,
)
from relaygen_integrations.engine.core.backend import Step
from relaygen_integrations.engine.core.settings import GenerationPlan
from relaygen_integrations.engine.core.spans import ModelRole
from relaygen_integrations.engine.core.transcript import BackendUsage, Fed, Transcript


# -- settings -----------------------------------------------------------------------------------------------------
def test_layers_override_in_order_and_aliases_map():
    fields = {"max_tokens": 100, "temperature": 0.5, "stop": ["A"], "mode": "large"}
    settings = merge_settings(fields, {"max_new_tokens": 7, "top_k": 3}, {"stop_sequences": "B"})
    assert settings.max_new_tokens == 7 and settings.temperature == 0.5 and settings.top_k == 3
    assert settings.stop == ("B",) and settings.mode == "large"
    assert merge_settings().max_new_tokens == GenerationSettings().max_new_tokens == 256


def test_a_string_stop_is_one_stop_sequence_and_none_is_none():
    assert merge_settings({"stop": "Table"}).stop == ("Table",)
    assert merge_settings({"stop": None}).stop == ()


@pytest.mark.parametrize(
    ("layer", "field"),
    [
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"max_new_tokens": True}, "max_new_tokens"),
        ({"max_new_tokens": "12"}, "max_new_tokens"),
        ({"temperature": -1}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_k": 0}, "top_k"),
        ({"seed": 2**70}, "seed"),
        ({"stop": 5}, "stop"),
        ({"stop": [""]}, "stop"),
        ({"mode": "medium"}, "mode"),
        ({"speculative": 65}, "speculative"),
        ({"speculative": "4"}, "speculative"),
        ({"tempreature": 0.1}, "tempreature"),
    ],
)
def test_bad_settings_are_typed_errors_naming_the_field(layer, field):
    with pytest.raises(SettingsError, match=field) as caught:
        merge_settings(layer)
    assert caught.value.field == field
    assert isinstance(caught.value, GenerationError) and isinstance(caught.value, TypeError)


def test_settings_are_frozen_and_a_settings_layer_keeps_only_what_was_set():
    base = merge_settings({"temperature": 0.7, "cues": ["So"]})
    with pytest.raises(ValueError):
        base.temperature = 0.1  # type: ignore[misc]
    merged = merge_settings({"max_new_tokens": 9, "temperature": 0.0}, base)
    assert merged.max_new_tokens == 9 and merged.temperature == 0.7 and merged.cues == ("So",)
    cues = CueSet(("Thus",))
    assert merge_settings(merge_settings({"cues": cues})).cues is cues  # a CueSet passes through as it is


def test_draft_limit():
    assert merge_settings().draft_limit(4) == 4  # None: the engine's default
    assert merge_settings({"speculative": True}).draft_limit(0) == 6
    assert merge_settings({"speculative": False}).draft_limit(4) == 0
    assert merge_settings({"speculative": 3}).draft_limit(0) == 3


# -- a backend of our own -----------------------------------------------------------------------------------------
class ScriptBackend:
    """Each role writes its script, chunk by chunk (as a server streams): the smallest backend there is."""

    kind = "script"
    serialized = False
    grammars = False
    grammar_tokenizer = None
    large_name, small_name = "script-large", "script-small"
    context_window = 4096

    def __init__(self, tokenizer: PreTrainedTokenizerBase, large_text: str, small_text: str) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = len(tokenizer)
        self.eos_ids = frozenset({tokenizer.convert_tokens_to_ids("<|im_end|>")})
        self.texts = {"large": large_text, "small": small_text}
        self.sessions: list[ScriptSession] = []

    @property
    def roles(self) -> frozenset[ModelRole]:
        return frozenset(("large", "small"))

    def check(self, plan: GenerationPlan) -> None:
        if plan.speculative:
            raise BackendCapabilityError(self.kind, "run speculative decoding", "it has no logits")

    def open(self, plan: GenerationPlan, transcript: Transcript) -> ScriptSession:
        self.sessions.append(ScriptSession(self, transcript))
        return self.sessions[-1]

    def token_margins(self, role: ModelRole, prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> list[float]:
        raise BackendCapabilityError(self.kind, "score tokens", "it has no logits")

    def local_model(self, role: ModelRole):
        raise BackendCapabilityError(self.kind, "hand out a model", "it has none")

    def close(self) -> None:
        pass


class ScriptSession:
    def __init__(self, backend: ScriptBackend, transcript: Transcript) -> None:
        self.backend, self.transcript = backend, transcript
        self.feeds: list[Fed] = []
        self.closed: bool | None = None

    def next_tokens(self, writer: ModelRole) -> Step:
        written = self.backend.tokenizer.decode(self.transcript.ids[self.transcript.prompt_len :])
        rest = self.backend.texts[writer][len(written) :]
        if not rest:
            return Step(sorted(self.backend.eos_ids))
        return Step(self.backend.tokenizer.encode(rest, add_special_tokens=False)[:3])  # three tokens a chunk

    def after_feed(self, fed: Fed) -> None:
        self.feeds.append(fed)

    def close(self, failed: bool) -> None:
        self.closed = failed

    def usage(self) -> BackendUsage:
        return BackendUsage(requests=len(self.feeds))


TEXT = "We add two and three. So the answer is five. Then we are done."


def test_a_new_backend_gets_the_relay_from_the_front(tokenizer):
    backend = ScriptBackend(tokenizer, TEXT, TEXT.upper())
    engine = RelayEngine(backend, tokenizer, cues=["So "], policy={"min_large_tokens": 1})
    result = engine.generate([{"role": "user", "content": "Add two and three."}], max_new_tokens=100)
    assert result.text == "We add two and three. So THE ANSWER IS FIVE. Then we are done."
    assert [(s.model, s.trigger) for s in result.spans] == [
        ("large", "start"),
        ("small", "cue:So "),
        ("large", "sentence_end"),
    ]
    assert "".join(s.text for s in result.spans) == result.text and result.finish_reason == "stop"
    session = backend.sessions[-1]
    assert session.closed is False and result.usage.requests == len(session.feeds)
    assert any(fed.decision.action != "continue" for fed in session.feeds)
    assert result.usage.completion_tokens == result.usage.large_tokens + result.usage.small_tokens
    # Stop sequences and per-request cues come from the front too, for every backend.
    stopped = engine.generate([{"role": "user", "content": "x"}], max_new_tokens=100, stop="answer", cues=["Then"])
    assert stopped.text == "We add two and three. So the " and stopped.finish_reason == "stop_sequence"
    assert [s.model for s in stopped.spans] == ["large"]


def test_a_backend_refuses_what_it_cannot_do_before_any_work(tokenizer):
    backend = ScriptBackend(tokenizer, TEXT, TEXT)
    engine = RelayEngine(backend, tokenizer, cues=["So "])
    with pytest.raises(BackendCapabilityError, match="script backend cannot run speculative decoding"):
        engine.generate([{"role": "user", "content": "x"}], speculative=True)
    assert backend.sessions == []


# -- the engine's default mode ------------------------------------------------------------------------------------
def test_a_request_without_a_mode_takes_the_engines_default(pair, tokenizer):
    large, small = pair
    prompt = tokenizer.encode("Solve it. So the answer")
    engine = RelayEngine.from_models(large, small, tokenizer, cues=["So"], mode="large", speculative=True)
    assert engine.mode == "large" and engine.plan(prompt).mode == "large"
    assert engine.plan(prompt, mode="relay").mode == "relay"  # a request's own mode wins
    result = engine.generate_ids(prompt, max_new_tokens=6)
    assert result.usage.small_tokens == 0 and result.usage.draft_tokens > 0  # the small model only drafted
    assert {span.model for span in result.spans} == {"large"}
    assert RelayEngine.from_models(large, small, tokenizer).mode == "relay"


def test_without_a_small_model_the_default_is_the_large_model_and_relay_is_refused(pair, tokenizer):
    large, _ = pair
    engine = RelayEngine.from_models(large, None, tokenizer)
    assert engine.mode == "large" and engine.plan(tokenizer.encode("Hi")).mode == "large"
    with pytest.raises(GenerationError) as refused:
        engine.plan(tokenizer.encode("Hi"), mode="relay")
    assert refused.value.field == "mode"
    with pytest.raises(GenerationError) as refused:
        RelayEngine.from_models(large, None, tokenizer, mode="relay")
    assert refused.value.field == "mode"


def test_a_known_pair_ships_its_default_mode():
    from relaygen_integrations.engine.core.configuration import PairConfiguration

    assert PairConfiguration.shipped(None).mode == PairConfiguration.shipped("other").mode == "relay"
    # the shipped demo profile (docs/benchmarks.md#the-60-problem-run)
    assert PairConfiguration.shipped("demo").mode == "large"
