"""A turn with tools and a JSON response format runs under one grammar: a tool call or the schema's JSON, nothing else
(what ChatOpenAI's strict mode gives). LangChain's ``create_agent(model, tools, response_format=Schema)`` binds both
at once (the provider strategy: the pair's profile says ``structured_output``), so the agent calls its tool and then
answers with the schema - on scripted models (a call, then the answer) and on the tiny random-weight pair (whatever
it writes keeps to one of the two)."""

from __future__ import annotations

import json
from typing import Any, Literal

import llguidance
import pytest
from helpers import chat_engine
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from pydantic import BaseModel, Field

from relaygen_integrations import RelayEngine
from relaygen_integrations.chat.constraints import json_item, tool_call_grammar, turn_grammar
from relaygen_integrations.chat.relay_chat import bare_call, prepare_chat, prepare_turn, stream_chat
from relaygen_integrations.engine.core.settings import merge_settings
from relaygen_integrations.langchain import RelayChatModel


class WeatherReport(BaseModel):
    city: str
    temperature_c: int
    conditions: Literal["sunny", "cloudy", "rainy"]


TAG_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
BARE_CALL = '{"name": "get_weather", "arguments": {"city": "Paris"}}'  # a call as a small model opens it
ANSWER = '{"city": "Paris", "temperature_c": 18, "conditions": "cloudy"}'


def weather_tool(calls: list[str]) -> Any:
    @tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        calls.append(city)
        return "18 degrees Celsius and cloudy"

    return get_weather


@pytest.mark.parametrize("constrain", [True, False], ids=["constrained", "free"])
@pytest.mark.parametrize("call", [TAG_CALL, BARE_CALL], ids=["tag", "bare"])
def test_create_agent_calls_the_tool_then_answers_with_the_schema(tokenizer, call, constrain):
    """Unconstrained (``constrain=False``, or a remote pair) no brace is prefilled, so the call stays possible."""
    from langchain.agents import create_agent

    calls: list[str] = []
    # No cue occurs in either reply: the large model writes every token (the small one's reply is upper case).
    engine = chat_engine(tokenizer, call, cues=["Zq"], after_result=ANSWER)
    model = RelayChatModel(engine=engine, max_tokens=80, constrain=constrain)
    agent = create_agent(model, tools=[weather_tool(calls)], response_format=WeatherReport)
    state = agent.invoke({"messages": [HumanMessage("What is the weather in Paris?")]})
    assert calls == ["Paris"]
    assert state["structured_response"] == WeatherReport(city="Paris", temperature_c=18, conditions="cloudy")
    first, result, final = state["messages"][1:]
    assert isinstance(first, AIMessage) and [c["name"] for c in first.tool_calls] == ["get_weather"]
    assert isinstance(result, ToolMessage) and isinstance(final, AIMessage) and not final.tool_calls
    assert json.loads(final.text) == json.loads(ANSWER)


def test_a_streamed_reply_is_the_call_or_the_answer_whole(tokenizer):
    """Text that may be a bare call is held until the turn ends: a call never streams as answer text."""
    calls: list[str] = []
    schema = WeatherReport.model_json_schema()
    response_format = {"type": "json_schema", "json_schema": {"name": "report", "schema": schema}}
    for reply, after in ((BARE_CALL, None), (TAG_CALL, ANSWER)):
        engine = chat_engine(tokenizer, reply, cues=["Zq"], after_result=after)
        bound = RelayChatModel(engine=engine, max_tokens=80).bind_tools(
            [weather_tool(calls)], response_format=response_format
        )
        history: list[Any] = [HumanMessage("What is the weather in Paris?")]
        if after is not None:  # the turn after the tool's result
            call = {"name": "get_weather", "args": {"city": "Paris"}, "id": "call_1"}
            history += [AIMessage("", tool_calls=[call]), ToolMessage("18 degrees", tool_call_id="call_1")]
        chunks = list(bound.stream(history))
        texts = [c.content for c in chunks if c.content]
        message = bound.invoke(history)
        if after is None:
            assert texts == [] and [c.tool_call_chunks[0]["name"] for c in chunks if c.tool_call_chunks] == [
                "get_weather"
            ]
            assert [c["args"] for c in message.tool_calls] == [{"city": "Paris"}] and message.content == ""
        else:
            assert texts == [ANSWER] and message.content == ANSWER and not message.tool_calls


def test_a_bare_object_is_a_call_only_when_it_is_exactly_one():
    assert bare_call(BARE_CALL, ["get_weather"]).arguments == {"city": "Paris"}
    assert bare_call(BARE_CALL, ["add"]) is None  # no bound tool of that name
    assert bare_call(BARE_CALL.replace("}}", '}, "note": 1}'), ["get_weather"]) is None  # more than a call
    assert bare_call(ANSWER, ["get_weather"]) is None


# -- the grammar, on the tiny random-weight pair ----------------------------------------------------------------------
class Scene(BaseModel):
    """An answer whose every value is bounded, so that a random model finishes it."""

    place: Literal["sea", "sky", "sun"]
    note: str = Field(max_length=8)
    hours: int = Field(ge=0, le=99)


SCHEMA = Scene.model_json_schema()
DESCRIBE = {
    "type": "function",
    "function": {
        "name": "describe",
        "description": "Describe a place.",
        "parameters": {
            "type": "object",
            "properties": {"place": {"enum": ["sea", "sky"]}, "days": {"type": "integer", "minimum": 0, "maximum": 9}},
            "required": ["place", "days"],
        },
    },
}
DESCRIBE_CALL = '{"name": "describe", "arguments": {"place": "sea", "days": 3}}'
SCENE = '{"place": "sun", "note": "warm", "hours": 4}'


