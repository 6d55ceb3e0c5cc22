"""RelayChatModel on scripted engines: invoke/stream/async agreement, spans in callbacks, tools, engine sharing."""

from __future__ import annotations

from typing import Any

import pytest
from helpers import chat_engine
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from pydantic import BaseModel

from relaygen_integrations import RelayEngine
from relaygen_integrations.langchain import RelayChatModel, convert_messages

REPLY = "We add two and three. So the answer is five. Then we are done."
RELAYED = "We add two and three. So THE ANSWER IS FIVE. Then we are done."
CALL = '<tool_call>\n{"name": "multiply", "arguments": {"a": 6, "b": 7}}\n</tool_call>'


@tool
def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


@pytest.fixture
def model(tokenizer) -> RelayChatModel:
    return RelayChatModel(engine=chat_engine(tokenizer, REPLY, cues=["So "]), max_tokens=100)


def aggregate(chunks: list) -> AIMessageChunk:
    total = chunks[0]
    for chunk in chunks[1:]:
        total = total + chunk
    return total


def without_timing(spans: list[dict]) -> list[dict]:
    return [{k: v for k, v in span.items() if k != "duration"} for span in spans]


def test_invoke_returns_relayed_text_with_spans_and_usage(model):
    message = model.invoke("Add two and three.")
    assert isinstance(message, AIMessage)
    assert message.content == RELAYED
    meta = message.response_metadata
    assert meta["finish_reason"] == "stop" and meta["model_name"] == "relay(large+small)"
    spans = meta["relaygen"]["spans"]
    assert [(s["model"], s["trigger"]) for s in spans] == [
        ("large", "start"), ("small", "cue:So "), ("large", "sentence_end")
    ]  # fmt: skip
    assert meta["relaygen"]["switches"] == 2 and meta["relaygen"]["small_tokens"] > 0
    usage = message.usage_metadata
    assert usage["output_tokens"] == meta["relaygen"]["large_tokens"] + meta["relaygen"]["small_tokens"]
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]


def test_speculative_setting_reaches_the_engine(tokenizer):
    model = RelayChatModel(engine=chat_engine(tokenizer, REPLY, cues=["So "]), max_tokens=100, speculative=3)
    message = model.invoke("Add two and three.")
    usage = message.response_metadata["relaygen"]["usage"]
    assert message.content == RELAYED and usage["speculative_rounds"] > 0 and usage["draft_tokens"] > 0
    assert model.invoke("Add.", speculative=False).response_metadata["relaygen"]["usage"]["draft_tokens"] == 0


def test_stream_aggregates_to_invoke_and_tags_every_chunk(model):
    invoked = model.invoke("Add two and three.")
    chunks = list(model.stream("Add two and three."))
    total = aggregate(chunks)
    assert total.content == invoked.content
    assert without_timing(total.response_metadata["relaygen"]["spans"]) == without_timing(
        invoked.response_metadata["relaygen"]["spans"]
    )
    assert total.response_metadata["finish_reason"] == "stop"  # a string field set once: never "stopstop"
    assert sum(1 for c in chunks if c.usage_metadata) == 1
    # The same counts, but for the prompt tokens read from the cache: the stream reused the invoke's prompt.
    assert {**total.usage_metadata, "input_token_details": {}} == {**invoked.usage_metadata, "input_token_details": {}}
    cached = total.usage_metadata["input_token_details"]["cache_read"]
    assert cached == total.response_metadata["relaygen"]["usage"]["reused_prefix_tokens"] > 0
    tags = total.response_metadata["relaygen_chunks"]
    assert {t["model"] for t in tags} == {"large", "small"}
    text_chunks = [c for c in chunks if c.content]
    assert len(tags) == len(text_chunks)
    small_text = "".join(
        c.content for c in text_chunks if c.response_metadata["relaygen_chunks"][0]["model"] == "small"
    )
    assert small_text == " THE ANSWER IS FIVE."


async def test_async_paths_agree(model):
    invoked = model.invoke("Add two and three.")
    assert (await model.ainvoke("Add two and three.")).content == invoked.content
    chunks = [c async for c in model.astream("Add two and three.")]
    assert aggregate(chunks).content == invoked.content


def test_streaming_flag_invoke_uses_the_stream(tokenizer):
    model = RelayChatModel(engine=chat_engine(tokenizer, REPLY, cues=["So "]), streaming=True)
    seen: list[str] = []

    class Tokens(BaseCallbackHandler):
        def on_llm_new_token(self, token: str, **kwargs: Any) -> None:
            seen.append(token)

    message = model.invoke("x", config={"callbacks": [Tokens()]})
    assert message.content == RELAYED and "".join(seen) == RELAYED


