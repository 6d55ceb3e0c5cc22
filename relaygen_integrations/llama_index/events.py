"""LlamaIndex responses and instrumentation events from a relay generation's stream.

``RelaySwitchEvent`` is dispatched at every change of writer; ``ChatTurn`` and ``CompletionTurn`` turn the chat
layer's deltas / the engine's events into streamed ChatResponses / CompletionResponses and the final one, whose
``raw`` carries the engine's exact token usage.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence
from typing import Any

from llama_index.core.base.llms.types import ChatResponse, CompletionResponse, LogProb
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.events.base import BaseEvent

from ..chat.relay_chat import ChatDelta
from ..chat.tool_calls import ParsedOutput, ToolCall
from ..engine.core.spans import (
    FinalEvent,
    RelayResult,
    StreamEvent,
    SwitchEvent,
    TextEvent,
    TokenLogprob,
    token_bytes,
)
from .messages import assistant_message

dispatcher = get_dispatcher(__name__)


class RelaySwitchEvent(BaseEvent):
    """The writer of a relay generation changed (large -> small at a cue, small -> large at a sentence end, ...).

    Dispatched with the span id of the LLM call that produced it, so span handlers can attach it to that call.
    """

    from_model: str
    to_model: str
    trigger: str
    char_offset: int
    span_index: int

    @classmethod
    def class_name(cls) -> str:
        return "RelaySwitchEvent"


# -- responses ----------------------------------------------------------------------------------------------------
def _raw(result: RelayResult) -> dict[str, Any]:
    """``raw["usage"]`` carries prompt/completion/total tokens under the names TokenCountingHandler reads, so it
    counts the engine's exact numbers instead of re-tokenizing with its own tokenizer."""
    configuration = {"configuration": result.configuration} if result.configuration is not None else {}
    return {"usage": result.usage.to_dict(), "finish_reason": result.finish_reason} | configuration


def _logprobs(entries: Sequence[TokenLogprob] | None) -> list[list[LogProb]] | None:
    """LlamaIndex's ``logprobs``: one list per token, the kept token first, then the ``top_logprobs`` most likely
    tokens other than it (which model wrote each token: ``additional_kwargs["relaygen"]["spans"]``)."""
    if entries is None:
        return None
    return [
        [
            LogProb(token=entry.token, logprob=entry.logprob, bytes=token_bytes(entry.token)),
            *(
                LogProb(token=text, logprob=value, bytes=token_bytes(text))
                for token_id, text, value in entry.top
                if token_id != entry.token_id
            ),
        ]
        for entry in entries
    ]


def _delta_tags(model: str | None, span_index: int) -> dict[str, Any]:
    return {"relaygen_model": model, "relaygen_span": span_index}


def _switch_json(switch: SwitchEvent) -> dict[str, Any]:
    return {
        "from_model": switch.from_model,
        "to_model": switch.to_model,
        "trigger": switch.trigger,
        "char_offset": switch.char_offset,
        "span_index": switch.span_index,
    }


def _dispatch_switch(switch: SwitchEvent, span_id: str | None) -> None:
    # The span id is captured when the call starts: a stream is consumed after the call's span has been exited,
    # so the active span at consumption time belongs to the consumer, not to this LLM call.
    dispatcher.event(RelaySwitchEvent(**_switch_json(switch), span_id=span_id))


class ChatTurn:
    """Turns one turn's ChatDeltas into ChatResponses (streamed deltas, then the final response)."""

    def __init__(self, span_id: str | None, emit_deltas: bool = True) -> None:
        self.span_id = span_id
        self.emit_deltas = emit_deltas
        self.content = ""
        self.thinking = ""
        self.calls: list[ToolCall] = []

    def on_delta(self, delta: ChatDelta) -> ChatResponse | None:
        if delta.switch is not None:
            _dispatch_switch(delta.switch, self.span_id)
            if not self.emit_deltas:
                return None
            # Also in the stream itself, as an empty delta whose raw names the switch: agents copy each streamed
            # response's raw into their AgentStream events, so a workflow's event stream shows who writes.
            switch = delta.switch
            return ChatResponse(
                message=assistant_message(self.content, self.calls, reasoning=self.thinking),
                delta="",
                raw={"relaygen_switch": _switch_json(switch)},
                additional_kwargs=_delta_tags(switch.to_model, switch.span_index),
            )
        if delta.result is not None:
            parsed = delta.parsed or ParsedOutput(content=self.content, tool_calls=self.calls)
            return ChatResponse(
                message=assistant_message(
                    parsed.content, parsed.tool_calls, parsed.invalid_tool_calls, parsed.reasoning
                ),
                delta="" if self.emit_deltas else None,
                raw=_raw(delta.result),
                logprobs=_logprobs(delta.result.logprobs),
                additional_kwargs={"relaygen": delta.result.relay_metadata()},
            )
        if delta.reasoning:  # LlamaIndex's convention for streamed thinking (agents show it as it comes)
            self.thinking += delta.reasoning
            if not self.emit_deltas:
                return None
            return ChatResponse(
                message=assistant_message(self.content, self.calls, reasoning=self.thinking),
                delta="",
                logprobs=_logprobs(delta.logprobs) if delta.logprobs else None,
                additional_kwargs={"thinking_delta": delta.reasoning, **_delta_tags(delta.model, delta.span_index)},
            )
        if isinstance(delta.tool_call, ToolCall):
            self.calls.append(delta.tool_call)
            text = ""
        elif delta.text or delta.logprobs:
            self.content += delta.text
            text = delta.text
        else:
            return None  # an invalid tool call: it is reported on the final response
        if not self.emit_deltas:
            return None
        return ChatResponse(
            message=assistant_message(self.content, self.calls, reasoning=self.thinking),
            delta=text,
            logprobs=_logprobs(delta.logprobs) if delta.logprobs else None,
            additional_kwargs=_delta_tags(delta.model, delta.span_index),
        )


class CompletionTurn:
    """Turns engine events into CompletionResponses (streamed deltas, then the final response)."""

    def __init__(self, span_id: str | None, emit_deltas: bool = True) -> None:
        self.span_id = span_id
        self.emit_deltas = emit_deltas
        self.text = ""

    def on_event(self, event: StreamEvent) -> CompletionResponse | None:
        if isinstance(event, SwitchEvent):
            _dispatch_switch(event, self.span_id)
            return None
        if isinstance(event, FinalEvent):
            result = event.result
            return CompletionResponse(
                text=result.text,
                delta="" if self.emit_deltas else None,
                raw=_raw(result),
                logprobs=_logprobs(result.logprobs),
                additional_kwargs={"relaygen": result.relay_metadata()},
            )
        if isinstance(event, TextEvent) and (event.text or event.logprobs):
            self.text += event.text
            if self.emit_deltas:
                return CompletionResponse(
                    text=self.text,
                    delta=event.text,
                    logprobs=_logprobs(event.logprobs) if event.logprobs else None,
                    additional_kwargs=_delta_tags(event.model, event.span_index),
                )
        return None


def last_response(responses: Iterator[Any]) -> Any:
    """The final response of a stream that was run only for its result."""
    tail = deque(responses, maxlen=1)
    if not tail:
        raise RuntimeError("generation ended without a result")
    return tail[0]
