"""Tool-call formats of chat-template families, parsed and grammar-constrained; which one a model writes is read
from its chat template.

* ``hermes`` - ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` (Qwen 2.5/3, Hermes).
* ``llama3_json`` - the turn is one ``{"name": ..., "parameters": {...}}`` (Llama 3.1/3.2/3.3 custom tools).
* ``mistral`` - ``[TOOL_CALLS] [{"name": ..., "arguments": {...}}]`` (Mistral 7B Instruct v0.3, tokenizers to v7).
* ``mistral_v11`` - ``[TOOL_CALLS]name[ARGS]{...}`` (tokenizers v11+: Mistral Small 3.2, Magistral, Devstral).

:func:`chat_tool_format` picks the format: the ``tool_format`` setting where a request names one, else the one whose
markers the tokenizer's chat template holds (``detect_tool_format``; a template with none of them - one that renders
no tools - gets ``hermes``, as before there were formats). :func:`chat_parser` reads a turn's output: with the
tokenizer's declared ``response_template`` where it has a ``tool_calls`` field and no format was named
(``declared.py``), else with the format's own parser.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..tool_calls import tool_names
from .base import Piece, StreamParser, ToolFormat
from .declared import DeclaredParser, ResponseTemplateError, declared_template
from .hermes import HERMES
from .llama3 import LLAMA3_JSON
from .mistral import MISTRAL, MISTRAL_V11

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# In the order they are looked for (each one's markers exclude the others', so the order decides nothing today).
FORMATS: tuple[ToolFormat, ...] = (MISTRAL_V11, MISTRAL, HERMES, LLAMA3_JSON)
TOOL_FORMATS: dict[str, ToolFormat] = {fmt.name: fmt for fmt in FORMATS}

__all__ = [
    "FORMATS",
    "HERMES",
    "LLAMA3_JSON",
    "MISTRAL",
    "MISTRAL_V11",
    "TOOL_FORMATS",
    "Piece",
    "ResponseTemplateError",
    "StreamParser",
    "ToolFormat",
    "chat_parser",
    "chat_tool_format",
    "detect_tool_format",
]


def template_source(tokenizer: PreTrainedTokenizerBase) -> str:
    """The tokenizer's chat template as text (a dict of named templates joined; none: empty)."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, Mapping):
        return "\n".join(str(text) for text in template.values())
    return template if isinstance(template, str) else ""


def detect_tool_format(template: str) -> ToolFormat:
    """The format a chat template (its Jinja source) renders tool calls in; ``hermes`` where none is recognised."""
    return next((fmt for fmt in FORMATS if fmt.detects(template)), HERMES)


def chat_tool_format(tokenizer: PreTrainedTokenizerBase, tool_format: str | None = None) -> ToolFormat:
    """The format a chat turn's tool calls are written in: ``tool_format`` (a setting, checked already) where given,
    else the one the tokenizer's chat template renders."""
    if tool_format is not None:
        return TOOL_FORMATS[tool_format]
    return detect_tool_format(template_source(tokenizer))


def chat_parser(
    tokenizer: PreTrainedTokenizerBase, tool_format: str | None, tools: Sequence[Mapping[str, Any]] | None
) -> StreamParser:
    """A stream parser for one turn's answer: the tokenizer's declared response template where it reads tool calls
    and no format was named, else the format's own parser."""
    fmt = chat_tool_format(tokenizer, tool_format)
    declared = declared_template(tokenizer) if tool_format is None else None
    if declared is not None:
        return DeclaredParser(tokenizer, declared, tools, fmt.new_id)
    return fmt.parser(tool_names(tools) if tools else ())
