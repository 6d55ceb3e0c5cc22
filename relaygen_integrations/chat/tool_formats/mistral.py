"""Mistral tool calls, in the two shapes Mistral's chat templates write them.

* ``mistral`` - ``[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]``: one JSON list of calls (Mistral 7B
  Instruct v0.3's template, tokenizer versions up to v7). The template renders a call in the history with its id,
  which must be 9 alphanumeric characters (it raises otherwise): parsed calls get such ids.
* ``mistral_v11`` - ``[TOOL_CALLS]name[ARGS]{...}``, the tag again before each further call (tokenizer v11 and later:
  Mistral Small 3.2, Magistral, Devstral, Ministral 3). A ``[CALL_ID]id`` between the name and ``[ARGS]`` (v13
  templates write one) is read past.

Text may come before a call (the parser keeps it as content; the grammar lets it end at the tag).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from ...engine.constraints.grammar import GrammarTokenizer
from ..constraints import call_schema, forced_tool, json_item
from ..tool_calls import InvalidToolCall, ToolCall, call_from_data, forces_nothing, partial_suffix
from .base import Piece, ToolFormat, call_object_schema, chosen_tools, json_call_prefix, literal, tagged_turn

TOOL_CALLS = "[TOOL_CALLS]"
ARGS = "[ARGS]"
CALL_ID = "[CALL_ID]"


def mistral_call_id() -> str:
    """A call id as Mistral's templates require it: 9 alphanumeric characters."""
    return uuid.uuid4().hex[:9]


class _TaggedParser:
    """Text up to ``[TOOL_CALLS]`` (a partial tag held back), then what the subclass reads as calls."""

    def __init__(self, new_id: Callable[[], str]) -> None:
        self._new_id = new_id
        self._buffer = ""
        self._in_call = False

    def feed(self, delta: str) -> Iterator[Piece]:
        self._buffer += delta
        yield from self._drain(final=False)

    def finish(self) -> Iterator[Piece]:
        yield from self._drain(final=True)

    def _drain(self, final: bool) -> Iterator[Piece]:
        while True:
            if self._in_call:
                calls = list(self._calls(final))
                yield from calls
                if self._in_call:
                    return  # the call is not complete yet
                continue
            start = self._buffer.find(TOOL_CALLS)
            if start >= 0:
                if start:
                    yield self._buffer[:start]
                self._buffer, self._in_call = self._buffer[start + len(TOOL_CALLS) :], True
                continue
            keep = 0 if final else partial_suffix(self._buffer, TOOL_CALLS)
            ready, self._buffer = self._buffer[: len(self._buffer) - keep], self._buffer[len(self._buffer) - keep :]
            if ready:
                yield ready
            return

    def _calls(self, final: bool) -> Iterator[Piece]:
        """Reads the calls after a tag from the buffer; leaves ``_in_call`` set while they are incomplete."""
        raise NotImplementedError

    def _with_id(self, call: ToolCall | InvalidToolCall) -> ToolCall | InvalidToolCall:
        call.id = self._new_id()
        return call


class MistralParser(_TaggedParser):
    """``[TOOL_CALLS] [{...}, ...]``: each object of the list a call (a lone object is read as one call)."""

    def _calls(self, final: bool) -> Iterator[Piece]:
        body = self._buffer.lstrip()
        if not body:
            self._in_call = not final
            return
        try:
            data, end = json.JSONDecoder().raw_decode(body)
        except json.JSONDecodeError as exc:
            if final:
                self._buffer, self._in_call = "", False
                yield InvalidToolCall(
                    raw=body.strip(), error=f"the tool-call list is not valid JSON: {exc.msg} at char {exc.pos}"
                )
            return
        self._buffer, self._in_call = body[end:], False
        items = data if isinstance(data, list) else [data]
        if not items:
            yield InvalidToolCall(raw=body[:end], error="the tool-call list is empty")
        for item in items:
            yield self._with_id(call_from_data(item, json.dumps(item, ensure_ascii=False)))


