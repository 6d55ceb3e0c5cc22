"""The grammar a chat turn generates under: tool calls that match the bound tools, JSON that matches a schema.

With tools bound and ``tool_choice="auto"`` the text is free until the model opens a call (the Hermes tag Qwen's chat
templates teach, ``<tool_call>``); from there to the closing tag the JSON must be one bound tool's name and
arguments; more calls may follow when the request allows parallel calls (as the template renders them), then only
the end. ``"required"``
(``"any"``, ``True``) forces calls from the first token; a named tool forces one call of that tool. A JSON
``response_format`` makes the answer one JSON object (under its schema); with tools as well (``"auto"``) the turn is
a call or that object, nothing else (what ChatOpenAI's strict mode gives). A thinking pair writes its reasoning
first: the grammar lets it through, free, up to the reasoning end.

The grammars are Lark in llguidance's dialect (``engine/constraints/grammar.py`` applies them): a special token is
``<[id]>``; a tag that is plain text is matched lazily (the free text ends at its first occurrence). JSON is compact
and spaced as ``json.dumps`` writes it (``", "``, ``": "``) - the chat template renders calls that way - and a call's
object has exactly the keys ``name`` and ``arguments``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ..engine.constraints.grammar import GrammarTokenizer
from .tool_calls import CLOSE_TAG, OPEN_TAG, forces_nothing

# How JSON is written under a grammar: no free whitespace (a small model would otherwise pad with it), separators as
# json.dumps and the chat template write them. Lenient: a keyword llguidance does not implement (pydantic writes
# ``propertyNames`` for a dict with Literal keys) is left unchecked rather than refusing the schema.
JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": ", "lenient": True}


def _json(schema: Mapping[str, Any]) -> str:
    return "%json " + json.dumps({**closed(schema), "x-guidance": JSON_STYLE}, ensure_ascii=False)


def closed(schema: Any) -> Any:
    """``schema`` with every object that declares its properties closed to others (``additionalProperties: false``
    where it says nothing, as OpenAI's strict mode and xgrammar's do): JSON Schema leaves objects open, and under an
    open schema a small model goes on writing keys of its own invention."""
    if isinstance(schema, list):
        return [closed(item) for item in schema]
    if not isinstance(schema, Mapping):
        return schema
    result = {key: closed(value) for key, value in schema.items()}
    if "properties" in result and "additionalProperties" not in result:
        result["additionalProperties"] = False
    return result


def _literal(text: str, tokenizer: GrammarTokenizer) -> str:
    """A grammar item for ``text``: its special token where it is one, else the string."""
    token = tokenizer.is_special(text)
    return f"<[{token}]>" if token is not None else json.dumps(text)


def call_schema(tool: Mapping[str, Any]) -> dict[str, Any]:
    """One call of ``tool``: exactly ``{"name": <its name>, "arguments": <its parameters>}``; arguments an object
    with no keys beyond its declared ones unless its schema says otherwise (:func:`closed`)."""
    function = tool["function"]
    arguments = dict(function.get("parameters") or {"type": "object", "properties": {}})
    arguments.setdefault("type", "object")
    arguments.setdefault("properties", {})
    # References ("#/$defs/...", pydantic's nested models) resolve from the document's root: the definitions move
    # up to the call's object, which becomes the root.
    defs = arguments.pop("$defs", None)
    call = {
        "type": "object",
        "properties": {"name": {"const": function["name"]}, "arguments": arguments},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }
    return {**call, "$defs": defs} if defs else call


def forced_tool(tool_choice: Any) -> str | None:
    """The tool a choice names (``"add"`` or ``{"type": "function", "function": {"name": "add"}}``), else None."""
    if isinstance(tool_choice, Mapping):
        function = tool_choice.get("function")
        return (function.get("name") if isinstance(function, Mapping) else None) or tool_choice.get("name")
    if isinstance(tool_choice, str) and tool_choice not in ("any", "required", "auto", "none"):
        return tool_choice
    return None


def tool_call_grammar(
    tools: Sequence[Mapping[str, Any]],
    tool_choice: Any,
    tokenizer: GrammarTokenizer,
    parallel: bool = False,
    answer: str | None = None,
) -> tuple[str, str]:
    """The rules of a turn with ``tools`` under ``tool_choice`` (checked already): Lark rules and the name of the
    rule that is the turn. ``parallel``: more calls may follow the first (else the turn ends after one: given the
    choice, the 1.5B demo model writes the same call again and again, ``benchmarks/data/agent-loops``).
    ``answer``: the grammar item of a JSON answer (:func:`json_item`), which takes the place of free text where
    the choice leaves the model one (a response format with tools)."""
    named = forced_tool(tool_choice)
    chosen = [tool for tool in tools if tool["function"]["name"] == named] if named else list(tools)
    schemas = [call_schema(tool) for tool in chosen]
    if len(schemas) == 1:
        body = _json(schemas[0])
    else:  # the tools' definitions at the root of the one document (a name two tools define alike is one entry)
        defs = {name: spec for schema in schemas for name, spec in schema.pop("$defs", {}).items()}
        body = _json({"anyOf": schemas, **({"$defs": defs} if defs else {})})
    open_tag, close_tag = _literal(OPEN_TAG, tokenizer), _literal(CLOSE_TAG, tokenizer)
    rules = [f"call_body: {body}", f'call_rest: "\\n" call_body "\\n" {close_tag}']
    # A call the next one may follow (parallel calls, on lines of their own as the template renders them).
    more = " more_calls" if parallel else ""
    if parallel:
        rules.append(f'more_calls: ("\\n" {open_tag} call_rest)*')
    if named:
        rules.append(f"turn: {open_tag} call_rest")
    elif not forces_nothing(tool_choice):
        rules.append(f"turn: {open_tag} call_rest{more}")
    elif answer is not None:
        # A call or the answer. Both open with a brace where the model writes the call bare, its own way (a small
        # model opens a call as "{" far more than as the tag, ``opening.py``): the first token cannot tell them
        # apart, so the grammar offers the bare call too and the model chooses at the first key, "name" or the
        # answer's. The chat layer reads an object that is exactly a bound tool's call as that call.
        rules += [f"answer: {answer}", f"turn: {open_tag} call_rest{more} | call_body | answer"]
    elif open_tag.startswith("<["):
        # Free text cannot hold a special token: it ends where the model writes the opening tag.
        rules += ["TEXT: /(.|\\n)*/", f"turn: TEXT ({open_tag} call_rest{more})?"]
    else:
        # A plain-text tag: the free text is lazy, so it ends at the tag's first occurrence.
        rules += ["TEXT: /(.|\\n)*/", f"opening[lazy]: TEXT {open_tag}", f"turn: opening call_rest{more} | TEXT"]
    return "\n".join(rules), "turn"


def json_item(schema: Mapping[str, Any] | None) -> str:
    """The grammar item of a JSON answer: one object under ``schema`` (``json_schema``), or any object
    (``json_object``)."""
    return _json(schema or {"type": "object"})


def response_grammar(response_format: Mapping[str, Any], schema: Mapping[str, Any] | None) -> tuple[str, str]:
    """The rules of a turn that is a JSON answer (:func:`json_item`), with no tools."""
    return f"turn: {json_item(schema)}", "turn"


def turn_grammar(
    rules: str, turn: str, reasoning_end: str | None, tokenizer: GrammarTokenizer, may_open: str | None = None
) -> str:
    """The whole completion's grammar: the turn, after a free reasoning up to ``reasoning_end`` where the turn
    starts in one (a thinking pair whose prompt left ``<think>`` open; None: no reasoning first). ``may_open``: the
    tag with which the output may open a reasoning block of its own first (``<think>``, where the prompt left none
    open)."""
    if reasoning_end is None and may_open is None:
        return f"%llguidance {{}}\nstart: {turn}\n{rules}\n"
    marker = _literal(reasoning_end or "", tokenizer)
    lazy = "" if marker.startswith("<[") else "[lazy]"
    reasoning = f"REASONING: /(.|\\n)*/\nreasoning{lazy}: REASONING {marker}"
    # The template's blank line after the reasoning end, as the model writes it.
    if may_open is not None:
        start = f"start: ({_literal(may_open, tokenizer)} reasoning GAP)? {turn}"
    else:
        start = f"start: reasoning GAP {turn}"
    return f"%llguidance {{}}\n{start}\nGAP: /[ \\n]*/\n{reasoning}\n{rules}\n"