@pytest.fixture(scope="module")
def engine(tokenizer, pair) -> RelayEngine:
    # Cues are words the JSON is made of: the small model takes over inside calls and answers.
    return RelayEngine.from_models(
        pair[0], pair[1], tokenizer, cues=["sea", "sky", "sun", "place"],
        policy={"min_large_tokens": 1, "max_small_tokens": 10}, draft_confidence=0.0,
    )  # fmt: skip


def one_grammar(engine: RelayEngine, choice: Any = "auto", parallel: bool = False) -> str:
    tokenizer = engine.backend.grammar_tokenizer
    return turn_grammar(*tool_call_grammar([DESCRIBE], choice, tokenizer, parallel, json_item(SCHEMA)), None, tokenizer)


def accepts(engine: RelayEngine, grammar: str, text: str | list[int]) -> bool:
    ids = engine.tokenizer.encode(text, add_special_tokens=False) if isinstance(text, str) else text
    matcher = llguidance.LLMatcher(engine.backend.grammar_tokenizer.built, grammar, log_level=0)
    return matcher.consume_tokens(ids) and matcher.is_accepting()


@pytest.mark.parametrize(
    ("choice", "parallel", "text", "valid"),
    [
        ("auto", False, f"<tool_call>\n{DESCRIBE_CALL}\n</tool_call>", True),
        ("auto", False, DESCRIBE_CALL, True),
        ("auto", False, SCENE, True),
        ("auto", False, "The sea is calm.", False),  # no free text
        ("auto", False, SCENE.replace("}", ', "mood": "calm"}'), False),  # the schema's keys only
        ("auto", False, SCENE.replace('"sun"', '"moon"'), False),
        ("auto", False, f"```json\n{SCENE}\n```", False),
        ("auto", False, SCENE + " That is all.", False),
        ("auto", False, f"<tool_call>\n{DESCRIBE_CALL}\n</tool_call>\n{SCENE}", False),  # a call or the answer
        ("auto", False, DESCRIBE_CALL + DESCRIBE_CALL, False),
        ("auto", False, DESCRIBE_CALL.replace("describe", "paint"), False),
        ("auto", True, f"<tool_call>\n{DESCRIBE_CALL}\n</tool_call>\n<tool_call>\n{DESCRIBE_CALL}\n</tool_call>", True),
        ("required", False, SCENE, False),  # a forced call leaves no answer
        ("required", False, f"<tool_call>\n{DESCRIBE_CALL}\n</tool_call>", True),
    ],
)
def test_the_turn_is_a_call_or_the_answer(engine, choice, parallel, text, valid):
    assert accepts(engine, one_grammar(engine, choice, parallel), text) is valid


WRITING = {
    "large": {"mode": "large"},
    "relay": {"mode": "relay", "verify": "off"},
    "relay-verified": {"mode": "relay", "verify": "greedy"},
    "relay-spec-sampled": {"mode": "relay", "speculative": 3, "temperature": 0.9, "seed": 5},
}


AFTER_RESULT = [
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "describe", "arguments": {"place": "sea", "days": 1}}},
    ]},
    {"role": "tool", "tool_call_id": "c1", "content": "calm and blue"},
]  # fmt: skip


def valid_turn(engine: RelayEngine, after_result: bool, writing: dict[str, Any]) -> str:
    """One turn of the tiny pair under the one grammar, checked: the call or the answer it wrote."""
    messages = [{"role": "user", "content": "Describe the sea."}, *(AFTER_RESULT if after_result else [])]
    response_format = {"type": "json_schema", "json_schema": {"name": "scene", "schema": SCHEMA}}
    settings = merge_settings({"max_new_tokens": 120, **writing})
    request = prepare_chat(messages, settings, [DESCRIBE], response_format=response_format)
    plan = prepare_turn(engine, request).plan
    assert plan.call_tag is None and "| call_body | answer" in plan.settings.grammar  # the one grammar, no opening
    final = list(stream_chat(engine, request))[-1]
    result, parsed = final.result, final.parsed
    assert result.finish_reason == "stop", result.text
    assert accepts(engine, plan.settings.grammar, result.completion_ids)
    assert not parsed.invalid_tool_calls
    if not parsed.tool_calls:
        Scene.model_validate_json(parsed.content)
        return "answer"
    [call] = parsed.tool_calls
    assert call.name == "describe" and parsed.content == ""
    assert call.arguments["place"] in ("sea", "sky") and 0 <= call.arguments["days"] <= 9
    return "call"


@pytest.mark.parametrize("case", WRITING)
@pytest.mark.parametrize("after_result", [False, True], ids=["first-turn", "after-result"])
def test_whatever_the_tiny_pair_writes_is_a_valid_call_or_answer(engine, case, after_result):
    valid_turn(engine, after_result, WRITING[case])


def test_the_tiny_pair_writes_both_and_each_is_valid(engine):
    """Sampled hot, the random pair writes calls (the bare form: the tag is one token in 151k) and answers."""
    writing = {"mode": "relay", "speculative": 3, "temperature": 1.5}
    written = [valid_turn(engine, True, {**writing, "seed": seed}) for seed in range(8)]
    assert set(written) == {"call", "answer"}, written
