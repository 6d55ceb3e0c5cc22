"""Hermes-style tool calls (``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``), as Qwen chat templates
teach the model to write them: parsing whole outputs, parsing streams, ids, tool-choice prefills, schema checks.

Framework-free: both adapters map these plain dataclasses onto their own message types. Other chat-template
families' call shapes (Llama 3.x, Mistral) are in ``tool_formats/``, which yields these same dataclasses.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..engine.core.prompt import (
    ToolSchemaError as ToolSchemaError,  # re-exported: the tool-schema check lives with prompts
)
from ..engine.core.prompt import validate_tools as validate_tools
from ..engine.core.settings import shown

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"
FENCE = "```"


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any]
    id: str = field(default_factory=new_call_id)


@dataclass
class InvalidToolCall:
    """A tool call the model opened but did not write as valid JSON with a name; kept, never raised."""

    raw: str
    error: str
    name: str | None = None
    id: str = field(default_factory=new_call_id)


@dataclass
class ParsedOutput:
    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    invalid_tool_calls: list[InvalidToolCall] = field(default_factory=list)
    reasoning: str | None = None  # the reasoning, told apart from the content ('separate'); None: not separated
    reasoning_tokens: int = 0  # completion tokens up to where the answer starts (the end marker included)


def call_from_data(data: Any, raw: str) -> ToolCall | InvalidToolCall:
    """A decoded call object (``{"name": ..., "arguments" or "parameters": {...}}``) as a call, or as an invalid
    call saying what is wrong with it; ``raw``: the text it was decoded from."""
    if not isinstance(data, dict) or not isinstance(data.get("name"), str) or not data["name"]:
        return InvalidToolCall(raw=raw, error="tool call JSON has no 'name' string")
    arguments = data.get("arguments", data.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            return InvalidToolCall(raw=raw, name=data["name"], error=f"arguments are not valid JSON: {exc.msg}")
    if not isinstance(arguments, dict):
        return InvalidToolCall(raw=raw, name=data["name"], error="tool call arguments are not a JSON object")
    return ToolCall(name=data["name"], arguments=arguments)


def decode_tool_call(body: str) -> tuple[ToolCall | InvalidToolCall, str]:
    """One tool-call body -> the call, plus any text the model wrote after a complete JSON object.

    Accepts ``arguments`` as an object or a JSON string (models write both). A valid object followed by more text
    (a small model that forgets ``</tool_call>`` and goes on in prose) keeps the call and returns the rest as text.
    """
    raw = body.strip()
    try:
        return call_from_data(json.loads(raw), raw), ""
    except json.JSONDecodeError as exc:
        error = f"tool call is not valid JSON: {exc.msg} at char {exc.pos}"
    try:
        data, end = json.JSONDecoder().raw_decode(raw)
    except json.JSONDecodeError:
        return InvalidToolCall(raw=raw, error=error), ""
    call = call_from_data(data, raw[:end])
    if isinstance(call, InvalidToolCall):
        return InvalidToolCall(raw=raw, name=call.name, error=error), ""
    return call, raw[end:]


def parse_tool_call_body(body: str) -> ToolCall | InvalidToolCall:
    """One ``<tool_call>`` body (trailing text after a complete object is dropped; see ``decode_tool_call``)."""
    return decode_tool_call(body)[0]


def parse_tool_calls(text: str, tool_names: Iterable[str] = ()) -> ParsedOutput:
    """Splits a finished output into content (text outside tool calls) and tool calls.

    An unclosed ``<tool_call>`` at the end (the generation ran out of tokens) is parsed as far as it goes; with
    ``tool_names``, a fenced JSON block naming one of those tools counts as a call too (see the stream parser).
    """
    parser = ToolCallStreamParser(tool_names)
    pieces = list(parser.feed(text)) + list(parser.finish())
    output = ParsedOutput(content="")
    for piece in pieces:
        if isinstance(piece, str):
            output.content += piece
        elif isinstance(piece, ToolCall):
            output.tool_calls.append(piece)
        else:
            output.invalid_tool_calls.append(piece)
    return output


class ToolCallStreamParser:
    """Incremental parser: feed text deltas, get content deltas and completed tool calls in order.

    Content that might be the start of ``<tool_call>`` is held back until it is decided, so a stream never shows
    half a tag as text. With ``tool_names`` (tools are bound), a fenced code block is held back until it closes: a
    block holding exactly ``{"name": <a bound tool>, "arguments": {...}}`` is a tool call - small models such as
    Qwen2.5-Coder-1.5B write optional calls that way instead of in ``<tool_call>`` tags when they run unconstrained
    (``constrain=False``, or a remote pair) - anything else is text.
    """

    def __init__(self, tool_names: Iterable[str] = ()) -> None:
        self.tool_names = frozenset(tool_names)
        self._buffer = ""
        self._in_call = False
        self._in_fence = False

    def feed(self, delta: str) -> Iterator[str | ToolCall | InvalidToolCall]:
        self._buffer += delta
        while True:
            if self._in_call:
                end = self._buffer.find(CLOSE_TAG)
                if end < 0:
                    return
                body, self._buffer = self._buffer[:end], self._buffer[end + len(CLOSE_TAG) :]
                self._in_call = False
                call, trailing = decode_tool_call(body)
                yield call
                if trailing.strip():
                    yield trailing
                continue
            if self._in_fence:
                end = self._buffer.find(FENCE, len(FENCE))
                if end < 0:
                    return
                block, self._buffer = self._buffer[: end + len(FENCE)], self._buffer[end + len(FENCE) :]
                self._in_fence = False
                yield self._fenced_call(block) or block
                continue
            start = self._buffer.find(OPEN_TAG)
            fence = self._buffer.find(FENCE) if self.tool_names else -1
            if fence >= 0 and (start < 0 or fence < start):
                if fence:
                    yield self._buffer[:fence]
                self._buffer = self._buffer[fence:]
                self._in_fence = True
                continue
            if start >= 0:
                if start:
                    yield self._buffer[:start]
                self._buffer = self._buffer[start + len(OPEN_TAG) :]
                self._in_call = True
                continue
            keep = partial_suffix(self._buffer, OPEN_TAG)
            if self.tool_names:
                keep = max(keep, partial_suffix(self._buffer, FENCE))
            ready = self._buffer[: len(self._buffer) - keep]
            if ready:
                yield ready
            self._buffer = self._buffer[len(ready) :]
            return

    def _fenced_call(self, block: str) -> ToolCall | None:
        """A fenced block that is exactly one JSON call of a bound tool, else None (it stays text)."""
        inner = block[len(FENCE) :]
        inner = inner[: -len(FENCE)] if inner.endswith(FENCE) else inner
        first_line, _, rest = inner.partition("\n")
        if first_line.strip().isalpha():  # a language tag such as "json"
            inner = rest
        try:
            data = json.loads(inner)
        except json.JSONDecodeError:
            return None
        # Exactly a call's keys: a block that repeats a call with more in it (a small model echoing a call with its
        # "result" after the tool answered) is text, or an agent loop would run that call again and again.
        if not isinstance(data, dict) or data.get("name") not in self.tool_names:
            return None
        if set(data) not in ({"name", "arguments"}, {"name", "parameters"}):
            return None
        call = call_from_data(data, inner.strip())
        return call if isinstance(call, ToolCall) else None

    def finish(self) -> Iterator[str | ToolCall | InvalidToolCall]:
        """Flushes what is left: held-back text, an unclosed tool call, or an unclosed fenced block."""
        rest, self._buffer = self._buffer, ""
        if self._in_call:
            self._in_call = False
            if rest.strip():
                call, trailing = decode_tool_call(rest)
                yield call
                if trailing.strip():
                    yield trailing
        elif self._in_fence:
            self._in_fence = False
            yield self._fenced_call(rest) or rest
        elif rest:
            yield rest


def partial_suffix(text: str, tag: str) -> int:
    """Length of the longest tail of ``text`` that could be the start of ``tag``."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


