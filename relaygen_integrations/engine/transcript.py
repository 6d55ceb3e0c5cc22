"""The completion under construction, token by token: backend-agnostic bookkeeping of a relay generation.

A backend only has to produce token ids for the current writer; :class:`Transcript` does the rest exactly as the local
loop in ``generate.py`` does: exact incremental text, the policy's decision after every token (dropping a rolled-back
look-ahead token), stop sequences across switches, span boundaries, stream events, and the final ``RelayResult``.
The remote backend (``remote.py``) drives it with tokens streamed from OpenAI-compatible servers.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any

from transformers import PreTrainedTokenizerBase

from .detokenize import IncrementalDetokenizer
from .generate import Emitter, Segment, build_spans, find_stop, stop_holdback
from .policy import Decision, RelayPolicy
from .spans import FinalEvent, FinishReason, ModelRole, RelayResult, StreamEvent, Usage


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
