"""Hermes-style calls, ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` (Qwen 2.5/3, Hermes): the
parser and prefills of ``chat/tool_calls.py`` and the grammar of ``chat/constraints.py``, as a format."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ...engine.constraints.grammar import GrammarTokenizer
from ..constraints import tool_call_grammar
from ..tool_calls import OPEN_TAG, ToolCallStreamParser, forced_prefix
from .base import ToolFormat


class HermesFormat(ToolFormat):
    name = "hermes"
    call_start = OPEN_TAG

    def detects(self, template: str) -> bool:
        return OPEN_TAG in template

    def parser(self, tool_names: Iterable[str]) -> ToolCallStreamParser:
        return ToolCallStreamParser(tool_names)

    def forced_prefix(self, tool_choice: Any, tools: Sequence[Mapping[str, Any]]) -> str | None:
        return forced_prefix(tool_choice, tools)

    def grammar(
        self,
        tools: Sequence[Mapping[str, Any]],
        tool_choice: Any,
        tokenizer: GrammarTokenizer,
        parallel: bool = False,
        answer: str | None = None,
    ) -> tuple[str, str]:
        return tool_call_grammar(tools, tool_choice, tokenizer, parallel, answer)


HERMES = HermesFormat()
