"""Grammar-constrained decoding on the tiny pair: every token either model writes keeps to the grammar - decode
steps, a switch in the middle of a call, speculative drafts and checks, verified relay's rejections - and the grammar
state rolls back with every rejected token (the tests fail when it does not: ``test_a_state_that_is_not_rolled_back
_breaks_the_output`` shows how).

The small model is a noised copy of the large one (as in ``test_logprobs.py``): they agree often enough that drafts
are accepted and small-model runs verified, and differ enough that each rejects some.
"""

from __future__ import annotations

import copy
import gc
import json
import weakref
from typing import Literal

import llguidance
import pytest
import torch
from pydantic import BaseModel, Field

from relaygen_integrations import RelayEngine
from relaygen_integrations.chat.constraints import response_grammar, tool_call_grammar, turn_grammar
from relaygen_integrations.chat.relay_chat import prepare_chat, prepare_turn, stream_chat
from relaygen_integrations.engine.constraints.grammar import GrammarError, GrammarState
from relaygen_integrations.engine.constraints.opening import CallOpening
from relaygen_integrations.engine.core.settings import merge_settings
from relaygen_integrations.engine.local.session import LocalSession

MESSAGES = [{"role": "user", "content": "Tell me about the sea and the sky."}]
WORDS = ["sea", "sky", "sun", "moon", "star", "rain"]


class Calm(BaseModel):
    calm: bool


class Weather(BaseModel):
    """A nested schema whose every value is bounded, so that even a random model finishes it."""

    place: Literal["sea", "sky", "sun"]
    note: str = Field(max_length=8)  # free text: where the two models disagree
    hours: int = Field(ge=0, le=99)
    tags: list[Literal["moon", "star", "rain"]] = Field(max_length=3)
    inner: Calm | None


class Report(BaseModel):
    first: Weather
    second: Weather
    done: bool


SCHEMA = {**Report.model_json_schema()}
GRAMMAR_CASES = {
    "large": {"mode": "large"},
    "relay": {"mode": "relay", "verify": "off"},
    "relay-verified": {"mode": "relay", "verify": "greedy"},
    "large-spec": {"mode": "large", "speculative": 4},
    "relay-spec-verified": {"mode": "relay", "speculative": 4, "verify": "greedy"},
    "relay-spec-sampled": {"mode": "relay", "speculative": 3, "temperature": 0.9, "seed": 5},
}


@pytest.fixture(scope="module")
def engine(tokenizer, pair):
    large = pair[0]
    small = copy.deepcopy(large)
    noise = torch.Generator().manual_seed(3)
    with torch.no_grad():
        small.lm_head.weight.add_(torch.randn(small.lm_head.weight.shape, generator=noise) * 0.2)
    # Cues are the words the schema's values are made of: switches happen inside the JSON.
    return RelayEngine.from_models(
        large, small, tokenizer, cues=WORDS, policy={"min_large_tokens": 1, "max_small_tokens": 10},
        draft_confidence=0.0,
    )  # fmt: skip


def schema_grammar(engine: RelayEngine) -> str:
    tokenizer = engine.backend.grammar_tokenizer
    return turn_grammar(*response_grammar({}, SCHEMA), None, tokenizer)


@pytest.fixture
def final_states(monkeypatch):
    """The grammar state of each generation as its session closed: (consumed ids, kept completion ids)."""
    seen: list[tuple[list[int], list[int]]] = []
    close = LocalSession.close

    def recording(self: LocalSession, failed: bool) -> None:
        if self.grammar is not None:
            self.grammar.follow(self.transcript.ids)
            seen.append((list(self.grammar.consumed), self.transcript.ids[self.transcript.prompt_len :]))
        close(self, failed)

    monkeypatch.setattr(LocalSession, "close", recording)
    return seen


def replays(engine: RelayEngine, grammar: str, completion: list[int]) -> bool:
    """Whether a fresh matcher takes ``completion`` token by token and then accepts the end."""
    matcher = llguidance.LLMatcher(engine.backend.grammar_tokenizer.built, grammar, log_level=0)
    return matcher.consume_tokens(completion) and matcher.is_accepting()


@pytest.mark.parametrize("case", GRAMMAR_CASES)
def test_every_way_of_writing_keeps_to_the_schema(engine, case, final_states):
    grammar = schema_grammar(engine)
    result = engine.generate(MESSAGES, max_new_tokens=200, grammar=grammar, **GRAMMAR_CASES[case])
    assert result.finish_reason == "stop", result.text
    Report.model_validate_json(result.text)
    assert replays(engine, grammar, result.completion_ids)
    consumed, kept = final_states[-1]
    assert consumed == kept  # the state ends exactly at the kept tokens
    usage = result.usage
    if case in ("relay", "relay-verified", "relay-spec-verified", "relay-spec-sampled"):
        assert usage.small_tokens > 0 and usage.switches > 0, "the small model wrote part of the JSON"
    if "spec" in case:
        assert usage.draft_tokens > usage.accepted_draft_tokens > 0, "drafts were accepted and rejected"
    if case.endswith("verified"):
        assert usage.rejected_tokens > 0, "verified relay rejected small-model tokens"


