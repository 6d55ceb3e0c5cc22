"""Llama 3.x JSON tool calls: the assistant turn is one JSON object, ``{"name": ..., "parameters": {...}}``.

The Llama 3.1/3.2/3.3 chat templates (meta-llama's ``tokenizer_config.json``) tell the model, for custom tools:
'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}. Do not use
variables.', and render an assistant's call as exactly that object (``'{"name": "' + name + '", "parameters": ' +
arguments|tojson + '}'``), one call an assistant message (the template raises on more). ``parameters``, not
``arguments``. The built-in tools' ``<|python_tag|>`` form is Python (``brave_search.call(query="...")``) and is not
read here; a ``<|python_tag|>`` before a JSON call (Llama 3.2 writes one at times) is read past.

Text and a call are told apart by how the output opens, as vLLM's ``llama3_json`` parser does: an output that opens
with ``{`` (or the python tag) is a call. Under a grammar, text may not open with a brace or white space, so no text
reads as a call; and a call is the whole turn.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Literal

from ...engine.constraints.grammar import GrammarTokenizer
from ..constraints import json_item
from ..tool_calls import InvalidToolCall, call_from_data, forces_nothing
from .base import Piece, ToolFormat, call_object_schema, chosen_tools, json_call_prefix

PYTHON_TAG = "<|python_tag|>"
# The keys of a call object: an object with others is an answer written as JSON (one with a "name" field too).
CALL_KEYS = frozenset({"name", "parameters", "arguments"})
# A JSON object that starts as a call does: a malformed one is an invalid call, not text.
_CALL_OPENING = re.compile(r'\{\s*"name"\s*:')


class Llama3JsonParser:
    """Stream parser: the output is text, or calls (``{...}``, more separated by ``;`` as vLLM reads them) with any
    text after them. A JSON object with other keys than a call's (an answer written as JSON) is text."""

    def __init__(self) -> None:
        self._buffer = ""
        self._mode: Literal["start", "call", "text"] = "start"
        self._calls = 0

    def feed(self, delta: str) -> Iterator[Piece]:
        self._buffer += delta
        yield from self._drain(final=False)

    def finish(self) -> Iterator[Piece]:
        yield from self._drain(final=True)
        rest, self._buffer = self._buffer, ""
        if rest.strip():  # white space after the last call is no content
            yield rest

    def _drain(self, final: bool) -> Iterator[Piece]:
        if self._mode == "start":
            head = self._buffer.lstrip()
            # A python tag before JSON is read past; before anything else (a built-in tool's Python) it stays text.
            after_tag = head[len(PYTHON_TAG) :].lstrip() if head.startswith(PYTHON_TAG) else head
            if after_tag.startswith("{"):
                self._buffer, self._mode = after_tag, "call"
            elif not final and (not after_tag or PYTHON_TAG.startswith(head)):
                return  # white space, or what may be the python tag: undecided
            else:
                self._mode = "text"
        if self._mode == "call":
            yield from self._decode_calls(final)
        if self._mode == "text" and self._buffer:
            text, self._buffer = self._buffer, ""
            yield text

    def _decode_calls(self, final: bool) -> Iterator[Piece]:
        while True:
            body = self._buffer.lstrip()
            if self._calls and body.startswith(";"):
                body = body[1:].lstrip()
            if not body:
                return  # white space (or a separator) so far
            if not body.startswith("{"):
                self._mode = "text"  # text after the calls
                return
            try:
                data, end = json.JSONDecoder().raw_decode(body)
            except json.JSONDecodeError as exc:
                if not final:
                    return  # the object is not complete yet
                self._buffer = ""
                if _CALL_OPENING.match(body):
                    yield InvalidToolCall(
                        raw=body.strip(), error=f"tool call is not valid JSON: {exc.msg} at char {exc.pos}"
                    )
                else:
                    yield body
                return
            if not (isinstance(data, dict) and "name" in data and set(data) <= CALL_KEYS):
                self._mode = "text"  # JSON that is no call (an answer written as JSON): text, as it was written
                return
            yield call_from_data(data, body[:end])
            self._calls += 1
            self._buffer = body[end:]


class Llama3JsonFormat(ToolFormat):
    name = "llama3_json"
    call_start = '{"'

    def detects(self, template: str) -> bool:
        # The header tokens are Llama 3's; the key is what its custom tool calls are written with.
        return "<|start_header_id|>" in template and '"parameters"' in template

    def parser(self, tool_names: Iterable[str]) -> Llama3JsonParser:
        return Llama3JsonParser()

    def forced_prefix(self, tool_choice: Any, tools: Sequence[Mapping[str, Any]]) -> str | None:
        return json_call_prefix(tool_choice, "", "parameters")

    def grammar(
        self,
        tools: Sequence[Mapping[str, Any]],
        tool_choice: Any,
        tokenizer: GrammarTokenizer,
        parallel: bool = False,
        answer: str | None = None,
    ) -> tuple[str, str]:
        # One call a turn whatever ``parallel`` says: the template renders one call an assistant message, and raises
        # on a message with more.
        rules = [f"call: {json_item(call_object_schema(chosen_tools(tools, tool_choice), 'parameters'))}"]
        if not forces_nothing(tool_choice):
            rules.append("turn: call")
        elif answer is not None:
            # Both are objects: the first key tells them apart, and the parser reads only a call's keys as a call.
            rules += [f"answer: {answer}", "turn: call | answer"]
        else:
            rules += ["TEXT: /([^{\\s](.|\\n)*)?/", "turn: call | TEXT"]
        return "\n".join(rules), "turn"

    def call_tag(self, tokenizer: GrammarTokenizer) -> int | None:
        # No tag: a call opens with '{"'. Where that is one token, the first-position decision narrows a call to it
        # (the grammar's JSON starts with it) and text to tokens that open neither a brace nor markup.
        ids = tokenizer.built.tokenize_str(self.call_start)
        return ids[0] if len(ids) == 1 else None


LLAMA3_JSON = Llama3JsonFormat()
