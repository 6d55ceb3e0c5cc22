"""The generation loop, written as small explicit functions in the spirit of gpt-fast's ``generate.py``.

One loop (:func:`drive`) serves every backend and every mode: ``relay`` alternates between the two models as the
policy says; ``large``/``small`` run one model alone through the very same code (the baselines). Per round::

    writer = policy.writer
    step = session.next_tokens(writer)     # local: a decode step (a catch-up pass if the writer missed tokens) or a
                                           # speculative round; remote: a streamed chunk
    record(transcript, step)               # its passes, log probabilities, a backend's own end
    fed = yield from transcript.feed(step.tokens, writer)   # text, policy decision, stops, budget, final text events
    session.after_feed(fed)                # crop caches / close the request when the writer changed

The sessions only read the transcript; this loop is its only writer.

Text is released to the caller only when it is final: a look-ahead token is decided before its text is emitted,
and a tail that could still become a stop sequence is held back.

Every backend's session (``GenerationSession``) plugs into it: ``engine/local/session.py``,
``engine/remote/backend.py``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

from .backend import GenerationSession, Step
from .spans import StreamEvent
from .transcript import Transcript


def record(transcript: Transcript, step: Step) -> None:
    """A step's facts before its tokens: the passes (classified by the owners of the positions they read, as they
    stood when the passes ran), the log probabilities, a backend's own end."""
    for role, start, end in step.passes:
        transcript.account_forward(role, start, end)
    if transcript.logprobs is not None:
        for position, token, logprob, model, top in step.logprobs:
            transcript.logprobs.note(position, token, logprob, model, top)
    if step.end is not None:
        transcript.end(step.end)


def settle(transcript: Transcript, verdict: Step) -> None:
    """Verified relay's verdict: the passes that scored the run, the run kept or cut, then the large model's log
    probability at the cut (noted for the kept sequence)."""
    record(transcript, Step(passes=verdict.passes))
    transcript.settle_run(verdict.rejected)
    record(transcript, Step(logprobs=verdict.logprobs, end=verdict.end))


def drive(
    transcript: Transcript, session: GenerationSession, cancel: threading.Event | None = None
) -> Iterator[StreamEvent]:
    """Runs one generation to its end; yields TextEvent/SwitchEvent as text becomes final, then one FinalEvent.
    Closing the iterator early stops after the current round, with the backend's state consistent."""
    try:
        while True:
            while not transcript.finished:
                if cancel is not None and cancel.is_set():
                    transcript.end("cancelled")
                    break
                if transcript.verification_due:
                    settle(transcript, session.verify())  # a finished small run is checked before anyone writes on
                    continue
                writer = transcript.policy.writer
                step = session.next_tokens(writer)
                record(transcript, step)
                fed = yield from transcript.feed(step.tokens, writer)
                session.after_feed(fed)
            if transcript.finish_reason == "cancelled" or not transcript.verification_pending:
                break
            settle(transcript, session.verify())  # the end came inside a small run: a rejection reopens it
            if transcript.finished:
                break
    except BaseException as exc:
        session.close(failed=not isinstance(exc, GeneratorExit))
        raise
    session.close(failed=False)
    yield from transcript.finish(session.usage())