class MistralV11Parser(_TaggedParser):
    """``[TOOL_CALLS]name[ARGS]{...}``: the name up to ``[ARGS]``, then one JSON object of arguments."""

    def _calls(self, final: bool) -> Iterator[Piece]:
        split = self._buffer.find(ARGS)
        if split < 0:
            if final:
                raw, self._buffer, self._in_call = self._buffer.strip(), "", False
                if raw:
                    yield self._with_id(InvalidToolCall(raw=raw, error=f"the tool call has no {ARGS}"))
            return
        name = self._buffer[:split].split(CALL_ID)[0].strip()
        body = self._buffer[split + len(ARGS) :].lstrip()
        raw = f"{TOOL_CALLS}{self._buffer[: split + len(ARGS)]}{body}".strip()
        try:
            arguments, end = json.JSONDecoder().raw_decode(body)
        except json.JSONDecodeError as exc:
            if final:
                self._buffer, self._in_call = "", False
                error = f"tool call arguments are not valid JSON: {exc.msg} at char {exc.pos}"
                yield self._with_id(InvalidToolCall(raw=raw, name=name or None, error=error))
            return
        self._buffer, self._in_call = body[end:], False
        if not name:
            yield self._with_id(InvalidToolCall(raw=raw, error="the tool call has no name"))
        elif not isinstance(arguments, dict):
            yield self._with_id(InvalidToolCall(raw=raw, name=name, error="tool call arguments are not a JSON object"))
        else:
            yield self._with_id(ToolCall(name=name, arguments=arguments))


class MistralFormat(ToolFormat):
    name = "mistral"
    call_start = TOOL_CALLS

    def detects(self, template: str) -> bool:
        return TOOL_CALLS in template and ARGS not in template

    def parser(self, tool_names: Iterable[str]) -> MistralParser:
        return MistralParser(self.new_id)

    def forced_prefix(self, tool_choice: Any, tools: Sequence[Mapping[str, Any]]) -> str | None:
        return json_call_prefix(tool_choice, f"{TOOL_CALLS} [", "arguments")

    def grammar(
        self,
        tools: Sequence[Mapping[str, Any]],
        tool_choice: Any,
        tokenizer: GrammarTokenizer,
        parallel: bool = False,
        answer: str | None = None,
    ) -> tuple[str, str]:
        items = call_object_schema(chosen_tools(tools, tool_choice))
        defs = items.pop("$defs", None)
        calls: dict[str, Any] = {"type": "array", "items": items, "minItems": 1}
        if not parallel:
            calls["maxItems"] = 1  # one call a turn unless parallel calls are asked for (as for every format)
        if defs:
            calls["$defs"] = defs
        # The template writes "[TOOL_CALLS] [" - a space between the tag and the list.
        rules = [f"calls: {json_item(calls)}", 'call_rest: " " calls']
        rules += tagged_turn(literal(TOOL_CALLS, tokenizer), "call_rest", tool_choice, answer=answer)
        return "\n".join(rules), "turn"

    def new_id(self) -> str:
        return mistral_call_id()


class MistralV11Format(ToolFormat):
    name = "mistral_v11"
    call_start = TOOL_CALLS

    def detects(self, template: str) -> bool:
        return TOOL_CALLS in template and ARGS in template

    def parser(self, tool_names: Iterable[str]) -> MistralV11Parser:
        return MistralV11Parser(self.new_id)

    def forced_prefix(self, tool_choice: Any, tools: Sequence[Mapping[str, Any]]) -> str | None:
        if forces_nothing(tool_choice):
            return None
        named = forced_tool(tool_choice)
        return TOOL_CALLS if named is None else f"{TOOL_CALLS}{named}{ARGS}{{"

    def grammar(
        self,
        tools: Sequence[Mapping[str, Any]],
        tool_choice: Any,
        tokenizer: GrammarTokenizer,
        parallel: bool = False,
        answer: str | None = None,
    ) -> tuple[str, str]:
        tag, args = literal(TOOL_CALLS, tokenizer), literal(ARGS, tokenizer)
        rules, alternatives = [], []
        for index, tool in enumerate(chosen_tools(tools, tool_choice)):
            # The arguments object is the document's root here: its definitions go back to it.
            call = call_schema(tool)
            schema = {**call["properties"]["arguments"], **({"$defs": call["$defs"]} if "$defs" in call else {})}
            rules.append(f"arguments_{index}: {json_item(schema)}")
            alternatives.append(f"{json.dumps(tool['function']['name'])} {args} arguments_{index}")
        rules.append(f"call_rest: {' | '.join(alternatives)}")
        more = ""
        if parallel:
            rules.append(f"more_calls: ({tag} call_rest)*")
            more = " more_calls"
        rules += tagged_turn(tag, "call_rest", tool_choice, more, answer)
        return "\n".join(rules), "turn"

    def new_id(self) -> str:
        return mistral_call_id()


MISTRAL = MistralFormat()
MISTRAL_V11 = MistralV11Format()