class SwitchRecorder(BaseCallbackHandler):
    def __init__(self) -> None:
        self.events: list[tuple[str, dict, Any]] = []
        self.llm_run_ids: list[Any] = []

    def on_chat_model_start(self, serialized: Any, messages: Any, *, run_id: Any, **kwargs: Any) -> None:
        self.llm_run_ids.append(run_id)

    def on_custom_event(self, name: str, data: Any, *, run_id: Any, **kwargs: Any) -> None:
        self.events.append((name, data, run_id))


@pytest.mark.parametrize("streaming", [False, True])
def test_switch_events_reach_handlers_of_a_standalone_model(model, streaming):
    recorder = SwitchRecorder()
    invoke = model.stream if streaming else model.invoke
    result = invoke("Add two and three.", config={"callbacks": [recorder]})
    if streaming:
        list(result)
    assert [(n, d["from"], d["to"], d["trigger"]) for n, d, _ in recorder.events] == [
        ("relaygen_switch", "large", "small", "cue:So "),
        ("relaygen_switch", "small", "large", "sentence_end"),
    ]
    assert recorder.events[0][1]["char_offset"] == len("We add two and three. So")
    assert {run_id for _, _, run_id in recorder.events} == set(recorder.llm_run_ids)


async def test_switch_events_in_astream_events_under_the_chat_model_run(model):
    events = [e async for e in model.astream_events("Add two and three.", version="v2")]
    start = next(e for e in events if e["event"] == "on_chat_model_start")
    custom = [e for e in events if e["event"] == "on_custom_event"]
    assert [e["name"] for e in custom] == ["relaygen_switch", "relaygen_switch"]
    assert all(e["run_id"] == start["run_id"] for e in custom)
    streamed = "".join(e["data"]["chunk"].content for e in events if e["event"] == "on_chat_model_stream")
    assert streamed == RELAYED


def test_tool_call_becomes_tool_calls_with_ids(tokenizer):
    model = RelayChatModel(engine=chat_engine(tokenizer, "I will multiply.\n" + CALL)).bind_tools([multiply])
    message = model.invoke("What is 6 times 7?")
    assert message.tool_calls[0]["name"] == "multiply" and message.tool_calls[0]["args"] == {"a": 6, "b": 7}
    assert message.tool_calls[0]["id"].startswith("call_")
    assert message.response_metadata["finish_reason"] == "tool_calls"
    chunks = list(model.stream("What is 6 times 7?"))
    assert any(c.tool_call_chunks for c in chunks)
    total = aggregate(chunks)
    assert [(c["name"], c["args"]) for c in total.tool_calls] == [("multiply", {"a": 6, "b": 7})]
    assert total.content == message.content


def test_malformed_tool_call_is_an_invalid_tool_call(tokenizer):
    """Unconstrained (a grammar would not let the model write it): the parser keeps a broken call as invalid."""
    bad = '<tool_call>\n{"name": "multiply", "arguments": {"a": 6, "b": }}\n</tool_call>'
    model = RelayChatModel(engine=chat_engine(tokenizer, bad), constrain=False).bind_tools([multiply])
    message = model.invoke("What is 6 times 7?")
    assert message.tool_calls == [] and message.invalid_tool_calls[0]["name"] is None
    assert "not valid JSON" in message.invalid_tool_calls[0]["error"]
    streamed = aggregate(list(model.stream("What is 6 times 7?")))
    assert streamed.tool_calls == [] and len(streamed.invalid_tool_calls) == 1


@pytest.mark.parametrize("choice", ["any", "required", "multiply", True])
def test_forced_tool_choice_prefills_the_call(tokenizer, choice):
    engine = chat_engine(tokenizer, CALL)
    model = RelayChatModel(engine=engine, constrain=False).bind_tools([multiply], tool_choice=choice)
    message = model.invoke("Hi there")
    assert [(c["name"], c["args"]) for c in message.tool_calls] == [("multiply", {"a": 6, "b": 7})]
    # The prefill is in the prompt, so the model wrote only what follows it.
    assert message.usage_metadata["output_tokens"] < len(tokenizer.encode(CALL))
    # Constrained (the default), the grammar forces the call instead: the model writes all of it.
    constrained = RelayChatModel(engine=engine).bind_tools([multiply], tool_choice=choice).invoke("Hi there")
    assert [(c["name"], c["args"]) for c in constrained.tool_calls] == [("multiply", {"a": 6, "b": 7})]
    assert constrained.usage_metadata["output_tokens"] == len(tokenizer.encode(CALL))


