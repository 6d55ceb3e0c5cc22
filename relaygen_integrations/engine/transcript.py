"""The completion under construction, token by token: backend-agnostic bookkeeping of a relay generation.

A backend only has to produce token ids for the current writer; :class:`Transcript` does the rest: exact incremental
text, the policy's decision after every token (dropping a rolled-back look-ahead token), stop sequences across
switches, span boundaries, stream events, and the final ``RelayResult``. Both backends drive it - the local loop
(``generate.py``) with tokens from its two runners, the remote backend (``remote.py``) with tokens streamed from
OpenAI-compatible servers - so they cannot drift apart.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from transformers import PreTrainedTokenizerBase

from .detokenize import IncrementalDetokenizer
from .policy import Decision, RelayPolicy
from .spans import FinalEvent, FinishReason, ModelRole, RelayResult, Span, StreamEvent, SwitchEvent, TextEvent, Usage


@dataclass
class Segment:
    """A span under construction: where it starts in tokens and characters, and when it opened/closed."""

    model: ModelRole
    trigger: str
    token_start: int
    char_start: int
    opened: float
    closed: float | None = None


def find_stop(text: str, new_from: int, stops: Sequence[str]) -> int | None:
    """Earliest start of a stop sequence that overlaps the text added since ``new_from``."""
    best: int | None = None
    for stop in stops:
        index = text.find(stop, max(0, new_from - len(stop) + 1))
        if index >= 0 and (best is None or index < best):
            best = index
    return best


def stop_holdback(text: str, stops: Sequence[str]) -> int:
    """Length of the longest tail of ``text`` that is a proper prefix of a stop sequence (must not be emitted yet)."""
    longest = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:k]):
                longest = k
                break
    return longest


class Emitter:
    """Releases final text as events, split at span boundaries, announcing each switch before the span's text."""

    def __init__(self, segments: list[Segment]) -> None:
        self.segments = segments
        self.emitted = 0
        self.cursor = 0  # index of the segment whose text is being emitted

    def release(self, text: str, limit: int, final: bool = False) -> Iterator[StreamEvent]:
        while True:
            has_next = self.cursor + 1 < len(self.segments)
            seg_end = self.segments[self.cursor + 1].char_start if has_next else len(text)
            end = min(limit, seg_end)
            if end > self.emitted:
                seg = self.segments[self.cursor]
                yield TextEvent(text[self.emitted : end], seg.model, self.cursor)
                self.emitted = end
            # Announce the next span once its text is about to be emitted (or at the end, even if it is empty).
            if has_next and (limit > seg_end or (final and self.emitted >= seg_end)):
                previous, self.cursor = self.segments[self.cursor], self.cursor + 1
                current = self.segments[self.cursor]
                yield SwitchEvent(previous.model, current.model, current.trigger, current.char_start, self.cursor)
            else:
                return


class Transcript:
    """Token ids, the model that wrote each one, the exact text and the segments of one generation."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        prompt_ids: Sequence[int],
        policy: RelayPolicy,
        stop: Sequence[str] = (),
    ) -> None:
        self.started = time.perf_counter()
        self.policy = policy
        self.stop = tuple(stop)
        self.prompt_len = len(prompt_ids)
        self.ids = list(prompt_ids)
        self.owners: list[ModelRole] = []  # which model wrote each kept completion token
        self.token_ends: list[int] = []  # character offset of the text after each kept token
        self.detok = IncrementalDetokenizer(tokenizer)
        self.segments = [Segment(policy.writer, "start", 0, 0, self.started)]
        self.emitter = Emitter(self.segments)
        self.stop_at: int | None = None  # where a stop sequence begins in the text, once one appeared
        self.rolled_back = 0

    @property
    def completion_tokens(self) -> int:
        return len(self.owners)

    def push(self, token: int, writer: ModelRole) -> Decision:
        """Adds one token written by ``writer`` and returns the policy's decision on it. A rollback has already been
        applied when this returns (the token is gone again); a stop sequence shows as ``stop_at``."""
        before = self.detok.snapshot()
        delta = self.detok.push(token)
        self.ids.append(token)
        self.owners.append(writer)
        self.token_ends.append(len(self.detok.text))
        decision = self.policy.observe(self.detok.text, delta)
        if decision.action == "rollback":
            # The look-ahead token belongs to the next writer's segment: it is dropped, and the next writer continues
            # from the sequence without it.
            self.ids.pop()
            self.owners.pop()
            self.token_ends.pop()
            self.detok.pop(before)
            self.rolled_back += 1
        if decision.action != "continue":
            now = time.perf_counter()
            self.segments[-1].closed = now
            self.segments.append(
                Segment(decision.to_model, decision.trigger, len(self.owners), len(self.detok.text), now)  # type: ignore[arg-type]
            )
        if self.stop and decision.action != "rollback":
            self.stop_at = find_stop(self.detok.text, len(self.detok.text) - len(delta), self.stop)
        return decision

    def release(self) -> Iterator[StreamEvent]:
        """Events for the text that is final now (a tail that could still become a stop sequence is held back)."""
        text = self.detok.text
        yield from self.emitter.release(text, len(text) - (stop_holdback(text, self.stop) if self.stop else 0))

    def finish(self, finish: FinishReason, **backend_usage: Any) -> Iterator[StreamEvent]:
        """The remaining text events and the FinalEvent. ``backend_usage`` are the Usage fields only the backend
        knows (prefill / catch-up / reused-prefix tokens, requests)."""
        if self.stop_at is None:
            self.detok.flush()
        text = self.detok.text if self.stop_at is None else self.detok.text[: self.stop_at]
        kept = len(self.owners)
        if self.stop_at is not None:
            # Keep the tokens whose text starts before the stop sequence; drop spans that would start inside it.
            stop_at = self.stop_at
            kept = sum(1 for j in range(len(self.token_ends)) if (self.token_ends[j - 1] if j else 0) < stop_at)
            while len(self.segments) > 1 and self.segments[-1].char_start >= stop_at:
                self.segments.pop()
        ended = self.segments[-1].closed = time.perf_counter()
        yield from self.emitter.release(text, len(text), final=True)
        spans = build_spans(self.segments, text, kept)
        usage = Usage(
            prompt_tokens=self.prompt_len,
            completion_tokens=kept,
            large_tokens=sum(1 for o in self.owners[:kept] if o == "large"),
            small_tokens=sum(1 for o in self.owners[:kept] if o == "small"),
            switches=len(spans) - 1,
            rolled_back_tokens=self.rolled_back,
            **backend_usage,
        )
        yield FinalEvent(
            RelayResult(
                text=text,
                spans=spans,
                usage=usage,
                finish_reason=finish,
                completion_ids=self.ids[self.prompt_len : self.prompt_len + kept],
                elapsed=ended - self.started,
            )
        )


def build_spans(segments: list[Segment], text: str, kept_tokens: int) -> list[Span]:
    spans: list[Span] = []
    for k, seg in enumerate(segments):
        nxt = segments[k + 1] if k + 1 < len(segments) else None
        char_end = min(nxt.char_start, len(text)) if nxt else len(text)
        token_end = min(nxt.token_start, kept_tokens) if nxt else kept_tokens
        start = min(seg.char_start, len(text))
        spans.append(
            Span(
                model=seg.model,
                trigger=seg.trigger,
                start=start,
                end=char_end,
                text=text[start:char_end],
                token_count=max(0, token_end - seg.token_start),
                duration=(seg.closed or seg.opened) - seg.opened,
            )
        )
    return spans