def test_speculation_under_a_grammar_is_lossless(engine):
    """Greedy drafts checked by the masked rows give the large model's own masked choices, token for token."""
    grammar = schema_grammar(engine)
    plain = engine.generate(MESSAGES, max_new_tokens=200, grammar=grammar, mode="large")
    drafted = engine.generate(MESSAGES, max_new_tokens=200, grammar=grammar, mode="large", speculative=4)
    assert drafted.usage.draft_tokens > drafted.usage.accepted_draft_tokens
    assert drafted.completion_ids == plain.completion_ids


@pytest.mark.parametrize("case", ["large-spec", "relay-verified"])
def test_a_state_that_is_not_rolled_back_breaks_the_output(engine, monkeypatch, case):
    """The control for the tests above: a state that only ever moves forward (rejected drafts, a rejected run kept
    in it) masks the wrong positions, and the run breaks the grammar or leaves it."""
    grammar = schema_grammar(engine)

    def forward_only(self: GrammarState, ids: list[int]) -> None:
        for token in ids[self.prompt_len + len(self.consumed) :]:
            self.advance(token)

    monkeypatch.setattr(GrammarState, "follow", forward_only)
    try:
        result = engine.generate(MESSAGES, max_new_tokens=200, grammar=grammar, **GRAMMAR_CASES[case])
    except GrammarError:
        return
    assert not replays(engine, grammar, result.completion_ids)


def test_a_switch_inside_a_tool_call_keeps_it_valid(engine):
    """A forced call of a tool whose arguments are the cue words: the small model takes over inside the call's
    JSON, and the call still parses into the tool's schema."""
    tool = {"type": "function", "function": {"name": "describe", "description": "Describe a scene.",
                                             "parameters": Weather.model_json_schema()}}  # fmt: skip
    for extra in ({"verify": "off"}, {"verify": "prob:0.3", "speculative": 3}):
        settings = merge_settings({"max_new_tokens": 120, "mode": "relay", **extra})
        request = prepare_chat(MESSAGES, settings, [tool], tool_choice="required")
        deltas = list(stream_chat(engine, request))
        final = deltas[-1]
        assert final.parsed is not None and not final.parsed.invalid_tool_calls
        [call] = final.parsed.tool_calls
        assert call.name == "describe"
        Weather.model_validate(call.arguments)
        text = final.result.text
        body = (text.index("{"), text.rindex("}"))
        inside = [s for s in final.result.spans if s.model == "small" and body[0] < s.start < body[1]]
        assert inside, f"no switch inside the call: {[(s.model, s.text) for s in final.result.spans]}"


def test_constrain_false_and_a_remote_pair_run_free(engine):
    tool = {"type": "function", "function": {"name": "describe", "parameters": Weather.model_json_schema()}}
    constrained = prepare_turn(engine, prepare_chat(MESSAGES, merge_settings({}), [tool])).plan
    assert constrained.settings.grammar is not None and constrained.call_tag is not None
    free = prepare_turn(engine, prepare_chat(MESSAGES, merge_settings({"constrain": False}), [tool])).plan
    assert free.settings.grammar is None and free.call_tag is None


def test_a_grammar_that_does_not_compile_is_refused_before_any_work(engine):
    with pytest.raises(GrammarError, match="does not compile") as caught:
        engine.plan(engine.encode_messages(MESSAGES), grammar="start: undefined_rule")
    assert caught.value.field == "grammar"


def test_a_discarded_engines_grammar_tokenizer_is_freed(tokenizer, pair):
    """Compiled grammars are cached per grammar tokenizer: an engine that is dropped takes its tokenizer's ~115 MB
    (llguidance's copy of a 152k vocabulary) with it. A cache keyed by the tokenizer at module level kept 64 alive."""
    engine = RelayEngine.from_models(pair[0], pair[1], tokenizer)
    grammar_tokenizer = engine.backend.grammar_tokenizer
    for _ in range(2):
        assert engine.generate(MESSAGES, max_new_tokens=4, grammar='start: "sea" | "sky"').text in ("sea", "sky")
    assert grammar_tokenizer._compiled.cache_info().hits == 1  # compiled once, then copied per request
    freed = weakref.ref(grammar_tokenizer)
    del engine, grammar_tokenizer
    gc.collect()
    assert freed() is None


def walk(engine: RelayEngine, grammar: str, text: str) -> bool:
    tokenizer = engine.tokenizer
    state = engine.backend.grammar_tokenizer.state(grammar, 0)
    for token in tokenizer.encode(text, add_special_tokens=False):
        if not state.allowed()[token]:
            return False
        state.advance(token)
    return state.matcher.is_accepting()


def function_tool(name: str, properties: dict) -> dict:
    parameters = {"type": "object", "properties": properties, "required": list(properties)}
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