def test_unknown_tool_choice_fails_at_bind_time(model):
    with pytest.raises(ValueError, match="names no bound tool"):
        model.bind_tools([multiply], tool_choice="divide")


def test_tool_results_go_back_through_the_template(tokenizer):
    call = {"name": "multiply", "args": {"a": 6, "b": 7}, "id": "call_1"}
    history = [
        SystemMessage("Use tools."),
        HumanMessage("What is 6 times 7?"),
        AIMessage("", tool_calls=[call]),
        ToolMessage("42", tool_call_id="call_1"),
    ]
    converted = convert_messages(history)
    assert [m["role"] for m in converted] == ["system", "user", "assistant", "tool"]
    model = RelayChatModel(engine=chat_engine(tokenizer, "The answer is 42.")).bind_tools([multiply])
    assert model.invoke(history).content == "The answer is 42."
    prompt = tokenizer.decode(model.bound.engine.encode_messages(converted, tools=model.kwargs["tools"]))
    assert "<tool_response>\n42\n</tool_response>" in prompt and '"name": "multiply"' in prompt


def test_image_content_is_a_clear_error(model):
    image = HumanMessage(content=[{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}])
    with pytest.raises(ValueError, match="text only"):
        model.invoke([image])


def test_call_settings_override_and_stop(model):
    message = model.invoke("x", stop=["FIVE"])
    assert message.content == "We add two and three. So THE ANSWER IS "
    assert message.response_metadata["finish_reason"] == "stop_sequence"
    assert model.invoke("x", max_tokens=3).response_metadata["finish_reason"] == "length"
    with pytest.raises(TypeError, match="unknown generation setting"):
        model.invoke("x", frequency_penalty=1.0)


def test_construction_is_lazy_and_engines_are_shared(monkeypatch, tokenizer):
    loads: list[tuple] = []

    def fake_from_pretrained(cls, large="demo", small="demo", **kwargs):
        loads.append((large, small))
        return chat_engine(tokenizer, REPLY)

    monkeypatch.setattr(RelayEngine, "from_pretrained", classmethod(fake_from_pretrained))
    monkeypatch.setattr("relaygen_integrations.engine.local.loading._SHARED_PAIRS", {})
    first = RelayChatModel(large="org/big-model", small="org/small-model", temperature=0.0)
    second = RelayChatModel(large="org/big-model", small="org/small-model", max_tokens=32)
    assert loads == []  # constructing never loads weights
    assert first.invoke("x").content == second.invoke("x").content == RELAYED  # 16 tokens: within both budgets
    assert first.engine is second.engine and loads == [("org/big-model", "org/small-model")]
    RelayChatModel(large="org/other", small="org/small-model").invoke("x")
    assert len(loads) == 2


class Answer(BaseModel):
    """The answer to a sum."""

    answer: int
    reason: str


@pytest.mark.parametrize("method", ["json_schema", "json_mode"])
def test_structured_output_as_json(tokenizer, method):
    reply = '{"answer": 5, "reason": "two plus three"}'
    model = RelayChatModel(engine=chat_engine(tokenizer, reply))
    structured = model.with_structured_output(Answer, method=method)
    assert structured.invoke("What is 2 + 3?") == Answer(answer=5, reason="two plus three")
    raw = model.with_structured_output(Answer, method=method, include_raw=True).invoke("What is 2 + 3?")
    assert raw["raw"].content == reply and raw["parsing_error"] is None
    # The "{" prefill is part of the streamed content too.
    assert aggregate(list(model.bind(response_format={"type": "json_object"}).stream("x"))).content == reply


def test_structured_output_by_function_calling(tokenizer):
    reply = '<tool_call>\n{"name": "Answer", "arguments": {"answer": 5, "reason": "sum"}}\n</tool_call>'
    model = RelayChatModel(engine=chat_engine(tokenizer, reply))
    assert model.with_structured_output(Answer).invoke("What is 2 + 3?") == Answer(answer=5, reason="sum")
    dict_schema = model.with_structured_output(Answer.model_json_schema() | {"title": "Answer"})
    assert dict_schema.invoke("What is 2 + 3?") == {"answer": 5, "reason": "sum"}


