"""``stream_events(version="v3")``, langchain-core 1.8's content-block protocol (``ChatModelStream``), on the tiny
random-weight pair: a plain pair and a thinking pair (``thinking_templates.SWITCH``, thinking on).

``.text``, ``.reasoning`` and ``.tool_calls`` must equal what ``invoke`` returns, and the relay must stay readable:
which model wrote each chunk (``relaygen_chunks``, merged in order as ``stream()`` merges it), the spans with every
switch's trigger, and the ``relaygen_switch`` events reaching the run's callback handlers as they happen. A grammar
makes the random-weight models write switch cues, sentence ends and a closed reasoning block, so the relay really
switches and the thinking pair really answers (each token is still the models' pick under the grammar's mask).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from thinking_templates import SWITCH, templated

from relaygen_integrations import RelayEngine
from relaygen_integrations.langchain import SWITCH_EVENT, RelayChatModel

# The v3 entry points are beta in langchain-core 1.8 and say so on each call.
pytestmark = pytest.mark.filterwarnings("ignore::langchain_core._api.beta_decorator.LangChainBetaWarning")
QUESTION = "Solve it."
# Two cue sentences (the small model writes on after each "So" to the sentence end), then an answer.
CUED = 'start: "So the " /[a-z]{2,6}/ ". So a " /[a-z]{2,6}/ ". Done."'
THOUGHT = 'start: "So we " /[a-z]{2,6}/ ". So it " /[a-z]{2,6}/ ".\\n</think>\\n\\n" "It is " /[a-z]{2,6}/ "."'
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}


class Switches(BaseCallbackHandler):
    """Records the relay's switch events as callback handlers receive them."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []

    def on_custom_event(self, name: str, data: Any, **_: Any) -> None:
        if name == SWITCH_EVENT:
            self.seen.append(data)


@pytest.fixture(scope="module")
def plain(tokenizer, pair) -> RelayEngine:
    return RelayEngine.from_models(*pair, tokenizer, cues=["So"])


@pytest.fixture(scope="module")
def thinking(tokenizer, pair) -> RelayEngine:
    return RelayEngine.from_models(
        *pair, templated(tokenizer, SWITCH), cues=["So"], policy={"reasoning_end": "</think>"}
    )


def merged_stream(model: RelayChatModel, **kwargs: Any) -> Any:
    total = None
    for chunk in model.stream(QUESTION, **kwargs):
        total = chunk if total is None else total + chunk
    return total


def test_plain_pair_text_and_metadata_as_invoke_and_stream_give_them(plain):
    model = RelayChatModel(engine=plain, max_tokens=12, logprobs=True)
    stream = model.stream_events(QUESTION, version="v3")
    events = list(stream)
    invoked, streamed = model.invoke(QUESTION), merged_stream(model)
    deltas = list(stream.text)
    assert invoked.content and stream.text.get() == "".join(deltas) == invoked.content
    assert stream.reasoning.get() == "" and stream.tool_calls.get() == []
    assert events[0]["event"] == "message-start"
    assert events[0]["metadata"] == {"provider": "relaygen", "model": model.model_name}  # named from the start
    output = stream.output
    assert output.usage_metadata["output_tokens"] == invoked.usage_metadata["output_tokens"]
    metadata = output.response_metadata
    assert (
        metadata["model_provider"] == "relaygen"
        and metadata["finish_reason"] == invoked.response_metadata["finish_reason"]
    )
    # merged as stream() merges chunks: one model tag per chunk, every token's log probability
    assert metadata["relaygen_chunks"] == streamed.response_metadata["relaygen_chunks"]
    assert len(metadata["relaygen_chunks"]) == len(deltas) > 1
    tokens = [entry["token"] for entry in metadata["logprobs"]["content"]]
    assert tokens == [entry["token"] for entry in invoked.response_metadata["logprobs"]["content"]]
    assert len(tokens) == invoked.usage_metadata["output_tokens"]


def test_relay_switches_are_reachable_from_the_v3_stream(plain):
    model = RelayChatModel(engine=plain, max_tokens=40, grammar=CUED)
    handler = Switches()
    stream = model.stream_events(QUESTION, version="v3", config={"callbacks": [handler]})
    text_deltas = [e["delta"]["text"] for e in stream if e["event"] == "content-block-delta"]
    relay = stream.output.response_metadata["relaygen"]
    assert relay["switches"] >= 2 and len(handler.seen) == relay["switches"]  # live, one event per switch
    assert [s["trigger"] for s in handler.seen] == [span["trigger"] for span in relay["spans"][1:]]
    # which model wrote each delta: the tags pair with the deltas, and give back each model's spans
    tags = stream.output.response_metadata["relaygen_chunks"]
    assert len(tags) == len(text_deltas)
    for role in ("large", "small"):
        written = "".join(text for text, tag in zip(text_deltas, tags, strict=True) if tag["model"] == role)
        assert written == "".join(span["text"] for span in relay["spans"] if span["model"] == role) != ""
    assert stream.text.get() == "".join(span["text"] for span in relay["spans"]) == model.invoke(QUESTION).content


def test_thinking_pair_reasoning_and_text_sync_and_async(thinking):
    model = RelayChatModel(engine=thinking, max_tokens=60, grammar=THOUGHT)
    invoked = model.invoke(QUESTION)
    reasoning, answer = invoked.additional_kwargs["reasoning_content"], invoked.content
    assert reasoning.startswith("So we ") and answer.startswith("It is ")
    stream = model.stream_events(QUESTION, version="v3")
    assert (stream.reasoning.get(), stream.text.get()) == (reasoning, answer)
    output = stream.output
    assert [block["type"] for block in output.content] == ["reasoning", "text"]
    assert output.usage_metadata["output_token_details"] == invoked.usage_metadata["output_token_details"]
    assert {tag["model"] for tag in output.response_metadata["relaygen_chunks"]} == {"large", "small"}

    async def run() -> tuple[str, str, Any]:
        handler = Switches()
        astream = await model.astream_events(QUESTION, version="v3", config={"callbacks": [handler]})
        text, thought = await astream.text, await astream.reasoning
        return text, thought, (await astream, handler)

    text, thought, (message, handler) = asyncio.run(run())
    assert (thought, text) == (reasoning, answer)
    assert message.response_metadata["relaygen_chunks"] == output.response_metadata["relaygen_chunks"]
    assert len(handler.seen) == message.response_metadata["relaygen"]["switches"] >= 2


def test_tool_calls_come_out_of_the_v3_stream(plain):
    model = RelayChatModel(engine=plain, max_tokens=40).bind_tools([ADD], tool_choice="required")
    invoked = model.invoke("Add 2 and 3.")
    assert [call["name"] for call in invoked.tool_calls] == ["add"]
    stream = model.stream_events("Add 2 and 3.", version="v3")
    calls = stream.tool_calls.get()
    assert [(call["name"], call["args"]) for call in calls] == [(c["name"], c["args"]) for c in invoked.tool_calls]
    assert set(calls[0]["args"]) == {"a", "b"} and all(isinstance(v, int) for v in calls[0]["args"].values())
    output = stream.output
    assert (
        output.tool_calls[0]["args"] == calls[0]["args"] and output.response_metadata["finish_reason"] == "tool_calls"
    )
