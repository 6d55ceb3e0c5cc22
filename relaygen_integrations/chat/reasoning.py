"""Reasoning and answer, told apart in a chat turn's text as it streams.

A thinking pair (its policy has a reasoning end, ``</think>``) writes its reasoning, the end marker, then the answer;
with ``reasoning_format="separate"`` (the default for such pairs) the chat layer hands the reasoning to the frameworks
where each expects it (LangChain ``additional_kwargs["reasoning_content"]`` -> ``reasoning`` content blocks,
LlamaIndex ``ThinkingBlock`` / ``thinking_delta``, the server's ``reasoning_content``) and keeps the answer alone as
the content. The engine's text, spans and offsets are untouched: they still index the whole text the models wrote,
markers included (``RelayResult.text``).

Where the text starts: in the reasoning when the rendered prompt left a reasoning block open (a template that ends
its generation prompt with ``<think>``) or when the output opens one itself; otherwise (a template that closed an
empty block, ``enable_thinking=False``) in the answer. With an answer marker instead (a non-thinking pair's
``answer_marker``), everything before the marker is reasoning.

Whether the pair reasons at all is the adapters' ``reasoning`` field (:func:`thinking_template_kwargs`): on/off through
the chat template's own switch where it has one, as ChatOllama's ``reasoning=`` turns a model's thinking on and off.
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ..engine.core.settings import SettingsError, shown

if TYPE_CHECKING:
    from ..engine.engine import RelayEngine

ReasoningFormat = Literal["separate", "inline"]
REASONING_START = "<think>"  # the opening tag that goes with the ``</think>`` reasoning end
Piece = tuple[Literal["reasoning", "content"], str]


def starts_in_reasoning(prompt_tail: str, end_marker: str) -> bool | None:
    """True when the prompt's text leaves a reasoning block open; None when it does not (then the output decides)."""
    if end_marker != "</think>":
        return True  # an answer marker: everything before it is reasoning
    opened = prompt_tail.rfind(REASONING_START)
    return True if opened >= 0 and prompt_tail.find(end_marker, opened) < 0 else None


