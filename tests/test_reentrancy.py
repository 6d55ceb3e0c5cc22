"""A call from inside an open stream of the same engine never waits forever: from the same thread (a stream loop, a
token callback) it fails at once naming the open stream; from another thread or task it waits its turn and runs."""

from __future__ import annotations

import asyncio
import gc
import threading
from collections.abc import Callable
from typing import Any

import pytest
from helpers import PROMPT, chat_engine
from langchain_core.callbacks import BaseCallbackHandler

from relaygen_integrations import RelayEngine
from relaygen_integrations.engine import EngineBusyError
from relaygen_integrations.langchain import RelayChatModel

REPLY = "We add two and three. So the answer is five. Then we are done."


@pytest.fixture
def engine(tokenizer) -> RelayEngine:
    return chat_engine(tokenizer, REPLY, cues=["So "])


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

    events, errors = within(30, nested)
    assert events > 1 and len(errors) == events  # every nested call failed (a 5-token stream has several events)
    assert all(isinstance(e, RuntimeError) for e in errors)
    assert "a relay request for 5 tokens" in str(errors[0]) and "stream.close()" in str(errors[0])
    # Once the stream is done the engine is free again, in this thread and any other.
    assert within(30, lambda: engine.generate(PROMPT, max_new_tokens=3).usage.completion_tokens) == 3


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
    assert watched.waited.wait(30), "another thread's request queues behind the open stream"
    assert waited == {}  # and has not run
    stream.close()
    other.join(30)
    assert waited == {"n": 2}
    # An abandoned stream that is garbage-collected releases the engine too.
    dropped = engine.stream(PROMPT, max_new_tokens=30)
    next(dropped)
    del dropped
    gc.collect()
    assert within(30, lambda: engine.generate(PROMPT, max_new_tokens=2).usage.completion_tokens) == 2


async def test_an_async_call_inside_an_async_stream_waits_its_turn_and_runs(engine):
    async def nested() -> list[int]:
        inner = []
        async for _event in engine.astream(PROMPT, max_new_tokens=5):
            inner.append((await engine.agenerate(PROMPT, max_new_tokens=2)).usage.completion_tokens)
        return inner

    assert set(await asyncio.wait_for(nested(), timeout=30)) == {2}


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
    message = within(30, lambda: model.invoke("Add two and three.", config={"callbacks": [handler]}))
    assert message.content == "We add two and three. So THE ANSWER IS FIVE. Then we are done."
    assert len(handler.errors) == 1 and isinstance(handler.errors[0], EngineBusyError)
    assert within(30, lambda: model.invoke("Again", max_tokens=3).content) == "We add two"


# -- sync and async on one thread: a typed error at once, never a wait -------------------------------------------------
def test_an_async_call_from_a_thread_with_an_open_sync_stream_fails_at_once(engine):
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

    errors = within(1, nested)
    assert len(errors) == 1 and "an async call here would wait" in str(errors[0])
    assert within(30, lambda: asyncio.run(engine.agenerate(PROMPT, max_new_tokens=2)).usage.completion_tokens) == 2


async def test_a_sync_call_inside_an_async_stream_on_the_loop_fails_at_once(engine):
    errors = []
    started = asyncio.get_running_loop().time()
    async for _event in engine.astream(PROMPT, max_new_tokens=5):
        try:
            engine.generate(PROMPT, max_new_tokens=2)  # would block this loop until the stream ends
        except EngineBusyError as exc:
            errors.append(exc)
        break
    assert asyncio.get_running_loop().time() - started < 1
    assert len(errors) == 1 and "await engine.agenerate" in str(errors[0])


def test_langchain_ainvoke_while_a_stream_of_the_model_is_open_fails_at_once(engine):
    model = RelayChatModel(engine=engine, max_tokens=5)

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

    assert isinstance(within(1, nested), EngineBusyError)


async def test_an_async_stream_dropped_without_aclose_frees_the_engine(engine):
    dropped = engine.astream(PROMPT, max_new_tokens=4000)
    await dropped.__anext__()
    del dropped  # no aclose(): the loop finalizes the generator, which stops its worker within one step
    result = await asyncio.wait_for(engine.agenerate(PROMPT, max_new_tokens=2), timeout=5)
    assert result.usage.completion_tokens == 2
