"""The relay generation loop, written as small explicit functions in the spirit of gpt-fast's ``generate.py``.

One loop serves every mode: ``relay`` alternates between the two runners as the policy says; ``large``/``small`` run
one model alone through the very same code (the baselines). Per step::

    writer = policy.writer
    logits = runners[writer].logits_for(ids)   # catch-up pass if the writer missed tokens, else one decode step
    token  = sampler(logits)                   # greedy or seeded sampling
    delta  = detokenizer.push(token)           # exact incremental text
    policy.observe(text, delta)                # continue / switch / rollback the look-ahead token

Text is released to the caller only when it is final: a look-ahead token is decided before its text is emitted,
and a tail that could still become a stop sequence is held back.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from transformers import PreTrainedTokenizerBase

from .detokenize import IncrementalDetokenizer
from .policy import RelayPolicy
from .runner import ModelRunner
from .sampling import Sampler
from .spans import FinalEvent, FinishReason, ModelRole, RelayResult, Span, StreamEvent, SwitchEvent, TextEvent, Usage
from .speculative import DraftLength, SpeculationStats, speculative_step


@dataclass
class Speculation:
    """Per-request speculative-decoding state: the adaptive draft length and the acceptance counters."""

    length: DraftLength
    stats: SpeculationStats = field(default_factory=SpeculationStats)


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


def relay_stream(
    runners: dict[ModelRole, ModelRunner],
    tokenizer: PreTrainedTokenizerBase,
    prompt_ids: list[int],
    policy: RelayPolicy,
    sampler: Sampler,
    max_new_tokens: int,
    eos_ids: frozenset[int],
    stop: Sequence[str] = (),
    cancel: threading.Event | None = None,
    reuse_prefix: bool = True,
    reprefill_segments: bool = False,
    speculation: Speculation | None = None,
) -> Iterator[StreamEvent]:
    """Generates up to ``max_new_tokens`` kept tokens; yields TextEvent/SwitchEvent as text becomes final, then one
    FinalEvent. Closing the iterator early stops generation after the current step with both caches consistent.

    ``reprefill_segments`` emulates RelayGen's original serving (each segment a fresh API call without prefix
    caching): the model taking over forgets its cache and re-reads prompt + text so far. A baseline, never faster.

    ``speculation``: the large model's tokens come from draft-and-verify rounds with the small model (lossless).
    """
    started = time.perf_counter()
    prompt_len = len(prompt_ids)
    ids = list(prompt_ids)
    owners: list[ModelRole] = []  # which model wrote each kept completion token
    token_ends: list[int] = []  # character offset of the text after each kept token
    detok = IncrementalDetokenizer(tokenizer)
    segments = [Segment(policy.writer, "start", 0, 0, started)]
    emitter = Emitter(segments)
    finish: FinishReason = "length"
    stop_at: int | None = None
    rolled_back = 0
    for runner in runners.values():
        runner.begin_request(prompt_ids, reuse_prefix)

    try:
        while len(owners) < max_new_tokens and finish == "length":
            if cancel is not None and cancel.is_set():
                finish = "cancelled"
                break
            writer = policy.writer
            if speculation is not None and writer == "large":
                # Draft-and-verify: several tokens, each the large model's own choice; fed to the policy one by one
                # below, and whatever follows a switch is discarded (caches cropped after the loop).
                tokens = speculative_step(
                    runners["large"], runners["small"], ids, prompt_len, owners, sampler, speculation.length,
                    max_new_tokens - len(owners), eos_ids, speculation.stats,
                )  # fmt: skip
            else:
                tokens = [sampler(runners[writer].logits_for(ids, prompt_len, owners), ids)]
            for token in tokens:
                if len(owners) >= max_new_tokens:
                    break
                if token in eos_ids:
                    finish = "stop"
                    break
                before = detok.snapshot()
                delta = detok.push(token)
                ids.append(token)
                owners.append(writer)
                token_ends.append(len(detok.text))
                decision = policy.observe(detok.text, delta)
                if decision.action == "rollback":
                    # The look-ahead token belongs to the next writer's segment: without speculation it never reached
                    # a cache, so dropping it from the sequence is the whole rollback (sync_to handles drafts).
                    ids.pop()
                    owners.pop()
                    token_ends.pop()
                    detok.pop(before)
                    rolled_back += 1
                if decision.action != "continue":
                    if reprefill_segments:
                        runners[decision.to_model].reset()  # type: ignore[index]
                    now = time.perf_counter()
                    segments[-1].closed = now
                    segments.append(Segment(decision.to_model, decision.trigger, len(owners), len(detok.text), now))  # type: ignore[arg-type]
                if stop and decision.action != "rollback":
                    stop_at = find_stop(detok.text, len(detok.text) - len(delta), stop)
                    if stop_at is not None:
                        finish = "stop_sequence"
                        break
                text = detok.text
                yield from emitter.release(text, len(text) - (stop_holdback(text, stop) if stop else 0))
                if decision.action != "continue":
                    break  # the rest of a speculative run was written for the previous writer
            if speculation is not None:
                for runner in runners.values():
                    runner.sync_to(ids)
    except BaseException as exc:
        if not isinstance(exc, GeneratorExit):
            # A failed forward pass may leave a cache half-written: forget both caches rather than trust them.
            for runner in runners.values():
                runner.reset()
        raise

    if stop_at is None:
        detok.flush()
    text = detok.text if stop_at is None else detok.text[:stop_at]
    kept = len(owners)
    if stop_at is not None:
        # Keep the tokens whose text starts before the stop sequence; drop spans that would start inside it.
        kept = sum(1 for j in range(len(token_ends)) if (token_ends[j - 1] if j else 0) < stop_at)
        while len(segments) > 1 and segments[-1].char_start >= stop_at:
            segments.pop()
    ended = segments[-1].closed = time.perf_counter()
    yield from emitter.release(text, len(text), final=True)

    spans = build_spans(segments, text, kept)
    large_stats = runners["large"].stats if "large" in runners else None
    small_stats = runners["small"].stats if "small" in runners else None
    usage = Usage(
        prompt_tokens=prompt_len,
        completion_tokens=kept,
        large_tokens=sum(1 for o in owners[:kept] if o == "large"),
        small_tokens=sum(1 for o in owners[:kept] if o == "small"),
        switches=len(spans) - 1,
        large_prefill_tokens=large_stats.prefill_tokens if large_stats else 0,
        small_prefill_tokens=small_stats.prefill_tokens if small_stats else 0,
        large_catchup_tokens=large_stats.catchup_tokens if large_stats else 0,
        small_catchup_tokens=small_stats.catchup_tokens if small_stats else 0,
        reused_prefix_tokens=sum(r.stats.reused_tokens for r in runners.values()),
        rolled_back_tokens=rolled_back,
        speculative_rounds=speculation.stats.rounds if speculation else 0,
        draft_tokens=speculation.stats.drafted if speculation else 0,
        accepted_draft_tokens=speculation.stats.accepted if speculation else 0,
    )
    result = RelayResult(
        text=text,
        spans=spans,
        usage=usage,
        finish_reason=finish,
        completion_ids=ids[prompt_len : prompt_len + kept],
        elapsed=ended - started,
    )
    yield FinalEvent(result)


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
