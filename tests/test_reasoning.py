"""Reasoning told apart from the answer on a thinking pair (``reasoning_format``, ``chat/reasoning.py``), and the
framework conventions around it: LangChain reasoning content blocks, v1 output, usage details, the model profile and
``model_provider``; LlamaIndex ``ThinkingBlock`` and ``thinking_delta``; the server's ``reasoning_content``.

A scripted thinking pair writes ``<think>...</think>`` then the answer (its policy's reasoning end: ``</think>``); a
tiny random-weight pair under a chat template whose generation prompt opens ``<think>`` never closes it.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from fastapi.testclient import TestClient
from helpers import PROMPT, ScriptedLM, tiny_qwen2
from langchain_core.messages import AIMessage, HumanMessage
from llama_index.core.base.llms.types import ChatMessage, TextBlock, ThinkingBlock

from relaygen_integrations import RelayEngine
from relaygen_integrations.chat.relay_chat import prepare_chat, stream_chat
from relaygen_integrations.engine.core.settings import SettingsError, merge_settings
from relaygen_integrations.langchain import RelayChatModel, convert_messages
from relaygen_integrations.llama_index import RelayLLM
from relaygen_integrations.llama_index.messages import to_relay_messages
from relaygen_integrations.serve.app import create_app

REASONING = "We add 2 and 3. So the sum is 5."
ANSWER = "The answer is 5."
REPLY = f"<think>\n{REASONING}\n</think>\n\n{ANSWER}"
CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
    },
}


def thinking_engine(tokenizer, reply: str = REPLY) -> RelayEngine:
    """Both models write ``reply`` (the small one writes the answer after ``</think>``, as relay has it)."""
    large, small = ScriptedLM(tokenizer, reply), ScriptedLM(tokenizer, reply)
    return RelayEngine.from_models(large, small, tokenizer, cues=["So"], policy={"reasoning_end": "</think>"})  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def engine(tokenizer) -> RelayEngine:
    return thinking_engine(tokenizer)


def reasoning_tokens(engine: RelayEngine) -> int:
    """The completion tokens up to the answer: the reasoning, the end marker and the blank line after it."""
    ids = engine.tokenizer.encode(REPLY.removesuffix(ANSWER), add_special_tokens=False)
    return len(ids)


# -- the chat layer -----------------------------------------------------------------------------------------------
def test_the_chat_layer_splits_reasoning_from_the_answer_and_spans_cover_every_character(engine):
    deltas = list(stream_chat(engine, prepare_chat(PROMPT, merge_settings({"max_new_tokens": 64}))))
    final = deltas[-1]
    assert final.parsed.reasoning.strip() == REASONING and final.parsed.content == ANSWER
    assert "".join(d.reasoning for d in deltas) == final.parsed.reasoning
    assert "".join(d.text for d in deltas) == ANSWER
    result = final.result
    assert result.text == REPLY and "".join(span.text for span in result.spans) == REPLY  # spans index the whole text
    assert {span.model for span in result.spans} == {"large", "small"}  # relay ran: cue, sentence end, answer
    assert final.parsed.reasoning_tokens == reasoning_tokens(engine)


@pytest.mark.parametrize("fmt", ["inline", None])
def test_inline_keeps_the_whole_text_and_is_the_default_without_a_reasoning_end(tokenizer, engine, fmt):
    plain = RelayEngine.from_models(ScriptedLM(tokenizer, REPLY), ScriptedLM(tokenizer, REPLY), tokenizer, cues=["So"])  # type: ignore[arg-type]
    chosen = engine if fmt == "inline" else plain  # None on a pair without a reasoning end: inline
    settings = merge_settings({"max_new_tokens": 64, "reasoning_format": fmt})
    final = list(stream_chat(chosen, prepare_chat(PROMPT, settings)))[-1]
    assert final.parsed.content == REPLY and final.parsed.reasoning is None


def test_separate_on_a_pair_without_a_reasoning_end_is_refused_naming_the_field(tokenizer):
    plain = RelayEngine.from_models(ScriptedLM(tokenizer, REPLY), None, tokenizer, mode="large")  # type: ignore[arg-type]
    with pytest.raises(SettingsError) as refused:
        list(stream_chat(plain, prepare_chat(PROMPT, merge_settings({"reasoning_format": "separate"}))))
    assert refused.value.field == "reasoning_format"


def test_a_template_that_opens_the_reasoning_puts_unfinished_output_in_the_reasoning(tokenizer):
    """A tiny random-weight pair under a template whose generation prompt ends with ``<think>``: the output never
    closes it, so all of it is reasoning (and all its tokens reasoning tokens) and the answer is empty."""
    from transformers import AutoTokenizer

    thinking = AutoTokenizer.from_pretrained(tokenizer.name_or_path)
    thinking.chat_template = thinking.chat_template.replace(
        "{{- '<|im_start|>assistant\\n' }}", "{{- '<|im_start|>assistant\\n<think>\\n' }}"
    )
    assert thinking.apply_chat_template(PROMPT, tokenize=False, add_generation_prompt=True).endswith("<think>\n")
    pair = tiny_qwen2(thinking, seed=1, hidden=32, layers=1), tiny_qwen2(thinking, seed=2, hidden=32, layers=1)
    engine = RelayEngine.from_models(*pair, thinking, cues=["the"], policy={"reasoning_end": "</think>"})
    model = RelayChatModel(engine=engine, max_tokens=12)
    message = model.invoke(PROMPT[0]["content"])
    text = engine.generate(PROMPT, max_new_tokens=12).text
    assert message.content == "" and message.additional_kwargs["reasoning_content"] == text
    assert message.usage_metadata["output_token_details"]["reasoning"] == message.usage_metadata["output_tokens"]

    async def astream():
        chunks = [chunk async for chunk in model.astream(PROMPT[0]["content"])]
        return "".join(c.additional_kwargs.get("reasoning_content", "") for c in chunks), "".join(
            c.text for c in chunks
        )

    assert asyncio.run(astream()) == (text, "")
    llm = RelayLLM(engine=engine, max_tokens=12)
    response = llm.chat([ChatMessage(role="user", content=PROMPT[0]["content"])])
    assert isinstance(response.message.blocks[0], ThinkingBlock) and response.message.blocks[0].content == text
    assert not response.message.content
    deltas = list(llm.stream_chat([ChatMessage(role="user", content=PROMPT[0]["content"])]))
    assert "".join(d.additional_kwargs.get("thinking_delta", "") for d in deltas) == text


# -- LangChain ------------------------------------------------------------------------------------------------------
def check_langchain_message(message, engine) -> None:
    assert message.content == ANSWER
    assert message.additional_kwargs["reasoning_content"].strip() == REASONING
    blocks = message.content_blocks
    assert blocks[0]["type"] == "reasoning" and blocks[0]["reasoning"].strip() == REASONING
    assert [b["text"] for b in blocks if b["type"] == "text"] == [ANSWER]
    usage = message.usage_metadata
    assert usage["output_token_details"]["reasoning"] == reasoning_tokens(engine)
    assert usage["input_token_details"]["cache_read"] >= 0
    assert message.response_metadata["model_provider"] == "relaygen"


def test_langchain_invoke_stream_and_async_carry_reasoning_blocks(engine):
    model = RelayChatModel(engine=engine, max_tokens=64)
    check_langchain_message(model.invoke("Add 2 and 3."), engine)
    merged = None
    for chunk in model.stream("Add 2 and 3."):
        merged = chunk if merged is None else merged + chunk
    check_langchain_message(merged, engine)

    async def run():
        message = await model.ainvoke("Add 2 and 3.")
        chunks = [chunk async for chunk in model.astream("Add 2 and 3.")]
        total = chunks[0]
        for chunk in chunks[1:]:
            total = total + chunk
        return message, total

    for message in asyncio.run(run()):
        check_langchain_message(message, engine)


def test_langchain_v1_output_carries_standard_reasoning_blocks(engine):
    message = RelayChatModel(engine=engine, max_tokens=64, output_version="v1").invoke("Add 2 and 3.")
    kinds = [block["type"] for block in message.content]
    assert kinds[0] == "reasoning" and "text" in kinds
    assert message.content[0]["reasoning"].strip() == REASONING


def test_langchain_history_round_trips_the_reasoning(engine):
    message = RelayChatModel(engine=engine, max_tokens=64).invoke("Add 2 and 3.")
    converted = convert_messages([HumanMessage("Add 2 and 3."), message])[-1]
    assert (
        converted["content"] == ANSWER
        and converted["reasoning_content"] == message.additional_kwargs["reasoning_content"]
    )
    v1 = AIMessage(content=[{"type": "reasoning", "reasoning": "Think."}, {"type": "text", "text": "Done."}])
    assert convert_messages([v1])[0] == {"role": "assistant", "content": "Done.", "reasoning_content": "Think."}


def test_a_tool_call_after_the_reasoning_still_parses(tokenizer):
    engine = thinking_engine(tokenizer, f"<think>\n{REASONING}\n</think>\n\n{CALL}")
    message = RelayChatModel(engine=engine, max_tokens=80).bind_tools([ADD]).invoke("Add 2 and 3.")
    assert message.tool_calls[0]["name"] == "add" and message.tool_calls[0]["args"] == {"a": 2, "b": 3}
    assert message.additional_kwargs["reasoning_content"].strip() == REASONING and message.content == ""


def test_the_profile_comes_from_the_pair_without_loading_weights(engine):
    profile = RelayChatModel(engine=engine).profile
    assert profile["max_input_tokens"] == engine.context_window and profile["reasoning_output"] is True
    assert profile["tool_calling"] and profile["structured_output"]
    unloaded = RelayChatModel()  # the demo pair: read from its config files (or None when not fetched)
    assert unloaded._engine is None
    if unloaded.profile is not None:
        assert unloaded.profile["max_input_tokens"] > 0 and unloaded.profile["reasoning_output"] is False


def test_create_agent_with_fractional_summarization_runs(engine):
    from langchain.agents import create_agent
    from langchain.agents.middleware import SummarizationMiddleware

    model = RelayChatModel(engine=engine, max_tokens=64)
    agent = create_agent(model, tools=[], middleware=[SummarizationMiddleware(model, trigger=("fraction", 0.5))])
    state = agent.invoke({"messages": [HumanMessage("Add 2 and 3.")]})
    assert state["messages"][-1].content == ANSWER


def test_speculation_and_verification_counts_reach_the_metadata(engine):
    message = RelayChatModel(engine=engine, max_tokens=64, speculative=3, verify="greedy").invoke("Add 2 and 3.")
    relay = message.response_metadata["relaygen"]
    usage = relay["usage"]
    assert relay["speculation"] == {
        "rounds": usage["speculative_rounds"], "drafted": usage["draft_tokens"],
        "accepted": usage["accepted_draft_tokens"],
        "acceptance_rate": round(usage["accepted_draft_tokens"] / usage["draft_tokens"], 4),
        "copied": usage["lookup_draft_tokens"], "copied_accepted": usage["lookup_accepted_tokens"],
    }  # fmt: skip
    assert relay["speculation"]["drafted"] > 0
    assert relay["verification"]["checked"] == usage["verified_tokens"] + usage["rejected_tokens"] > 0


# -- LlamaIndex ----------------------------------------------------------------------------------------------------
def check_llama_response(response) -> None:
    blocks = response.message.blocks
    assert isinstance(blocks[0], ThinkingBlock) and blocks[0].content.strip() == REASONING
    assert response.message.content == ANSWER


def test_llama_index_chat_stream_and_async_carry_thinking(engine):
    llm = RelayLLM(engine=engine, max_tokens=64)
    messages = [ChatMessage(role="user", content="Add 2 and 3.")]
    check_llama_response(llm.chat(messages))
    deltas = list(llm.stream_chat(messages))
    thinking = "".join(d.additional_kwargs.get("thinking_delta", "") for d in deltas)
    assert thinking.strip() == REASONING and "".join(d.delta or "" for d in deltas) == ANSWER
    check_llama_response(deltas[-1])

    async def run():
        response = await llm.achat(messages)
        streamed = [d async for d in await llm.astream_chat(messages)]
        return response, streamed

    response, streamed = asyncio.run(run())
    check_llama_response(response)
    assert "".join(d.additional_kwargs.get("thinking_delta", "") for d in streamed) == thinking


def test_llama_index_history_round_trips_the_thinking(engine):
    response = RelayLLM(engine=engine, max_tokens=64).chat([ChatMessage(role="user", content="Add 2 and 3.")])
    converted = to_relay_messages([ChatMessage(role="user", content="Add 2 and 3."), response.message])[-1]
    assert converted["content"] == ANSWER and converted["reasoning_content"].strip() == REASONING
    given = ChatMessage(role="assistant", blocks=[ThinkingBlock(content="Think."), TextBlock(text="Done.")])
    assert to_relay_messages([given])[0] == {"role": "assistant", "content": "Done.", "reasoning_content": "Think."}


# -- relaygen serve --------------------------------------------------------------------------------------------------
def test_the_server_returns_reasoning_content_streaming_and_not(engine):
    with TestClient(create_app(engine)) as client:
        body = {"messages": PROMPT, "max_tokens": 64}
        message = client.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]
        assert message["content"] == ANSWER and message["reasoning_content"].strip() == REASONING
        stream = client.post("/v1/chat/completions", json={**body, "stream": True}).text
        chunks = [json.loads(line[6:]) for line in stream.splitlines() if line.startswith("data: {")]
        deltas = [c["choices"][0]["delta"] for c in chunks if c.get("choices")]
        assert "".join(d.get("reasoning_content", "") for d in deltas) == message["reasoning_content"]
        assert "".join(d.get("content") or "" for d in deltas) == ANSWER
