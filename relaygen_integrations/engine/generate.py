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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from transformers import PreTrainedTokenizerBase

from .policy import RelayPolicy
from .runner import ModelRunner
from .sampling import Sampler
from .spans import FinishReason, ModelRole, StreamEvent
from .speculative import DEFAULT_DRAFT_CONFIDENCE, DraftLength, SpeculationStats, speculative_step
from .transcript import Transcript


@dataclass
class Speculation:
    """Per-request speculative-decoding state: the adaptive draft length, the confidence below which a draft stops,
    and the acceptance counters."""

    length: DraftLength
    min_confidence: float = DEFAULT_DRAFT_CONFIDENCE
    stats: SpeculationStats = field(default_factory=SpeculationStats)


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
    transcript = Transcript(tokenizer, prompt_ids, policy, stop)
    ids, owners, prompt_len = transcript.ids, transcript.owners, transcript.prompt_len  # live views, for the runners
    finish: FinishReason = "length"
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
                    max_new_tokens - len(owners), eos_ids, speculation.stats, speculation.min_confidence,
                )  # fmt: skip
            else:
                tokens = [sampler(runners[writer].logits_for(ids, prompt_len, owners), ids)]
            for token in tokens:
                if len(owners) >= max_new_tokens:
                    break
                if token in eos_ids:
                    finish = "stop"
                    break
                # A rolled-back look-ahead token never reached a cache without speculation (a token is forwarded
                # only when the next one is generated), so dropping it from ``ids`` is the whole rollback.
                decision = transcript.push(token, writer)
                if decision.action != "continue" and reprefill_segments:
                    runners[decision.to_model].reset()  # type: ignore[index]
                if transcript.stop_at is not None:
                    finish = "stop_sequence"
                    break
                yield from transcript.release()
                if decision.action != "continue":
                    break  # the rest of a speculative run was written for the previous writer
            if speculation is not None:
                for runner in runners.values():
                    runner.sync_to(ids)  # drop rejected drafts and a discarded tail from both caches
    except BaseException as exc:
        if not isinstance(exc, GeneratorExit):
            # A failed forward pass may leave a cache half-written: forget both caches rather than trust them.
            for runner in runners.values():
                runner.reset()
        raise

    large_stats = runners["large"].stats if "large" in runners else None
    small_stats = runners["small"].stats if "small" in runners else None
    yield from transcript.finish(
        finish,
        large_prefill_tokens=large_stats.prefill_tokens if large_stats else 0,
        small_prefill_tokens=small_stats.prefill_tokens if small_stats else 0,
        large_catchup_tokens=large_stats.catchup_tokens if large_stats else 0,
        small_catchup_tokens=small_stats.catchup_tokens if small_stats else 0,
        reused_prefix_tokens=sum(r.stats.reused_tokens for r in runners.values()),
        speculative_rounds=speculation.stats.rounds if speculation else 0,
        draft_tokens=speculation.stats.drafted if speculation else 0,
        accepted_draft_tokens=speculation.stats.accepted if speculation else 0,
        large_forward_seconds=large_stats.forward_seconds if large_stats else 0.0,
        small_forward_seconds=small_stats.forward_seconds if small_stats else 0.0,
    )
