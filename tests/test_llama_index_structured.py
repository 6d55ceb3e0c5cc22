"""LlamaIndex structured output under the JSON grammar, on the tiny random-weight pair: ``structured_predict`` (sync,
async, streamed), ``as_structured_llm`` and a chat's ``response_format`` answer with one object under the schema.
A random pair writes such an object only because the grammar leaves it nothing else: the tests fail without it.
With tools bound as well, the turn is a call or the answer (``test_tools_with_format.py``)."""

from __future__ import annotations

import json
from typing import Literal

import pytest
from helpers import chat_engine
from llama_index.core.base.llms.types import ChatMessage, MessageRole, ToolCallBlock
from llama_index.core.instrumentation.events.llm import (
    LLMChatEndEvent,
    LLMStructuredPredictEndEvent,
    LLMStructuredPredictStartEvent,
)
from llama_index.core.prompts import PromptTemplate
from llama_index.core.tools import FunctionTool
from pydantic import BaseModel, Field

from relaygen_integrations import RelayEngine
from relaygen_integrations.engine.core.settings import SettingsError
from relaygen_integrations.llama_index import RelayLLM
from relaygen_integrations.llama_index.structured import schema_format


class Tally(BaseModel):
    """Every value bounded, so that a random model finishes the object."""

    kind: Literal["apples", "pears"]
    count: int = Field(ge=0, le=99)
    note: str = Field(max_length=6)


PROMPT = PromptTemplate("Count the {fruit}.")
USER = [ChatMessage(role=MessageRole.USER, content="Count the apples.")]


@pytest.fixture(scope="module")
def llm(tokenizer, pair) -> RelayLLM:
    # Cues are words of the answer: the small model takes over inside the JSON.
    engine = RelayEngine.from_models(
        pair[0], pair[1], tokenizer, cues=["apples", "pears", "kind"],
        policy={"min_large_tokens": 1, "max_small_tokens": 10},
    )  # fmt: skip
    return RelayLLM(engine=engine, max_tokens=80)


def test_structured_predict_answers_under_the_schema(llm, collector):
    result = llm.structured_predict(Tally, PROMPT, fruit="apples")
    assert isinstance(result, Tally)
    # The chat behind it answered with the object itself, not with a forced call of a tool built from the class
    # (LlamaIndex's FunctionCallingProgram, still there with PydanticProgramMode.FUNCTION).
    [end] = collector.of(LLMChatEndEvent)
    assert Tally.model_validate_json(end.response.message.content) == result
    assert not any(isinstance(block, ToolCallBlock) for block in end.response.message.blocks)
    assert [type(e) for e in collector.events if "StructuredPredict" in type(e).__name__] == [
        LLMStructuredPredictStartEvent, LLMStructuredPredictEndEvent
    ]  # fmt: skip


async def test_async_and_streamed_structured_predict(llm):
    whole = await llm.astructured_predict(Tally, PROMPT, fruit="pears")
    partials = list(llm.stream_structured_predict(Tally, PROMPT, fruit="pears"))
    assert len(partials) > 3 and partials[-1] == whole  # partial objects as the JSON streams, then the whole
    stream = await llm.astream_structured_predict(Tally, PROMPT, fruit="pears")
    assert [item async for item in stream][-1] == whole


def test_as_structured_llm_chats_and_streams_the_object(llm):
    structured = llm.as_structured_llm(Tally)
    response = structured.chat(USER)
    assert isinstance(response.raw, Tally) and Tally.model_validate_json(response.message.content) == response.raw
    streamed = list(structured.stream_chat(USER))
    assert streamed[-1].raw == response.raw


def test_a_chat_takes_a_response_format(llm, tokenizer):
    response = llm.chat(USER, response_format=schema_format(Tally))
    Tally.model_validate_json(response.message.content)
    # JSON mode on a scripted model (a random one would write keys until its budget ends): the grammar lets the
    # object through, and the system message asks for it.
    scripted = RelayLLM(engine=chat_engine(tokenizer, '{"apples": [1, 2]}', cues=["Zq"]), max_tokens=40)
    answer = scripted.chat(USER, response_format={"type": "json_object"})
    assert json.loads(answer.message.content) == {"apples": [1, 2]}


def test_complete_refuses_a_response_format(llm):
    with pytest.raises(SettingsError) as caught:
        llm.complete("Count the apples.", response_format={"type": "json_object"})
    assert caught.value.field == "response_format"


def count_fruit(kind: str) -> int:
    """How many pieces of a fruit there are."""
    return 7


def test_tools_with_a_response_format_give_a_call_then_the_answer(tokenizer):
    """``chat_with_tools`` with a response format: the bare call the model writes is a tool call, and the turn after
    the tool's result is the schema's object."""
    answer = '{"kind": "apples", "count": 7, "note": "fresh"}'
    call = '{"name": "count_fruit", "arguments": {"kind": "apples"}}'
    llm = RelayLLM(engine=chat_engine(tokenizer, call, cues=["Zq"], after_result=answer), max_tokens=60)
    tool = FunctionTool.from_defaults(fn=count_fruit)
    first = llm.chat_with_tools([tool], user_msg="How many apples?", response_format=schema_format(Tally))
    [selection] = llm.get_tool_calls_from_response(first)
    assert (selection.tool_name, selection.tool_kwargs) == ("count_fruit", {"kind": "apples"})
    assert not first.message.content
    result = ChatMessage(role=MessageRole.TOOL, content="7", additional_kwargs={"tool_call_id": selection.tool_id})
    history = [ChatMessage(role=MessageRole.USER, content="How many apples?"), first.message, result]
    second = llm.chat_with_tools([tool], chat_history=history, response_format=schema_format(Tally))
    assert not any(isinstance(block, ToolCallBlock) for block in second.message.blocks)
    assert Tally.model_validate_json(second.message.content) == Tally(kind="apples", count=7, note="fresh")