def _held_tail(text: str, marker: str) -> int:
    """How many trailing characters of ``text`` could be the start of ``marker`` (held back until they can't)."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0


@dataclass
class ReasoningSplitter:
    """Splits streamed text into reasoning and content pieces; ``answer_start`` is where the answer starts in the
    whole text once the end marker has been seen (which tokens lie before it: :meth:`tokens_before_answer`)."""

    end_marker: str
    in_reasoning: bool | None  # None: undecided until the output shows whether it opens a block
    buffer: str = ""
    seen: int = 0  # characters of the whole text fed so far
    answer_start: int | None = None  # character offset in the whole text where the answer starts
    _strip_lead: bool = False

    def feed(self, text: str, final: bool = False) -> list[Piece]:
        self.buffer += text
        self.seen += len(text)
        pieces: list[Piece] = []
        if self.in_reasoning is None:
            lead = self.buffer.lstrip()
            if lead.startswith(REASONING_START):
                self.in_reasoning = True
                self.buffer = lead[len(REASONING_START) :].lstrip("\n")
            elif REASONING_START.startswith(lead) and not final:
                return pieces  # could still become the opening tag
            else:
                self.in_reasoning = False
                self.answer_start = 0
        if self.in_reasoning:
            end = self.buffer.find(self.end_marker)
            if end < 0:
                hold = 0 if final else _held_tail(self.buffer, self.end_marker)
                reasoning, self.buffer = self.buffer[: len(self.buffer) - hold], self.buffer[len(self.buffer) - hold :]
                return [("reasoning", reasoning)] if reasoning else []
            reasoning, self.buffer = self.buffer[:end], self.buffer[end + len(self.end_marker) :]
            if reasoning:
                pieces.append(("reasoning", reasoning))
            self.in_reasoning, self._strip_lead = False, True
            self.answer_start = self.seen - len(self.buffer)
        if self._strip_lead:  # the blank lines between the reasoning and the answer belong to neither
            stripped = self.buffer.lstrip()
            if not stripped and not final:
                return pieces
            self.answer_start = (self.answer_start or 0) + len(self.buffer) - len(stripped)
            self.buffer, self._strip_lead = stripped, False
        if self.buffer:
            pieces.append(("content", self.buffer))
            self.buffer = ""
        return pieces

    def finish(self) -> list[Piece]:
        return self.feed("", final=True)

    def tokens_before_answer(self, token_ends: Sequence[int]) -> int:
        """How many completion tokens (``RelayResult.token_ends``) end before the answer starts: all of them when
        the reasoning never ended, none when the text was the answer from its start."""
        if self.answer_start is None:
            return len(token_ends) if self.in_reasoning is not False else 0
        return bisect.bisect_right(token_ends, self.answer_start)


# The template variables chat templates turn thinking on and off with: ``enable_thinking`` (Qwen3, GLM-4.5, SmolLM3,
# Hunyuan), ``thinking`` (DeepSeek-V3.1, Granite 3.2). The first one a template reads is the pair's switch.
THINKING_SWITCHES = ("enable_thinking", "thinking")


@functools.lru_cache(maxsize=16)
def _template_variables(source: str) -> frozenset[str]:
    """The variables a chat template reads from its caller. Parsed by the environment transformers renders with (its
    ``{% generation %}`` tag and loop controls), so any template that renders parses here too."""
    from jinja2 import meta
    from transformers.utils.chat_template_utils import _compile_jinja_template

    environment = _compile_jinja_template(source).environment
    return frozenset(meta.find_undeclared_variables(environment.parse(source)))


def thinking_switch(chat_template: str | Mapping[str, str] | None) -> str | None:
    """The template variable that turns this chat template's thinking on and off, or None when it has none. A
    variable the template sets itself before reading it is no switch; a name in a string or on a message
    (``message.thinking``) is not one either - only a variable the caller passes counts."""
    if chat_template is None:
        return None
    sources = [chat_template] if isinstance(chat_template, str) else list(dict(chat_template).values())
    names = frozenset().union(*(_template_variables(str(source)) for source in sources))
    return next((name for name in THINKING_SWITCHES if name in names), None)


def thinking_template_kwargs(
    engine: RelayEngine, chat_template_kwargs: Mapping[str, Any] | None, reasoning: bool | None
) -> Mapping[str, Any] | None:
    """``chat_template_kwargs`` with the ``reasoning`` switch applied: None leaves the pair's default; True/False set
    the template's own switch (``enable_thinking``). A template without one cannot change what the pair does: a
    request for what it does anyway (a thinking pair asked to reason, any other pair asked not to) is kept as it
    is, and a request it cannot honour is a ``SettingsError`` naming ``reasoning``, before any model work - as
    Ollama answers ``think=true`` for a model without thinking with a 400 rather than a silent answer without it."""
    if reasoning is None:
        return chat_template_kwargs
    if not isinstance(reasoning, bool):
        raise SettingsError(f"reasoning must be true, false or None, got {shown(reasoning)}", "reasoning")
    switch = thinking_switch(engine.tokenizer.chat_template)
    if switch is None:
        config = engine.policy_config
        thinks = bool(config.reasoning_end or config.answer_marker)
        if reasoning == thinks:
            return chat_template_kwargs
        does = "always reasons (its policy has a reasoning end)" if thinks else "does not reason (no reasoning end)"
        raise SettingsError(
            f"reasoning={reasoning} cannot be honoured: this pair's chat template has no thinking switch "
            f"({' or '.join(THINKING_SWITCHES)}) and the pair {does}; leave reasoning=None",
            "reasoning",
        )
    given = (chat_template_kwargs or {}).get(switch)
    if given is not None and given != reasoning:
        raise SettingsError(
            f"reasoning={reasoning} contradicts chat_template_kwargs[{switch!r}]={shown(given)}: give one of them",
            "reasoning",
        )
    return {**(chat_template_kwargs or {}), switch: reasoning}
