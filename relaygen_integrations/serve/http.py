"""What both HTTP servers share: OpenAI-shaped errors, API-key auth, server-sent events, the model card, running."""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

from fastapi import Depends, FastAPI, Header, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from ..engine.remote.endpoint import EndpointError

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
T = TypeVar("T")
# What nginx logs for a request whose client closed the connection first; nobody reads it but the access log.
CLIENT_CLOSED_REQUEST = 499


class ClientDisconnected(Exception):
    """The HTTP client went away before its answer was ready; the work for it was stopped."""


async def wait_for_disconnect(request: Request) -> None:
    """Returns once the client disconnects. The body was read before the handler ran, so the next ASGI message a
    request gets is its disconnect (sent when the connection drops, or once the response is complete)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(
    work: Awaitable[T], request: Request, on_disconnect: Callable[[], None] | None = None
) -> T:
    """Awaits ``work`` unless the client disconnects first: then ``on_disconnect`` runs (e.g. sets a cancel flag a
    generation checks between steps), ``work`` is cancelled and :class:`ClientDisconnected` raised. A non-streaming
    request would otherwise keep the engine busy for a client that left."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(wait_for_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            if on_disconnect is not None:
                on_disconnect()
            task.cancel()
            with contextlib.suppress(BaseException):  # whatever the cancelled work raises, nobody is waiting for it
                await task
    if task.cancelled():
        raise ClientDisconnected
    return task.result()


# -- errors, auth, SSE --------------------------------------------------------------------------------------
def error_response(status: int, message: str, kind: str) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status, headers=headers)


def error_kind(exc: BaseException) -> tuple[int, str]:
    """Bad input (ValueError: settings, messages, tools) is the caller's; a remote endpoint failing is a bad gateway."""
    if isinstance(exc, ValueError):
        return 400, "invalid_request_error"
    if isinstance(exc, EndpointError):
        return 502, "upstream_error"
    return 500, "server_error"


def new_app(title: str, api_key: str | None) -> FastAPI:
    dependencies = [Depends(_require_key(api_key))] if api_key else []
    app = FastAPI(title=title, dependencies=dependencies)

    @app.exception_handler(HTTPException)
    async def http_error(_request: Request, exc: HTTPException) -> JSONResponse:
        kind = "authentication_error" if exc.status_code == 401 else "invalid_request_error"
        return error_response(exc.status_code, str(exc.detail), kind)

    @app.exception_handler(RequestValidationError)
    async def invalid_body(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(400, body_problems(exc.errors(), skip=1), "invalid_request_error")

    return app


class InvalidBody(ValueError):
    """A request body that does not parse into the endpoint's request model (a 400 naming each problem)."""


def body_problems(errors: Sequence[Mapping[str, Any]], skip: int = 0) -> str:
    """Pydantic's errors as one message: each problem's location in the body and what is wrong there (``skip``:
    leading location parts to drop - FastAPI's ``"body"``)."""
    return "; ".join(f"{'.'.join(str(p) for p in e['loc'][skip:]) or 'body'}: {e['msg']}" for e in errors)


def _require_key(api_key: str) -> Callable[[str | None], None]:
    expected = f"Bearer {api_key}".encode()

    def check(authorization: str | None = Header(default=None)) -> None:
        # compare_digest: the time taken does not tell how much of a guessed key was right.
        if authorization is None or not secrets.compare_digest(authorization.encode(), expected):
            raise HTTPException(401, "missing or wrong API key: send the header 'Authorization: Bearer <key>'")

    return check


def sse(data: Mapping[str, Any]) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


SSE_DONE = "data: [DONE]\n\n"


def models_response(name: str, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    card = {"id": name, "object": "model", "created": int(time.time()), "owned_by": "relaygen", **(extra or {})}
    return {"object": "list", "data": [card]}


# How often a thread running Python code must offer the GIL to one waiting for it: 0.5 ms, not CPython's 5 ms, so the
# event loop answers while the preparing thread renders a long chat (measured once, by hand, with eight
# 20,000-message bodies at once on 2 cores: the slowest poll took 92 ms at 5 ms, 68 ms at 1 ms, under 50 ms in 4 of 4
# runs at 0.5 ms; not kept as a test bound, which a shared machine cannot hold). No cost while the loop sleeps: a thread
# is only asked to switch when another waits for the GIL.
SERVER_SWITCH_INTERVAL_S = 0.0005


def run_server(app: FastAPI, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info") -> None:
    """Serves ``app`` until interrupted (a process of its own: the GIL switch interval is set for the process)."""
    import gc
    import os
    import sys

    import uvicorn

    sys.setswitchinterval(SERVER_SWITCH_INTERVAL_S)
    # The Rust tokenizer would spread a long chat's encoding over every core, starving the event loop's thread
    # (requests are prepared one at a time on one thread by design); read when its thread pool first starts.
    # With a CPU-bound process beside the big-bodies test on 2 cores, 4 of 5 runs had no poll over 50 ms (their
    # slowest 16-25 ms; the fifth 73 ms), against 2 of 3 without it (one at 75 ms): a small sample, in its favour.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # Everything loaded so far (torch, transformers, the models' Python objects: hundreds of thousands) lives as long
    # as the server: moved out of the collector's reach, a full collection - triggered by the many objects a big
    # request body makes, and run with the GIL held - scans only what requests made since. Without it one poll
    # took 68 ms in the big-bodies test (test_serve_guards.py) while a collection ran.
    gc.freeze()
    uvicorn.run(app, host=host, port=port, log_level=log_level)