def tool_names(tools: Sequence[Mapping[str, Any]]) -> list[str]:
    return [str(tool["function"]["name"]) for tool in tools]


def forces_nothing(tool_choice: Any) -> bool:
    """``None``, ``False``, ``"auto"`` or ``"none"``: the model may answer in text (``0`` is not ``False`` here)."""
    return (
        tool_choice is None
        or tool_choice is False
        or (isinstance(tool_choice, str) and tool_choice in ("auto", "none"))
    )


def check_tool_choice(tool_choice: Any, tools: Sequence[Mapping[str, Any]] | None) -> None:
    """A tool choice must be ``None``/``"auto"``/``"none"``, ``"any"``/``"required"``/``True``, a bound tool's name
    or ``{"type": "function", "function": {"name": ...}}``. A forcing choice needs tools: without any it would
    silently give free text, so it is a ``ToolSchemaError`` instead."""
    if forces_nothing(tool_choice):
        return
    if not isinstance(tool_choice, (str, bool, Mapping)):
        raise ToolSchemaError(
            f"tool_choice must be 'auto', 'none', 'required', a tool name or {{'type': 'function', 'function': "
            f"{{'name': ...}}}}, got {shown(tool_choice)}",
            "tool_choice",
        )
    if not tools:
        raise ToolSchemaError(
            f"tool_choice={shown(tool_choice)} forces a tool call, but no tools are bound: bind the tools, or use "
            "tool_choice='auto'",
            "tool_choice",
        )
    forced_prefix(tool_choice, tools)  # a name that is not bound


def forced_prefix(tool_choice: str | Mapping[str, Any] | None, tools: Sequence[Mapping[str, Any]]) -> str | None:
    """The assistant-turn prefill that enforces a tool choice.

    ``"any"``/``"required"`` (or ``True``) opens a tool call up to the name; a tool name (or an OpenAI
    ``{"type": "function", "function": {"name": ...}}`` dict) also writes the name, so only arguments remain free.
    ``None``/``"auto"``/``"none"`` prefill nothing.
    """
    if forces_nothing(tool_choice):
        return None
    names = tool_names(tools)
    if tool_choice in ("any", "required", True):
        # Not just the tag: measured on the demo pair, after a bare "<tool_call>\n" prefill Qwen2.5-Coder-1.5B puts
        # 0.996 on <|endoftext|> (no call at all); after '<tool_call>\n{"name": "' it writes a tool name, p > 0.99.
        return f'{OPEN_TAG}\n{{"name": "'

    if isinstance(tool_choice, Mapping):
        function = tool_choice.get("function")
        tool_choice = (function.get("name") if isinstance(function, Mapping) else None) or tool_choice.get("name")
    if not isinstance(tool_choice, str) or tool_choice not in names:
        raise ToolSchemaError(
            f"tool_choice {shown(tool_choice)} names no bound tool; bound tools: {names}", "tool_choice"
        )
    # Opening the arguments object too: after a bare '"arguments": ' the 1.5B demo model wrote `42` (not an object).
    return f'{OPEN_TAG}\n{{"name": {json.dumps(tool_choice)}, "arguments": {{'


def assistant_tool_calls_for_template(calls: Sequence[ToolCall]) -> list[dict[str, Any]]:
    """Assistant ``tool_calls`` in the shape chat templates render (OpenAI-like, arguments as an object)."""
    return [
        {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
        for call in calls
    ]
