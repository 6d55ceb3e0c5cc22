"""The RelayGen switching policy: one backend-agnostic state machine.

The policy sees only text. After every token the generation loop calls ``observe(text, delta)`` with the full
completion text and the piece the newest token added, and gets back one of three decisions:

* ``continue``  - the current writer keeps writing;
* ``switch``    - the newest token stays; the other model writes from here;
* ``rollback``  - the newest token was a *look-ahead* that belongs to the next segment: drop it, and the other model
                  writes from just before it. Because a token is only forward-passed when the *next* token is
                  generated, dropping the newest token never needs a KV-cache rollback in the local backend.

States::

    LARGE --cue (word boundary, >= min_large_tokens)--> SMALL_SENTENCE
    SMALL_SENTENCE --sentence end | cap--> LARGE
    LARGE | SMALL_SENTENCE --reasoning end--> ANSWER (answer model to the end)

Look-ahead is needed in two places, both because Qwen-style tokenizers attach a space to the *following* word:
a cue word ("So") is only known to end at a word boundary (not "Some") and which variant fired ("So," vs "So ")
once the next token arrives; a "." is only a sentence end once the next token starts with whitespace ("3.14").
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from .cues import CueSet, has_left_boundary, is_word_char
from .spans import Mode, ModelRole

PolicyState = Literal["large", "small_sentence", "answer"]

# Words whose trailing "." does not end a sentence.
_ABBREVIATIONS = frozenset({"e.g", "i.e", "vs", "mr", "mrs", "ms", "dr", "prof", "approx", "fig", "eq", "cf", "st"})
# "1." / "  12." / "a." at the start of a line: a list marker, not a sentence end.
_LIST_MARKER = re.compile(r"(?:^|\n)[ \t]*(?:\d{1,3}|[a-zA-Z])$")


class PolicyConfig(BaseModel):
    """Settings of the switching policy (validated; shared by every backend)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    min_large_tokens: int = Field(5, ge=0, description="tokens the large model writes in a segment before a cue fires")
    max_small_tokens: int = Field(64, ge=1, description="cap on a small segment; then the large model resumes")
    answer_model: ModelRole = Field("small", description="writes everything after the reasoning end")
    reasoning_end: str | None = Field(
        None, description="text that ends the reasoning ('</think>'); None = engine picks from the tokenizer"
    )
    answer_marker: str | None = Field(
        None, description="for non-thinking models: text after which the answer model writes (e.g. 'Final answer')"
    )


@dataclass(frozen=True)
class Decision:
    action: Literal["continue", "switch", "rollback"]
    to_model: ModelRole | None = None
    trigger: str | None = None


CONTINUE = Decision("continue")


def is_sentence_end_period(text: str, index: int) -> bool:
    """Whether the punctuation at ``text[index]`` (known to be followed by whitespace) ends a sentence."""
    if text[index] in "!?":
        return True
    word_start = index
    while word_start > 0 and not text[word_start - 1].isspace():
        word_start -= 1
    word = text[word_start:index].lower().lstrip("([\"'")
    if word in _ABBREVIATIONS:
        return False
    return _LIST_MARKER.search(text, 0, index) is None


