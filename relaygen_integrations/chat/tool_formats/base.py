"""What a tool-call format is, and the grammar pieces the formats share.

A format is one chat-template family's call shape: a stream parser for what the model writes, the prefill that
forces a call where no grammar runs, the grammar rules of a turn with tools (``chat/constraints.py``'s contract: Lark
rules in llguidance's dialect and the name of the rule that is the turn) and the token a call opens with, for the
first-position decision between a call and text (``engine/constraints/opening.py``).
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

from ...engine.constraints.grammar import GrammarTokenizer
from ..constraints import call_schema, forced_tool
from ..tool_calls import InvalidToolCall, ToolCall, forces_nothing, new_call_id

Piece = str | ToolCall | InvalidToolCall


class StreamParser(Protocol):
    """Feed text deltas, get content deltas and completed tool calls in order (``ToolCallStreamParser``'s shape)."""

    def feed(self, delta: str) -> Iterator[Piece]: ...

    def finish(self) -> Iterator[Piece]: ...


class ToolFormat(ABC):
    """One family's tool-call shape. ``call_start``: the text every call of the format starts with."""

    name: str
    call_start: str

    @abstractmethod
    def detects(self, template: str) -> bool:
        """Whether a chat template (its Jinja source) renders tool calls in this format."""

    @abstractmethod
    def parser(self, tool_names: Iterable[str]) -> StreamParser:
        """A fresh stream parser for one turn (``tool_names``: the bound tools)."""

    @abstractmethod
    def forced_prefix(self, tool_choice: Any, tools: Sequence[Mapping[str, Any]]) -> str | None:
        """The assistant-turn prefill that forces ``tool_choice`` (checked already) where no grammar runs."""

    @abstractmethod
    def grammar(
        self,
        tools: Sequence[Mapping[str, Any]],
        tool_choice: Any,
        tokenizer: GrammarTokenizer,
        parallel: bool = False,
        answer: str | None = None,
    ) -> tuple[str, str]:
        """The Lark rules of a turn with ``tools`` under ``tool_choice`` and the name of its rule (see
        ``constraints.tool_call_grammar``); ``parallel``: more calls may follow the first; ``answer``: the grammar
        item of a JSON answer, which takes the place of free text where the choice leaves the model one."""

    def call_tag(self, tokenizer: GrammarTokenizer) -> int | None:
        """The token a call opens with, for the decision between a call and text at the turn's first position: the
        format's tag where it is one special token; None: no decision (the grammar alone decides)."""
        return tokenizer.is_special(self.call_start)

    def new_id(self) -> str:
        """An id for a parsed call (OpenAI's shape unless the template asks for another)."""
        return new_call_id()


# -- grammar pieces ---------------------------------------------------------------------------------------------------
def literal(text: str, tokenizer: GrammarTokenizer) -> str:
    """A grammar item for ``text``: its special token where it is one, else the string."""
    token = tokenizer.is_special(text)
    return f"<[{token}]>" if token is not None else json.dumps(text)


def chosen_tools(tools: Sequence[Mapping[str, Any]], tool_choice: Any) -> list[Mapping[str, Any]]:
    """The tools a turn may call: the one ``tool_choice`` names, else all of them."""
    named = forced_tool(tool_choice)
    return [tool for tool in tools if tool["function"]["name"] == named] if named else list(tools)


def json_call_prefix(tool_choice: Any, opening: str, arguments_key: str) -> str | None:
    """The prefill forcing ``tool_choice`` in a format whose call is ``opening`` then a JSON object ``{"name": ...,
    <arguments_key>: {...}}``: up to the name's opening quote for any tool, into the arguments for a named one; None
    where nothing is forced."""
    if forces_nothing(tool_choice):
        return None
    named = forced_tool(tool_choice)
    if named is None:
        return f'{opening}{{"name": "'
    return f'{opening}{{"name": {json.dumps(named)}, "{arguments_key}": {{'


def call_object_schema(tools: Sequence[Mapping[str, Any]], arguments_key: str = "arguments") -> dict[str, Any]:
    """One call object of any of ``tools``: exactly ``{"name": <its name>, <arguments_key>: <its parameters>}``, the
    tools' definitions (``$defs``) at the root of the one document, where their references point."""
    schemas = [call_schema(tool) for tool in tools]
    defs = {name: spec for schema in schemas for name, spec in schema.pop("$defs", {}).items()}
    if arguments_key != "arguments":
        for schema in schemas:
            schema["properties"][arguments_key] = schema["properties"].pop("arguments")
            schema["required"] = ["name", arguments_key]
    root = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    return {**root, "$defs": defs} if defs else root


def tagged_turn(tag: str, rest: str, tool_choice: Any, more: str = "", answer: str | None = None) -> list[str]:
    """The turn rule of a format whose calls open with ``tag`` (a grammar item) followed by the rule ``rest``:
    forced, a call from the first token; offered (``"auto"``), free text that may end in a call - text cannot hold a
    special token, so a special tag ends it; a plain-text tag ends the lazy text at its first occurrence - or, with
    an ``answer`` item, a call or that answer and nothing else. ``more``: what may follow the call (parallel
    calls)."""
    if not forces_nothing(tool_choice):
        return [f"turn: {tag} {rest}{more}"]
    if answer is not None:
        return [f"answer: {answer}", f"turn: {tag} {rest}{more} | answer"]
    if tag.startswith("<["):
        return ["TEXT: /(.|\\n)*/", f"turn: TEXT ({tag} {rest}{more})?"]
    return ["TEXT: /(.|\\n)*/", f"opening[lazy]: TEXT {tag}", f"turn: opening {rest}{more} | TEXT"]
