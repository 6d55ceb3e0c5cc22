"""Tool calls read with the tokenizer's own response template, where it declares one (transformers 5.x).

transformers 5 lets a tokenizer declare how its model's output reads: ``tokenizer.response_template`` (kept in
``tokenizer_config.json``; transformers 5.25 drops the ``response_schema`` of earlier 5.x releases on load), regions
such as ``tool_calls`` with their delimiters and content parsers. ``tokenizer.parse_response(text, prefix=...)``
parses a whole output with it; ``tokenizer.get_response_parser(prefix=...)`` is the same parser fed piece by piece,
which a chat stream needs. Where the template declares a ``tool_calls`` field the chat layer reads the output with
it (the model makers' own reading of their format, casting arguments by the tools' schemas as ``parse_response``
does), unless the request names its ``tool_format``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ...engine.core.settings import GenerationError
from ..tool_calls import InvalidToolCall, ToolCall, call_from_data
from .base import Piece

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

TOOL_CALLS_FIELD = "tool_calls"


class ResponseTemplateError(GenerationError):
    """The tokenizer's declared response template does not load; ``field`` is ``"response_template"``."""


def declared_template(tokenizer: PreTrainedTokenizerBase) -> dict[str, Any] | None:
    """The tokenizer's response template if it declares a ``tool_calls`` field (and this transformers reads it),
    made lenient (:func:`lenient`); else None."""
    template = getattr(tokenizer, "response_template", None)
    if not isinstance(template, Mapping) or not hasattr(tokenizer, "get_response_parser"):
        return None
    fields = template.get("fields")
    if not isinstance(fields, Mapping) or TOOL_CALLS_FIELD not in fields:
        return None
    return lenient(template)


def lenient(template: Mapping[str, Any]) -> dict[str, Any]:
    """A copy whose JSON ``tool_calls`` field keeps text that does not parse (``allow_non_json``) instead of raising
    in the middle of a stream: a malformed call then becomes an :class:`InvalidToolCall`, as in every format."""
    result = copy.deepcopy(dict(template))
    field = result["fields"][TOOL_CALLS_FIELD]
    if isinstance(field, dict) and field.get("content") == "json":
        field["content_args"] = {**field.get("content_args", {}), "allow_non_json": True}
    return result


class DeclaredParser:
    """A stream parser over transformers' ``ResponseParser``: content (and any reasoning the chat layer did not take
    apart already) as text, each closed ``tool_calls`` region as its calls."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        template: Mapping[str, Any],
        tools: Sequence[Mapping[str, Any]] | None,
        new_id: Callable[[], str],
    ) -> None:
        self._tokenizer = tokenizer
        self._template = template
        self._tools = [dict(tool) for tool in tools] if tools else None
        self._new_id = new_id
        self._raw = ""  # the text of the tool-call region being read
        self._parser = self._fresh()

    def _fresh(self) -> Any:
        try:
            # prefix="": the parser is fed the answer itself (a prefill first), never the prompt.
            return self._tokenizer.get_response_parser(self._template, prefix="", tools=self._tools)
        except (ValueError, TypeError, KeyError) as exc:
            raise ResponseTemplateError(
                f"the tokenizer's response_template does not load: {exc}; set tool_format to read tool calls "
                "without it",
                "response_template",
            ) from exc

    def feed(self, delta: str) -> Iterator[Piece]:
        yield from self._read(lambda: self._parser.feed(delta))

    def finish(self) -> Iterator[Piece]:
        yield from self._read(lambda: self._parser.finalize()[1])

    def _read(self, step: Callable[[], list[dict[str, Any]]]) -> Iterator[Piece]:
        try:
            events = step()
        except (ValueError, KeyError, TypeError) as exc:
            # A region the template's own parsers refuse (a transform that does not fit what was written, a key it
            # names that the call lacks): the call is kept as invalid, and reading goes on with a fresh parser.
            raw, self._raw = self._raw.strip(), ""
            self._parser = self._fresh()
            yield self._identified(InvalidToolCall(raw=raw, error=f"the response_template cannot read it: {exc}"))
            return
        for event in events:
            yield from self._pieces(event)

    def _pieces(self, event: Mapping[str, Any]) -> Iterator[Piece]:
        kind, field = event.get("type"), event.get("field")
        if kind == "region_chunk":
            if field == TOOL_CALLS_FIELD:
                self._raw += event.get("text") or ""
            elif not event.get("dirty") and event.get("text"):
                yield event["text"]
        elif kind == "region_close" and field == TOOL_CALLS_FIELD:
            raw, self._raw = self._raw.strip(), ""
            value = event.get("value")
            for item in value if isinstance(value, list) else [value]:
                yield self._identified(self._call(item, raw))

    @staticmethod
    def _call(item: Any, raw: str) -> ToolCall | InvalidToolCall:
        """One parsed call (``{"type": "function", "function": {"name", "arguments"}}`` as the templates transform
        it, or a bare ``{"name", "arguments"}``)."""
        function = item.get("function", item) if isinstance(item, Mapping) else item
        if not isinstance(function, Mapping):
            return InvalidToolCall(raw=raw or str(function), error="the tool call is not valid JSON")
        return call_from_data(dict(function), raw)

    def _identified(self, call: ToolCall | InvalidToolCall) -> ToolCall | InvalidToolCall:
        call.id = self._new_id()
        return call
