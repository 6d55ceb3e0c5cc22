"""A call from inside an open stream of the same engine never waits forever: from the same thread (a stream loop, a
token callback) it fails at once naming the open stream; from another thread or task it waits its turn and runs.

"At once" is checked without a clock: the engine lock is swapped for one that fails a request the moment it would
have to wait (:class:`NeverWaits`), and a generation is held mid-way by a forward-pass gate where a test needs the
engine busy. Watchdogs are 30 s: there only to turn a hang into a failure, never to time anything."""

from __future__ import annotations

import asyncio
import gc
import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch
from helpers import PROMPT, PassGate, chat_engine
from langchain_core.callbacks import BaseCallbackHandler

from relaygen_integrations import RelayEngine
from relaygen_integrations.engine import EngineBusyError
from relaygen_integrations.langchain import RelayChatModel

REPLY = "We add two and three. So the answer is five. Then we are done."


@pytest.fixture
def engine(tokenizer) -> RelayEngine:
    return chat_engine(tokenizer, REPLY, cues=["So "])


HANG_SECONDS = 30  # how long a watchdog waits before calling a wait a hang; nothing here is expected to take 1 s


def within(seconds: float, work: Callable[[], Any]) -> Any:
    """Runs ``work`` on a watchdog thread, so that a regression fails the test instead of hanging the suite."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = work()
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still waiting after {seconds} s: a deadlock"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def test_a_call_inside_a_stream_loop_fails_at_once_naming_the_stream(engine):
    def nested() -> tuple[int, list[BaseException]]:
        events, errors = 0, []
        for _event in engine.stream(PROMPT, max_new_tokens=5):
            events += 1
            try:
                engine.generate(PROMPT, max_new_tokens=3)
            except EngineBusyError as exc:
                errors.append(exc)
        return events, errors

    events, errors = within(HANG_SECONDS, nested)
    assert events > 1 and len(errors) == events  # every nested call failed (a 5-token stream has several events)
    assert all(isinstance(e, RuntimeError) for e in errors)
    assert "a relay request for 5 tokens" in str(errors[0]) and "stream.close()" in str(errors[0])
    # Once the stream is done the engine is free again, in this thread and any other.
    assert within(HANG_SECONDS, lambda: engine.generate(PROMPT, max_new_tokens=3).usage.completion_tokens) == 3


class WatchedLock:
    """Stands in for the engine lock's inner lock: says when a thread had to wait for it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.waited = threading.Event()

    def __enter__(self) -> WatchedLock:
        if not self._lock.acquire(blocking=False):
            self.waited.set()
            self._lock.acquire()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._lock.release()