class RelayPolicy:
    """Decides, token by token, which model writes next. Holds no model or tokenizer state."""

    def __init__(self, cues: CueSet, config: PolicyConfig | None = None, mode: Mode = "relay") -> None:
        self.cues = cues
        self.config = config or PolicyConfig()
        self.mode: Mode = mode
        self.state: PolicyState = "small_sentence" if mode == "small" else "large"
        self._cores = cues.cores
        self._punctuated = cues.punctuated
        self._end_markers = tuple(m for m in (self.config.reasoning_end, self.config.answer_marker) if m)
        self.segment_start = 0  # char offset where the current segment began
        self.segment_tokens = 0
        # Look-ahead bookkeeping: the char range of a cue word, or the offset right after a ".", awaiting one token.
        self._pending_cue: tuple[int, int] | None = None
        self._pending_period: int | None = None
        self._answer_writer: ModelRole = self.config.answer_model

    @property
    def writer(self) -> ModelRole:
        if self.mode != "relay":
            return self.mode
        if self.state == "answer":
            return self._answer_writer
        return "large" if self.state == "large" else "small"

    # -- the one entry point --------------------------------------------------------------------------------------
    def observe(self, text: str, delta: str) -> Decision:
        """Feeds one kept token (``delta`` is the text it added; ``text`` the whole completion so far)."""
        self.segment_tokens += 1
        if self.mode != "relay" or self.state == "answer":
            return CONTINUE
        prev_len = len(text) - len(delta)
        if self._end_markers and self._reasoning_ended(text, prev_len):
            return self._enter_answer(len(text))
        if self.state == "large":
            return self._observe_large(text, delta, prev_len)
        return self._observe_small(text, delta, prev_len)

    def resume_large(self, start: int) -> None:
        """Verified relay: the large model rejected a small-model token and writes from ``start`` (the text has been
        cut there). In the reasoning it starts a fresh large segment (cues fire again after ``min_large_tokens``); in
        the answer stage it writes the rest of the answer."""
        if self.state == "answer":
            self._answer_writer = "large"
            self.segment_start, self.segment_tokens = start, 0
        else:
            self._begin_segment("large", start)

    # -- transitions ----------------------------------------------------------------------------------------------
    def _begin_segment(self, state: PolicyState, start: int) -> None:
        self.state = state
        self.segment_start = start
        self.segment_tokens = 0
        self._pending_cue = None
        self._pending_period = None

    def _switch(self, state: PolicyState, start: int, trigger: str, rollback: bool) -> Decision:
        before = self.writer
        self._begin_segment(state, start)
        if self.writer == before:
            return CONTINUE
        return Decision("rollback" if rollback else "switch", self.writer, trigger)

    def _enter_answer(self, start: int) -> Decision:
        return self._switch("answer", start, "reasoning_end", rollback=False)

    def _reasoning_ended(self, text: str, prev_len: int) -> bool:
        return any(text.find(m, max(0, prev_len - len(m) + 1)) >= 0 for m in self._end_markers)

    # -- large model: look for a cue ------------------------------------------------------------------------------
    def _observe_large(self, text: str, delta: str, prev_len: int) -> Decision:
        if self._pending_cue is not None:
            decision = self._resolve_pending_cue(text, delta, prev_len)
            if decision is not None:
                return decision
        if not self._cores or self.segment_tokens < self.config.min_large_tokens:
            return CONTINUE
        for cue in self._punctuated:
            start = len(text) - len(cue)
            if start >= self.segment_start and text.endswith(cue) and has_left_boundary(text, start):
                return self._switch("small_sentence", len(text), f"cue:{cue}", rollback=False)
        for core in self._cores:
            start = len(text) - len(core)
            if start >= self.segment_start and text.endswith(core) and has_left_boundary(text, start):
                # The word may continue ("Now" -> "Nowhere") and the variant ("So," / "So ") is still unknown.
                self._pending_cue = (start, len(text))
                break
        return CONTINUE

    def _resolve_pending_cue(self, text: str, delta: str, prev_len: int) -> Decision | None:
        start, end = self._pending_cue  # type: ignore[misc]
        self._pending_cue = None
        if end != prev_len or (delta and is_word_char(delta[0])):
            return None  # the word went on: not a cue here
        # Longest cue that begins with this word and agrees with the text written so far.
        best: str | None = None
        for cue in self.cues.cues:
            cue_end = start + len(cue)
            fits = end <= cue_end <= len(text) and text.startswith(cue, start)
            if fits and (best is None or len(cue) > len(best)):
                best = cue
        if best is None:
            return None
        extra = text[end : start + len(best)]
        # A cue that ends at the word, or whose tail is only the space the next word carries, leaves the look-ahead
        # token to the small model; a cue that includes punctuation ("So,") keeps it.
        rollback = extra == "" or extra.isspace()
        return self._switch("small_sentence", prev_len if rollback else len(text), f"cue:{best}", rollback)

    # -- small model: write to the end of the sentence -------------------------------------------------------------
    def _observe_small(self, text: str, delta: str, prev_len: int) -> Decision:
        if self._pending_period is not None:
            pending, self._pending_period = self._pending_period, None
            if pending == prev_len and (not delta or delta[0].isspace()):
                return self._switch("large", prev_len, "sentence_end", rollback=True)
        scan_from = max(self.segment_start, prev_len - 1)
        if text.find("\n\n", scan_from) >= 0:
            return self._switch("large", len(text), "sentence_end", rollback=False)
        for index in range(max(self.segment_start, prev_len - 1), len(text) - 1):
            if text[index] in ".!?" and text[index + 1].isspace() and is_sentence_end_period(text, index):
                return self._switch("large", len(text), "sentence_end", rollback=False)
        if (
            text
            and len(text) > self.segment_start
            and text[-1] in ".!?"
            and is_sentence_end_period(text, len(text) - 1)
        ):
            self._pending_period = len(text)
        if self.segment_tokens >= self.config.max_small_tokens:
            return self._switch("large", len(text), "cap", rollback=False)
        return CONTINUE