ADD = function_tool("add", {"a": {"type": "integer"}, "b": {"type": "integer"}})
NOTE = function_tool("note", {"text": {"type": "string"}})
CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
NOTE_CALL = '<tool_call>\n{"name": "note", "arguments": {"text": "hi"}}\n</tool_call>'


@pytest.mark.parametrize(
    ("choice", "parallel", "text", "valid"),
    [
        ("auto", False, "Just an answer.", True),
        ("auto", False, "Let me add.\n" + CALL, True),
        ("auto", False, CALL + "\n" + NOTE_CALL, False),  # one call a turn unless parallel calls are allowed
        ("auto", True, CALL + "\n" + NOTE_CALL, True),
        ("auto", False, CALL.replace('"b": 2', '"b": 2, "result": 3'), False),  # exactly the declared arguments
        ("auto", False, CALL.replace('"a": 1', '"a": "one"'), False),  # the argument's type
        ("auto", False, CALL.replace("add", "divide"), False),  # a bound tool's name
        ("auto", False, CALL.replace('{"a": 1', '{"a":1'), False),  # spaced as the template writes JSON
        ("required", False, "Just an answer.", False),
        ("required", False, NOTE_CALL, True),
        ("add", False, NOTE_CALL, False),
        ({"type": "function", "function": {"name": "add"}}, False, CALL, True),
    ],
)
def test_tool_grammars(engine, choice, parallel, text, valid):
    tokenizer = engine.backend.grammar_tokenizer
    grammar = turn_grammar(*tool_call_grammar([ADD, NOTE], choice, tokenizer, parallel), None, tokenizer)
    assert walk(engine, grammar, text) is valid


def test_a_thinking_turn_reasons_freely_first(engine):
    tokenizer = engine.backend.grammar_tokenizer
    grammar = turn_grammar(*tool_call_grammar([ADD], "required", tokenizer), "</think>", tokenizer)
    assert walk(engine, grammar, "It is 1 + 2, so I call add.</think>\n\n" + CALL)
    assert not walk(engine, grammar, "It is 1 + 2.</think>\n\nThe answer is 3.")


def test_a_plain_text_tag_ends_the_free_text_lazily(engine, monkeypatch):
    """A template whose call tag is plain text (not one special token): the free text ends at the tag."""
    import relaygen_integrations.chat.constraints as constraints

    monkeypatch.setattr(constraints, "OPEN_TAG", "<call>")
    monkeypatch.setattr(constraints, "CLOSE_TAG", "</call>")
    tokenizer = engine.backend.grammar_tokenizer
    grammar = turn_grammar(*constraints.tool_call_grammar([ADD], "auto", tokenizer), None, tokenizer)
    plain = CALL.replace("<tool_call>", "<call>").replace("</tool_call>", "</call>")
    assert walk(engine, grammar, "I add. " + plain) and walk(engine, grammar, "No call.")
    assert not walk(engine, grammar, "I add. " + plain.replace('"a"', '"x"'))


def test_the_first_token_decides_call_or_text_by_mass():
    """Tag 5; tokens 1 and 2 open a call in another dialect (a brace, a fence); token 3 opens markup."""
    openers = torch.zeros(8, dtype=torch.bool)
    openers[[1, 2]] = True
    markup = torch.zeros(8, dtype=torch.bool)
    markup[3] = True
    opening = CallOpening(5, openers, markup)
    allowed = torch.ones(8, dtype=torch.bool)
    calling = torch.log(torch.tensor([0.05, 0.6, 0.3, 0.02, 0.01, 0.01, 0.005, 0.005]))  # 0.91 on a call
    assert opening.decide(calling, allowed).tolist() == [False] * 5 + [True, False, False]
    answering = torch.log(torch.tensor([0.4, 0.3, 0.1, 0.1, 0.05, 0.02, 0.02, 0.01]))  # 0.42 on a call
    assert opening.decide(answering, allowed).tolist() == [True, False, False, False, True, False, True, True]


def test_json_formats_through_the_chat_layer(engine, tokenizer):
    """A schema through the chat layer (no prefill: the grammar opens the object); ``json_object`` on a scripted
    model whose reply is JSON (a random model would write keys until its budget ends)."""
    from helpers import chat_engine

    response_format = {"type": "json_schema", "json_schema": {"name": "report", "schema": SCHEMA}}
    request = prepare_chat(MESSAGES, merge_settings({"max_new_tokens": 200}), response_format=response_format)
    assert prepare_turn(engine, request).plan.prompt_ids == engine.encode_messages(request.messages)  # no "{" prefilled
    final = list(stream_chat(engine, request))[-1]
    assert final.result.finish_reason == "stop"
    Report.model_validate_json(final.parsed.content)
    scripted = chat_engine(tokenizer, '{"sea": [1, 2], "sky": {"blue": true}}')
    request = prepare_chat(MESSAGES, merge_settings({"max_new_tokens": 60}), response_format={"type": "json_object"})
    final = list(stream_chat(scripted, request))[-1]
    assert json.loads(final.parsed.content) == {"sea": [1, 2], "sky": {"blue": True}}