class NeverWaits:
    """Stands in for the engine lock's inner lock where no request may wait: a request that would have to wait fails
    at once with an AssertionError (raised in whichever thread tried, and so reaching the test through the call),
    where the real lock would block - so a regression fails the test at once instead of being timed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def __enter__(self) -> NeverWaits:
        if not self._lock.acquire(blocking=False):
            raise AssertionError("a request waited for the engine lock, where it should have failed at once")
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._lock.release()


def models(engine: RelayEngine) -> list[torch.nn.Module]:
    return [runner.model for runner in engine.backend.runners.values()]


def test_an_open_stream_holds_the_engine_until_closed_or_collected(engine):
    watched = WatchedLock()
    engine._lock._lock = watched  # a request the open stream holds up is seen waiting, not timed
    stream = engine.stream(PROMPT, max_new_tokens=30)
    next(stream)
    waited: dict[str, int] = {}
    other = threading.Thread(
        target=lambda: waited.update(n=engine.generate(PROMPT, max_new_tokens=2).usage.completion_tokens)
    )
    other.start()
    assert watched.waited.wait(HANG_SECONDS), "another thread's request queues behind the open stream"
    assert waited == {}  # and has not run
    stream.close()
    other.join(HANG_SECONDS)
    assert waited == {"n": 2}
    # An abandoned stream that is garbage-collected releases the engine too.
    dropped = engine.stream(PROMPT, max_new_tokens=30)
    next(dropped)
    del dropped
    gc.collect()
    assert within(HANG_SECONDS, lambda: engine.generate(PROMPT, max_new_tokens=2).usage.completion_tokens) == 2


async def test_an_async_call_inside_an_async_stream_waits_its_turn_and_runs(engine):
    async def nested() -> list[int]:
        inner = []
        async for _event in engine.astream(PROMPT, max_new_tokens=5):
            inner.append((await engine.agenerate(PROMPT, max_new_tokens=2)).usage.completion_tokens)
        return inner

    assert set(await asyncio.wait_for(nested(), timeout=HANG_SECONDS)) == {2}


class CallsTheModelOnEachToken(BaseCallbackHandler):
    def __init__(self, model: RelayChatModel) -> None:
        self.model = model
        self.errors: list[BaseException] = []

    def on_llm_new_token(self, token: str, **kwargs: Any) -> None:
        if self.errors:
            return
        try:
            self.model.invoke("Nested question", max_tokens=2)
        except BaseException as exc:
            self.errors.append(exc)


def test_a_langchain_token_callback_calling_the_same_model_does_not_hang(engine):
    model = RelayChatModel(engine=engine, streaming=True, max_tokens=40)
    handler = CallsTheModelOnEachToken(model)
    message = within(HANG_SECONDS, lambda: model.invoke("Add two and three.", config={"callbacks": [handler]}))
    assert message.content == "We add two and three. So THE ANSWER IS FIVE. Then we are done."
    assert len(handler.errors) == 1 and isinstance(handler.errors[0], EngineBusyError)
    assert within(HANG_SECONDS, lambda: model.invoke("Again", max_tokens=3).content) == "We add two"


# -- sync and async on one thread: a typed error at once, never a wait -------------------------------------------------
def test_an_async_call_from_a_thread_with_an_open_sync_stream_fails_at_once(engine):
    engine._lock._lock = NeverWaits()  # the async call's worker must not queue behind this thread's own stream

    def nested() -> list[BaseException]:
        errors = []
        stream = engine.stream(PROMPT, max_new_tokens=5)
        next(stream)
        try:
            asyncio.run(engine.agenerate(PROMPT, max_new_tokens=2))
        except EngineBusyError as exc:
            errors.append(exc)
        stream.close()
        return errors

    errors = within(HANG_SECONDS, nested)
    assert len(errors) == 1 and "an async call here would wait" in str(errors[0])
    after = within(HANG_SECONDS, lambda: asyncio.run(engine.agenerate(PROMPT, max_new_tokens=2)))
    assert after.usage.completion_tokens == 2


async def test_a_sync_call_inside_an_async_stream_on_the_loop_fails_at_once(engine):
    engine._lock._lock = NeverWaits()  # a sync call on the loop must not block it waiting for the stream
    # The stream's worker writes its first token (passes 1-2: the prompt up to its last token, then that token; one
    # event) and is held at pass 3, so the stream is surely still running - holding the engine - when this loop makes
    # its call, however fast or slow the machine.
    gate = PassGate(*models(engine), hold_at=3, allowed=10**6, timeout=HANG_SECONDS)
    errors = []
    try:
        async for _event in engine.astream(PROMPT, max_new_tokens=5):
            assert engine._lock.holder.startswith("a relay request for 5 tokens")  # the stream holds the engine
            try:
                engine.generate(PROMPT, max_new_tokens=2)  # would block this loop until the stream ends
            except EngineBusyError as exc:
                errors.append(exc)
            break
    finally:
        gate.release()
        gate.remove()
    assert len(errors) == 1 and "await engine.agenerate" in str(errors[0])


def test_langchain_ainvoke_while_a_stream_of_the_model_is_open_fails_at_once(engine):
    model = RelayChatModel(engine=engine, max_tokens=5)
    engine._lock._lock = NeverWaits()  # the nested call must not queue behind this thread's own stream

    def nested() -> BaseException | None:
        stream = model.stream("Add two and three.")
        next(stream)
        try:
            asyncio.run(model.ainvoke("Nested", max_tokens=2))
        except EngineBusyError as exc:
            return exc
        finally:
            stream.close()
        return None

    assert isinstance(within(HANG_SECONDS, nested), EngineBusyError)


async def test_an_async_stream_dropped_without_aclose_frees_the_engine(engine, monkeypatch):
    cancels: list[threading.Event] = []
    run_plan = engine.run_plan

    def run_plan_seen(*args: Any, **kwargs: Any) -> Any:
        cancels.append(kwargs["cancel"] if "cancel" in kwargs else args[1])  # the worker's stop flag, to watch
        return run_plan(*args, **kwargs)

    monkeypatch.setattr(engine, "run_plan", run_plan_seen)
    # The worker writes the first token (passes 1-2: the prompt up to its last token, then that token) and is held
    # at pass 3: the stream cannot end by itself meanwhile.
    gate = PassGate(*models(engine), hold_at=3, allowed=1, timeout=HANG_SECONDS)
    try:
        dropped = engine.astream(PROMPT, max_new_tokens=4000)
        await dropped.__anext__()
        await asyncio.to_thread(gate.wait_held)
        del dropped  # no aclose(): the loop finalizes the generator, which sets the worker's stop flag
        (cancel,) = cancels
        assert await asyncio.to_thread(cancel.wait, HANG_SECONDS), "the dropped stream never told its worker to stop"
        gate.release()
        worker = gate.thread
        assert worker is not None
        await asyncio.to_thread(worker.join, HANG_SECONDS)
        assert not worker.is_alive(), "the dropped stream's worker still runs"
    finally:
        gate.release()
        gate.remove()
    assert not gate.overran, f"{gate.after_release()} forward passes ran after the stream was dropped"
    # Its worker stopped within one step and freed the engine: a new request runs.
    result = await asyncio.wait_for(engine.agenerate(PROMPT, max_new_tokens=2), timeout=HANG_SECONDS)
    assert result.usage.completion_tokens == 2
