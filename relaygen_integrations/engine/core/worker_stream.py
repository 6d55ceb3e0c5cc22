"""A blocking event stream run on a worker thread and read from an event loop, which it never blocks.

The engine's models run in plain threads (a CPU-bound generation in the loop would stop every other task), so the
async entry points hand the sync stream to a worker and pass its items back through ``call_soon_threadsafe`` into an
unbounded queue: the worker never waits for the consumer, and the consumer's cancellation (or closing, or dropping
the iterator, which the loop then finalizes) sets the flag the stream checks between decode steps.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")


class _Failure:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


_DONE = object()


async def stream_on_worker(
    run: Callable[[threading.Event], Iterator[T]], name: str = "relaygen-generate"
) -> AsyncIterator[T]:
    """The items of ``run(cancel)``, produced on a daemon thread; ``cancel`` is set once the consumer stops."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[Any] = asyncio.Queue()
    cancel = threading.Event()

    def deliver(item: Any) -> None:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, item)
        except RuntimeError:  # the loop closed under us: nobody is listening any more
            cancel.set()

    def work() -> None:
        try:
            for item in run(cancel):
                deliver(item)
        except BaseException as exc:
            deliver(_Failure(exc))
        finally:
            deliver(_DONE)

    threading.Thread(target=work, name=name, daemon=True).start()
    try:
        while True:
            item = await queue.get()
            if item is _DONE:
                return
            if isinstance(item, _Failure):
                raise item.exc
            yield item
    finally:
        cancel.set()