@pytest.mark.parametrize(
    ("choice", "prefix"),
    [
        ("any", '<tool_call>\n{"name": "'),
        ("multiply", '<tool_call>\n{"name": "multiply", "arguments": {'),
        ("auto", None),
    ],
)
def test_forced_call_prefill_runs_into_the_json(tokenizer, choice, prefix):
    # The 1.5B demo model stops at once after a bare "<tool_call>\n" and writes a bare number as the arguments of a
    # call forced by name: the prefill runs on into the call's JSON (the name, or the arguments' opening brace).
    model = RelayChatModel(engine=chat_engine(tokenizer, CALL))
    tools = model.bind_tools([multiply]).kwargs["tools"]
    request = model._request([HumanMessage("What is 6 times 7?")], None, {"tools": tools, "tool_choice": choice})
    assert request.prefix == prefix
    if prefix is not None:
        message = model.bind_tools([multiply], tool_choice=choice).invoke("What is 6 times 7?")
        assert [(c["name"], c["args"]) for c in message.tool_calls] == [("multiply", {"a": 6, "b": 7})]


def test_tool_use_blocks_in_ai_content_are_skipped():
    call = {"name": "multiply", "args": {"a": 6, "b": 7}, "id": "call_1"}
    ai = AIMessage(
        [{"type": "text", "text": "Let me multiply."}, {"type": "tool_use", "id": "call_1", "name": "multiply",
         "input": {"a": 6, "b": 7}}],
        tool_calls=[call],
    )  # fmt: skip
    converted = convert_messages([HumanMessage("6 * 7?"), ai, ToolMessage("42", tool_call_id="call_1")])
    assert converted[1]["content"] == "Let me multiply."
    assert converted[1]["tool_calls"][0]["function"] == {"name": "multiply", "arguments": {"a": 6, "b": 7}}
    with pytest.raises(ValueError, match="text only"):  # a user's image is still refused
        convert_messages([HumanMessage([{"type": "image", "url": "https://example.com/x.png"}])])


def test_text_blocks_and_the_developer_role_give_the_plain_prompt(tokenizer):
    from langchain_core.messages import ChatMessage

    from relaygen_integrations.engine.core.prompt import render_prompt_ids

    plain = convert_messages([SystemMessage("Be brief."), HumanMessage("hi\nthere")])
    blocks = convert_messages(
        [
            ChatMessage(role="developer", content=[{"type": "text", "text": "Be brief."}]),
            HumanMessage([{"type": "text", "text": "hi"}, {"type": "text", "text": "there"}]),
        ]
    )
    assert render_prompt_ids(tokenizer, blocks) == render_prompt_ids(tokenizer, plain)


def test_fenced_json_call_with_auto_tool_choice(tokenizer):
    """Qwen2.5-Coder-1.5B writes optional calls as a fenced JSON block; with tools bound that is a tool call."""
    reply = 'Let me compute.\n```json\n{"name": "multiply", "arguments": {"a": 6, "b": 7}}\n```'
    model = RelayChatModel(engine=chat_engine(tokenizer, reply)).bind_tools([multiply])
    message = model.invoke("What is 6 times 7?")
    assert [(c["name"], c["args"]) for c in message.tool_calls] == [("multiply", {"a": 6, "b": 7})]
    streamed = aggregate(list(model.stream("What is 6 times 7?")))
    assert streamed.content == message.content == "Let me compute.\n"
    assert [c["name"] for c in streamed.tool_calls] == ["multiply"]
    # Without tools the same text is just text.
    plain = RelayChatModel(engine=chat_engine(tokenizer, reply)).invoke("What is 6 times 7?")
    assert plain.content == reply and plain.tool_calls == []


def test_a_string_stop_is_one_stop_sequence_in_every_path(model):
    """stop="FIVE" is one stop sequence - as an invoke/stream/ainvoke argument, through bind, as the field - never
    its letters (which would end the text at the first "F", "I", "V" or "E")."""
    expected = "We add two and three. So THE ANSWER IS "
    assert model.invoke("x", stop="FIVE").content == expected
    assert "".join(chunk.content for chunk in model.stream("x", stop="FIVE")) == expected
    assert model.bind(stop="FIVE").invoke("x").content == expected
    fielded = RelayChatModel(engine=model.engine, max_tokens=100, stop="FIVE")
    assert fielded.stop == ["FIVE"] and fielded.invoke("x").content == expected
    with pytest.raises(TypeError, match="stop=5"):
        model.invoke("x", stop=5)


async def test_a_string_stop_is_one_stop_sequence_async(model):
    assert (await model.ainvoke("x", stop="FIVE")).content == "We add two and three. So THE ANSWER IS "


@pytest.mark.parametrize("choice", ["any", "required", True])
def test_forcing_a_tool_call_without_tools_fails_at_bind_time(model, choice):
    with pytest.raises(ValueError, match="no tools are bound"):
        model.bind_tools([], tool_choice=choice)
    with pytest.raises(ValueError, match="no tools are bound"):
        model.invoke("x", tool_choice=choice)
