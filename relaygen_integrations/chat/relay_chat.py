"""One chat turn over the engine with tools: what both framework adapters call.

It binds the pieces the adapters would otherwise each repeat: tool-schema checks, the tool-choice prefill, and turning
engine events into content deltas (tagged with the model that wrote them), completed tool calls, switches and the
final parsed result.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .tool_calls import (
    InvalidToolCall,
    ParsedOutput,
    ToolCall,
    ToolCallStreamParser,
    forced_prefix,
    validate_tools,
)

if TYPE_CHECKING:
    from ..engine.engine import RelayEngine
    from ..engine.spans import ModelRole, RelayResult, StreamEvent, SwitchEvent


@dataclass
class ChatDelta:
    """One streamed piece of a chat turn. Exactly one of text / tool_call / switch / result is meaningful."""

    text: str = ""
    model: ModelRole | None = None
    span_index: int = 0
    tool_call: ToolCall | InvalidToolCall | None = None
    switch: SwitchEvent | None = None
    result: RelayResult | None = None
    parsed: ParsedOutput | None = None


@dataclass(frozen=True)
class ChatRequest:
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    prefix: str | None
    chat_template_kwargs: Mapping[str, Any] | None
    settings: dict[str, Any]


def prepare_chat(
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    tool_choice: str | Mapping[str, Any] | bool | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    **settings: Any,
) -> ChatRequest:
    """Validates tools and derives the prefill; ``tool_choice="none"`` hides the tools from the model."""
    checked = validate_tools(tools) if tools else None
    if tool_choice == "none":
        checked = None
    prefix = forced_prefix(tool_choice, checked) if checked else None
    return ChatRequest([dict(m) for m in messages], checked, prefix, chat_template_kwargs, settings)


class ChatStreamAssembler:
    """Turns engine events into ChatDeltas and collects the parsed turn.

    The prefill is fed to the parser first, so a forced tool call (whose opening the model never writes) parses
    whole; the final ParsedOutput is built from exactly the pieces that were streamed, so streamed and final tool
    calls carry the same ids.
    """

    def __init__(self, prefix: str | None) -> None:
        self.parser = ToolCallStreamParser()
        self.parsed = ParsedOutput(content="")
        for piece in self.parser.feed(prefix or ""):
            self._collect(piece)

    def on_event(self, event: StreamEvent) -> list[ChatDelta]:
        from ..engine.spans import FinalEvent, SwitchEvent, TextEvent

        if isinstance(event, TextEvent):
            return [self._piece(p, event.model, event.span_index) for p in self.parser.feed(event.text)]
        if isinstance(event, SwitchEvent):
            return [ChatDelta(model=event.to_model, span_index=event.span_index, switch=event)]
        if isinstance(event, FinalEvent):
            model, index = event.model, max(0, event.span_index)
            tail = [self._piece(p, model, index) for p in self.parser.finish()]
            return [*tail, ChatDelta(model=model, span_index=index, result=event.result, parsed=self.parsed)]
        return []

    def _collect(self, piece: str | ToolCall | InvalidToolCall) -> None:
        if isinstance(piece, str):
            self.parsed.content += piece
        elif isinstance(piece, ToolCall):
            self.parsed.tool_calls.append(piece)
        else:
            self.parsed.invalid_tool_calls.append(piece)

    def _piece(self, piece: str | ToolCall | InvalidToolCall, model: ModelRole | None, index: int) -> ChatDelta:
        self._collect(piece)
        if isinstance(piece, str):
            return ChatDelta(text=piece, model=model, span_index=index)
        return ChatDelta(model=model, span_index=index, tool_call=piece)


def stream_chat(engine: RelayEngine, request: ChatRequest, cancel: Any = None) -> Iterator[ChatDelta]:
    assembler = ChatStreamAssembler(request.prefix)
    events = engine.stream(
        request.messages,
        tools=request.tools,
        chat_template_kwargs=request.chat_template_kwargs,
        assistant_prefix=request.prefix,
        cancel=cancel,
        **request.settings,
    )
    for event in events:
        yield from assembler.on_event(event)


async def astream_chat(engine: RelayEngine, request: ChatRequest) -> AsyncIterator[ChatDelta]:
    assembler = ChatStreamAssembler(request.prefix)
    events = engine.astream(
        request.messages,
        tools=request.tools,
        chat_template_kwargs=request.chat_template_kwargs,
        assistant_prefix=request.prefix,
        **request.settings,
    )
    async for event in events:
        for delta in assembler.on_event(event):
            yield delta
