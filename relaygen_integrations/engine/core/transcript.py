"""The completion under construction, token by token: backend-agnostic bookkeeping of a relay generation.

A backend only has to produce token ids for the current writer; :class:`Transcript` does the rest: exact incremental
text, the policy's decision after every token (dropping a rolled-back look-ahead token), the end of the generation
(end-of-sequence token, stop sequences across switches, the token budget), span boundaries, stream events, the
forward-pass accounting (prefill / catch-up tokens per model) and the final ``RelayResult``. Every backend feeds it
through :meth:`Transcript.feed` from the one loop in ``generate.py`` - the local runners, the remote endpoints and the
single-model completion server alike - so they cannot drift apart.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import asdict, dataclass, field

from transformers import PreTrainedTokenizerBase

from .detokenize import DetokenizerState, IncrementalDetokenizer
from .logprobs import LogprobLedger
from .policy import CONTINUE, Decision, RelayPolicy
from .spans import (
    FinalEvent,
    FinishReason,
    ModelRole,
    RelayResult,
    Span,
    StreamEvent,
    SwitchEvent,
    TextEvent,
    TokenLogprob,
    Usage,
)
from .verify import VerifyRule


@dataclass
class BackendUsage:
    """The Usage fields only a backend knows (the transcript counts the rest itself)."""

    reused_prefix_tokens: int = 0
    speculative_rounds: int = 0
    draft_tokens: int = 0
    accepted_draft_tokens: int = 0
    lookup_draft_tokens: int = 0
    lookup_accepted_tokens: int = 0
    requests: int = 0
    large_forward_seconds: float = 0.0
    small_forward_seconds: float = 0.0
    time_split: dict[str, float] = field(default_factory=dict)
    passes: dict[str, dict[int, int]] = field(default_factory=dict)
    pass_seconds: dict[str, dict[int, float]] = field(default_factory=dict)


@dataclass
class ForwardCounts:
    """The committed tokens one model forward-passed during a generation, by whose they were."""

    prefill: int = 0  # prompt tokens
    catchup: int = 0  # the other model's tokens
    own: int = 0  # its own tokens (a decode step forwards the token sampled the step before)


@dataclass
class Fed:
    """What :meth:`Transcript.feed` did with a batch of tokens: how many it kept and the policy's last decision."""

    pushed: int = 0
    decision: Decision = field(default=CONTINUE)


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

    def __init__(
        self, segments: list[Segment], logprobs_through: Callable[[int], tuple[TokenLogprob, ...]] | None = None
    ) -> None:
        self.segments = segments
        self.logprobs_through = logprobs_through  # the entries of tokens whose text ends by a character offset
        self.emitted = 0
        self.cursor = 0  # index of the segment whose text is being emitted

    def release(self, text: str, limit: int, final: bool = False) -> Iterator[StreamEvent]:
        while True:
            has_next = self.cursor + 1 < len(self.segments)
            seg_end = self.segments[self.cursor + 1].char_start if has_next else len(text)
            end = min(limit, seg_end)
            if end > self.emitted:
                seg = self.segments[self.cursor]
                entries = self.logprobs_through(end) if self.logprobs_through else ()
                yield TextEvent(text[self.emitted : end], seg.model, self.cursor, entries)
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
        eos_ids: frozenset[int] = frozenset(),
        max_new_tokens: int | None = None,
        verify: VerifyRule | None = None,
        logprobs: int | None = None,
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
        # Log probabilities (``logprobs``: the alternatives per token; None: not asked for), noted by the backend.
        self.logprobs = LogprobLedger(tokenizer, self.prompt_len, logprobs) if logprobs is not None else None
        self.emitter = Emitter(self.segments, self._logprobs_through if self.logprobs else None)
        self.stop_at: int | None = None  # where a stop sequence begins in the text, once one appeared
        self.rolled_back = 0
        self.eos_ids = eos_ids
        self.max_new_tokens = max_new_tokens
        self.finish_reason: FinishReason | None = None  # set once the generation has ended
        self.forwarded: dict[ModelRole, ForwardCounts] = {"large": ForwardCounts(), "small": ForwardCounts()}
        # Verified relay: the small model's tokens [run_start, run_end) await the large model's check; their text is
        # held back from the stream until then (run_end is None while the small model is still writing the run).
        self.verify = verify if policy.mode == "relay" else None
        self.run_start: int | None = None
        self.run_end: int | None = None
        self.detok_states: list[DetokenizerState] = []  # the detokenizer before each kept token, to cut back to
        self.verified = 0
        self.rejected = 0

    @property
    def completion_tokens(self) -> int:
        return len(self.owners)

    @property
    def matched_stop(self) -> str | None:
        """The stop sequence that ended the text (the first one given, where several start at the same place)."""
        if self.stop_at is None:
            return None
        return next(s for s in self.stop if self.detok.text.startswith(s, self.stop_at))

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def verification_due(self) -> bool:
        """A finished run of small-model tokens awaits the large model's check (before anyone writes on)."""
        return self.run_start is not None and self.run_end is not None

    @property
    def verification_pending(self) -> bool:
        return self.run_start is not None

    def pending_run(self) -> tuple[int, int]:
        """The completion-token range awaiting verification; at the end of the generation only the tokens the
        result keeps (those whose text starts before a stop sequence)."""
        assert self.run_start is not None
        end = self.run_end if self.run_end is not None else len(self.owners)
        if self.stop_at is not None:
            end = min(end, self._tokens_before(self.stop_at))
        return self.run_start, max(self.run_start, end)

    def settle_run(self, rejected: int | None) -> int | None:
        """Verified relay's verdict on :meth:`pending_run`, as the rule gave it from the backend's scores: the index
        within the run of the first token it rejects, or None. Keeps the run, or cuts it there (the large model
        writes on from the cut). Returns the completion-token index of the cut; None when the run was kept. The
        run's state lives here; a backend only scores (``LocalSession.verify``, ``RemoteSession.verify``)."""
        if rejected is None:
            self.accept_run()
            return None
        cut = self.pending_run()[0] + rejected
        self.reject_from(cut)
        return cut

    def accept_run(self) -> None:
        start, end = self.pending_run()
        self.verified += end - start
        self.run_start = self.run_end = None

    def reject_from(self, cut: int) -> None:
        """Verified relay: the large model rejected completion token ``cut``. It and everything after it are dropped
        (ids, owners, text, spans, stop state) and the large model writes from there; the generation is open again."""
        start, _end = self.pending_run()
        self.verified += cut - start
        self.rejected += len(self.owners) - cut
        state = self.detok_states[cut]
        del self.ids[self.prompt_len + cut :]
        del self.owners[cut:], self.token_ends[cut:], self.detok_states[cut:]
        self.detok.truncate(cut, state)
        while len(self.segments) > 1 and self.segments[-1].token_start >= cut:
            self.segments.pop()
        now = time.perf_counter()
        if self.segments[-1].model == "large":  # the whole small segment went: the large span before it goes on
            self.segments[-1].closed = None
        else:
            self.segments[-1].closed = now
            self.segments.append(Segment("large", "rejected", cut, len(self.detok.text), now))
        self.policy.resume_large(len(self.detok.text))
        self.run_start = self.run_end = None
        self.stop_at = None
        self.finish_reason = None

    def _logprobs_through(self, char: int) -> tuple[TokenLogprob, ...]:
        """The entries not handed out yet of the kept tokens whose text ends by character ``char`` (never of a run
        still awaiting verification)."""
        assert self.logprobs is not None
        count = self.logprobs.handed_out
        bound = self.run_start if self.run_start is not None else len(self.token_ends)
        while count < bound and self.token_ends[count] <= char:
            count += 1
        return self.logprobs.hand_out(count)

    def _tokens_before(self, char: int) -> int:
        """How many kept tokens have text that starts before character ``char``."""
        return sum(1 for j in range(len(self.token_ends)) if (self.token_ends[j - 1] if j else 0) < char)

    def _track_run(self) -> None:
        """After a switch: a run of small-model tokens to verify opens when the small model starts a sentence (or the
        answer, with ``+answer``) and closes when it hands over."""
        assert self.verify is not None
        state, writer = self.policy.state, self.policy.writer
        checked = writer == "small" and (state == "small_sentence" or (state == "answer" and self.verify.answer))
        if checked and self.run_start is None:
            self.run_start, self.run_end = len(self.owners), None
        elif not checked and self.run_start is not None and self.run_end is None:
            self.run_end = len(self.owners)

    def end(self, reason: FinishReason) -> None:
        """Ends the generation (a backend's own reason: the model ended, cancelled, nothing more to write)."""
        if self.finish_reason is None:
            self.finish_reason = reason

    def feed(self, tokens: Sequence[int], writer: ModelRole) -> Generator[StreamEvent, None, Fed]:
        """Pushes ``tokens`` written by ``writer`` one by one, yielding the text each makes final. Stops early at an
        end-of-sequence token, a stop sequence, the token budget (each ends the generation) or a decision to switch
        (what follows was written for the previous writer and is discarded). Returns what it kept and decided."""
        fed = Fed()
        for token in tokens:
            if self.finish_reason is not None:
                break
            if token in self.eos_ids:
                self.end("stop")
                break
            fed.decision = self.push(token, writer)
            fed.pushed += 1
            if self.stop_at is not None:
                self.end("stop_sequence")
                break
            yield from self.release()
            if fed.decision.action != "continue":
                break
            if self.max_new_tokens is not None and len(self.owners) >= self.max_new_tokens:
                self.end("length")
        if self.max_new_tokens is not None and len(self.owners) >= self.max_new_tokens:
            self.end("length")
        return fed

    def account_forward(self, role: ModelRole, start: int, end: int) -> None:
        """Counts a forward pass of ``role``'s model over the sequence's ids ``[start, end)``: prompt tokens are
        prefill, the other model's tokens catch-up. Runners and endpoints report positions only; whose tokens
        they were is known here."""
        counts = self.forwarded[role]
        counts.prefill += max(0, min(end, self.prompt_len) - start)
        for owner in self.owners[max(0, start - self.prompt_len) : max(0, end - self.prompt_len)]:
            if owner == role:
                counts.own += 1
            else:
                counts.catchup += 1

    def push(self, token: int, writer: ModelRole) -> Decision:
        """Adds one token written by ``writer`` and returns the policy's decision on it. A rollback has already been
        applied when this returns (the token is gone again); a stop sequence shows as ``stop_at``."""
        before = self.detok.snapshot()
        delta = self.detok.push(token)
        self.detok_states.append(before)
        self.ids.append(token)
        self.owners.append(writer)
        self.token_ends.append(len(self.detok.text))
        state = self.policy.state
        decision = self.policy.observe(self.detok.text, delta)
        if decision.action == "rollback":
            # The look-ahead token belongs to the next writer's segment: it is dropped, and the next writer continues
            # from the sequence without it.
            self.ids.pop()
            self.owners.pop()
            self.token_ends.pop()
            self.detok_states.pop()
            self.detok.pop(before)
            self.rolled_back += 1
        if decision.action != "continue":
            now = time.perf_counter()
            self.segments[-1].closed = now
            self.segments.append(
                Segment(decision.to_model, decision.trigger, len(self.owners), len(self.detok.text), now)  # type: ignore[arg-type]
            )
        if self.verify is not None and (decision.action != "continue" or self.policy.state != state):
            self._track_run()  # a state change without a new writer too: the small model going on into the answer
        if self.stop and decision.action != "rollback":
            self.stop_at = find_stop(self.detok.text, len(self.detok.text) - len(delta), self.stop)
        return decision

    def release(self) -> Iterator[StreamEvent]:
        """Events for the text that is final now (a tail that could still become a stop sequence is held back, and so
        is small-model text the large model has not verified yet)."""
        text = self.detok.text
        limit = len(text) - (stop_holdback(text, self.stop) if self.stop else 0)
        if self.run_start is not None:
            limit = min(limit, self.token_ends[self.run_start - 1] if self.run_start else 0)
        yield from self.emitter.release(text, limit)

    def finish(self, backend_usage: BackendUsage | None = None) -> Iterator[StreamEvent]:
        """The remaining text events and the FinalEvent. ``backend_usage``: the Usage fields only the backend knows
        (reused-prefix tokens, speculation counters, requests, forward time)."""
        finish: FinishReason = self.finish_reason or "length"
        if self.stop_at is None:
            self.detok.flush()
        text = self.detok.text if self.stop_at is None else self.detok.text[: self.stop_at]
        kept = len(self.owners)
        if self.stop_at is not None:
            # Keep the tokens whose text starts before the stop sequence; drop spans that would start inside it.
            stop_at = self.stop_at
            kept = self._tokens_before(stop_at)
            while len(self.segments) > 1 and self.segments[-1].char_start >= stop_at:
                self.segments.pop()
        ended = self.segments[-1].closed = time.perf_counter()
        yield from self.emitter.release(text, len(text), final=True)
        if self.logprobs is not None and (rest := self.logprobs.hand_out(kept)):
            # Tokens whose text ends past the last piece (a stop sequence cut it) or adds no character of its own.
            yield TextEvent("", self.segments[-1].model, self.emitter.cursor, rest)
        spans = build_spans(self.segments, text, kept)
        usage = Usage(
            prompt_tokens=self.prompt_len,
            completion_tokens=kept,
            large_tokens=sum(1 for o in self.owners[:kept] if o == "large"),
            small_tokens=sum(1 for o in self.owners[:kept] if o == "small"),
            switches=len(spans) - 1,
            rolled_back_tokens=self.rolled_back,
            verified_tokens=self.verified,
            rejected_tokens=self.rejected,
            large_prefill_tokens=self.forwarded["large"].prefill,
            small_prefill_tokens=self.forwarded["small"].prefill,
            large_catchup_tokens=self.forwarded["large"].catchup,
            small_catchup_tokens=self.forwarded["small"].catchup,
            **asdict(backend_usage or BackendUsage()),
        )
        yield FinalEvent(
            RelayResult(
                text=text,
                spans=spans,
                usage=usage,
                finish_reason=finish,
                completion_ids=self.ids[self.prompt_len : self.prompt_len + kept],
                token_ends=self.token_ends[:kept],
                elapsed=ended - self.started,
                logprobs=self.logprobs.kept(kept) if self.logprobs is not None else None,
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
