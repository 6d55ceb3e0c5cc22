"""The remote backend's HTTP client (the ``openai`` SDK, ``engine/remote/endpoint.py``) against servers that
misbehave. A loopback proxy in front of a real ``relaygen serve --single`` app drops connections, answers errors
itself, cuts a stream or stalls it, as scripted for its first connections; later connections pass through. Each
test checks what reached the server (the proxy's log) as well as what the caller sees."""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
import time
from collections.abc import Iterator, Sequence

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from test_remote import ServerThread

from relaygen_integrations import RelayEngine
from relaygen_integrations.engine.core.spans import TextEvent
from relaygen_integrations.engine.remote.endpoint import EndpointError
from relaygen_integrations.serve.single import create_single_app

MESSAGES = [{"role": "user", "content": "Count the apples: two and three. So how many?"}]
BUDGET = 12


def _read_request(conn: socket.socket) -> bytes:
    """One HTTP/1.1 request, read whole (head and Content-Length body), so that an answer or a close comes after
    the client finished sending, as a real server's would."""
    data = b""
    while b"\r\n\r\n" not in data:
        piece = conn.recv(65536)
        if not piece:
            return data
        data += piece
    head, _, body = data.partition(b"\r\n\r\n")
    length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
    while length and len(body) < int(length.group(1)):
        piece = conn.recv(65536)
        if not piece:
            break
        body += piece
    return head + b"\r\n\r\n" + body


def _close(sock: socket.socket) -> None:
    """Closes a socket that another thread may be reading: only shutdown sends the FIN and wakes that reader."""
    with contextlib.suppress(OSError):  # already closed by the other side
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


class FaultyProxy:
    """A TCP proxy on a free loopback port in front of ``target_port``. Its first connections take the actions of
    ``script`` in order, later ones ``"pass"``:

    * ``"drop"``: reads the request and closes the connection without an answer;
    * ``"503"`` (any status): answers it itself, OpenAI's error shape, then closes;
    * ``"cut:N"``: forwards the request and the answer up to its N-th server-sent event, then closes both sides;
    * ``"stall:N"``: the same, but keeps the connection open and sends nothing more;
    * ``"pass"``: forwards both ways until one side closes.

    ``log`` holds each connection's action, so a test sees how many attempts the client made."""

    def __init__(self, target_port: int, script: Sequence[str] = ()) -> None:
        self.target_port = target_port
        self.script = list(script)
        self.log: list[str] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.stopped = threading.Event()
        self.sockets: list[socket.socket] = []
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> FaultyProxy:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stopped.set()
        self.listener.close()
        with self.lock:
            for sock in self.sockets:
                _close(sock)

    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return  # the listener was closed
            with self.lock:
                action = self.script.pop(0) if self.script else "pass"
                self.log.append(action)
                self.sockets.append(conn)
            threading.Thread(target=self._handle, args=(conn, action), daemon=True).start()

    def _handle(self, conn: socket.socket, action: str) -> None:
        try:
            if action == "drop":
                _read_request(conn)
            elif action.isdigit():
                _read_request(conn)
                body = json.dumps({"error": {"message": f"scripted {action}", "type": "server_error"}}).encode()
                head = f"HTTP/1.1 {action} Scripted\r\nContent-Type: application/json\r\nContent-Length: {len(body)}"
                conn.sendall(head.encode() + b"\r\nConnection: close\r\n\r\n" + body)
            else:
                self._forward(conn, action)
        except OSError:
            pass  # the client or the test closed the socket first
        finally:
            _close(conn)

    def _forward(self, conn: socket.socket, action: str) -> None:
        upstream = socket.create_connection(("127.0.0.1", self.target_port))
        with self.lock:
            self.sockets.append(upstream)
        threading.Thread(target=self._pipe, args=(conn, upstream), daemon=True).start()
        kind, _, count = action.partition(":")
        events_left = int(count) if count else -1  # -1: no limit
        while piece := upstream.recv(65536):
            if events_left >= 0 and piece.count(b"data:") >= events_left:
                # Forward up to (not including) the event after the allowed ones.
                starts = [m.start() for m in re.finditer(rb"data:", piece)]
                conn.sendall(piece[: starts[events_left]] if events_left < len(starts) else piece)
                if kind == "stall":
                    self.stopped.wait()
                break
            events_left -= piece.count(b"data:") if events_left >= 0 else 0
            conn.sendall(piece)
        _close(upstream)

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while piece := source.recv(65536):
                sink.sendall(piece)
            sink.shutdown(socket.SHUT_WR)  # the client closed: the server sees it leave, as without a proxy
        except OSError:
            pass


@pytest.fixture(scope="module")
def server(tokenizer, pair) -> Iterator[ServerThread]:
    with ServerThread(create_single_app(pair[0], tokenizer, served_model_name="tiny")) as running:
        yield running


@pytest.fixture(scope="module")
def expected(tokenizer, server) -> list[int]:
    """What the large model writes when nothing goes wrong, straight from the server."""
    with RelayEngine.from_endpoints(server.url, None, tokenizer, cues="none", large_model="tiny") as engine:
        return engine.generate(MESSAGES, max_new_tokens=BUDGET, mode="large").completion_ids


def engine_through(server: FaultyProxy | ServerThread, tokenizer, **options) -> RelayEngine:
    """A large-only engine whose requests name the model (no GET /models first)."""
    return RelayEngine.from_endpoints(server.url, None, tokenizer, cues="none", large_model="tiny", **options)


def test_dropped_connections_are_retried_until_the_server_answers(tokenizer, server, expected):
    with FaultyProxy(server.port, ["drop", "drop"]) as proxy, engine_through(proxy, tokenizer, retries=2) as engine:
        result = engine.generate(MESSAGES, max_new_tokens=BUDGET, mode="large")
    assert result.completion_ids == expected
    assert proxy.log == ["drop", "drop", "pass"], "two retries, then the request that went through"


def test_retries_used_up_on_dropped_connections_name_the_endpoint(tokenizer, server, expected):
    with FaultyProxy(server.port, ["drop", "drop"]) as proxy, engine_through(proxy, tokenizer, retries=1) as engine:
        with pytest.raises(EndpointError, match="no answer after 2 attempt") as info:
            engine.generate(MESSAGES, max_new_tokens=BUDGET, mode="large")
        assert info.value.url == f"{proxy.url}/completions" and info.value.status is None
        assert "RemoteProtocolError" in str(info.value), "the transport error behind the SDK's is named"
        assert proxy.log == ["drop", "drop"]
        # The engine is not left broken: once the server answers, the same engine writes the same text.
        assert engine.generate(MESSAGES, max_new_tokens=BUDGET, mode="large").completion_ids == expected


@pytest.mark.parametrize(
    ("status", "attempts", "hint"),
    [
        ("503", 3, "after 3 attempt(s); raise retries="),  # a server error: retried, then named
        ("429", 3, "after 3 attempt(s)"),  # rate limited: retried too
        ("404", 1, "check the base URL"),  # the request's own fault: raised at once
        ("401", 1, "check api_key"),
    ],
)
def test_http_errors_are_typed_and_name_the_endpoint(tokenizer, server, status, attempts, hint):
    with (
        FaultyProxy(server.port, [status] * 3) as proxy,
        engine_through(proxy, tokenizer, retries=2) as engine,
        pytest.raises(EndpointError, match=f"HTTP {status}: scripted {status}") as info,
    ):
        engine.generate(MESSAGES, max_new_tokens=BUDGET, mode="large")
    assert info.value.status == int(status) and info.value.url == f"{proxy.url}/completions"
    assert hint in str(info.value)
    assert proxy.log == [status] * attempts


def test_a_server_error_then_an_answer_is_a_normal_generation(tokenizer, server, expected):
    with FaultyProxy(server.port, ["503", "429"]) as proxy, engine_through(proxy, tokenizer, retries=2) as engine:
        assert engine.generate(MESSAGES, max_new_tokens=BUDGET, mode="large").completion_ids == expected
    assert proxy.log == ["503", "429", "pass"]


def test_a_stream_cut_midway_is_an_error_naming_the_endpoint(tokenizer, server, expected):
    """Tokens already streamed went through the policy: the request is not replayed behind the caller's back."""
    with FaultyProxy(server.port, ["cut:3"]) as proxy, engine_through(proxy, tokenizer, retries=2) as engine:
        texts: list[str] = []
        with pytest.raises(EndpointError, match="the stream broke off") as info:
            for event in engine.stream(MESSAGES, max_new_tokens=BUDGET, mode="large"):
                if isinstance(event, TextEvent):
                    texts.append(event.text)
        assert info.value.url == f"{proxy.url}/completions"
        assert texts, "tokens arrived before the cut"
        assert proxy.log == ["cut:3"], "no retry once the stream had started"
        assert engine.generate(MESSAGES, max_new_tokens=BUDGET, mode="large").completion_ids == expected


def test_a_stalled_stream_times_out(tokenizer, server):
    # retries=0: a slow answer to the request itself (a loaded CI machine) must not turn into a retry that passes.
    with (
        FaultyProxy(server.port, ["stall:2"]) as proxy,
        engine_through(proxy, tokenizer, timeout=2.0, retries=0) as engine,
    ):
        started = time.monotonic()
        with pytest.raises(EndpointError, match=r"sent nothing for 2\.0 s .*raise timeout=") as info:
            engine.generate(MESSAGES, max_new_tokens=BUDGET, mode="large")
        assert time.monotonic() - started < 15, "abandoned after the read timeout, not hung"
    assert info.value.url == f"{proxy.url}/completions" and proxy.log == ["stall:2"]


def scripted_stream_app(lines: Sequence[str]) -> FastAPI:
    """A completion server whose stream is the given ``data:`` payloads."""
    app = FastAPI()

    @app.post("/v1/completions")
    async def completions(_request: Request) -> StreamingResponse:
        return StreamingResponse((f"data: {line}\n\n" for line in lines), media_type="text/event-stream")

    return app


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (json.dumps({"error": {"message": "CUDA out of memory", "code": 500}}), "failed during generation: CUDA out"),
        ("{not json", "sent a stream chunk that is not JSON: '{not json'"),
        ("5", "sent a stream chunk that is not an object"),
    ],
)
def test_bad_stream_chunks_are_named(tokenizer, payload, message):
    first = json.dumps({"choices": [{"index": 0, "text": "It", "token_ids": [2132], "finish_reason": None}]})
    with (
        ServerThread(scripted_stream_app([first, payload, "[DONE]"])) as server,
        engine_through(server, tokenizer) as engine,
        pytest.raises(EndpointError, match=re.escape(message)) as info,
    ):
        engine.generate(MESSAGES, max_new_tokens=BUDGET, mode="large")
    assert info.value.url == f"{server.url}/completions"


def test_openai_environment_never_reaches_the_server(monkeypatch, tokenizer, pair):
    """The SDK's fallbacks are for api.openai.com: OPENAI_API_KEY, OPENAI_ORG_ID and OPENAI_BASE_URL must not send a
    request elsewhere or carry an OpenAI key to a self-hosted server; the caller's api_key does reach it."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-not-for-this-server")
    monkeypatch.setenv("OPENAI_ORG_ID", "org-not-for-this-server")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    seen: list[dict[str, str]] = []
    app = create_single_app(pair[0], tokenizer, served_model_name="tiny")

    @app.middleware("http")
    async def record(request: Request, call_next):
        seen.append(dict(request.headers))
        return await call_next(request)

    with ServerThread(app) as server:
        with RelayEngine.from_endpoints(server.url, None, tokenizer, cues="none") as engine:
            assert engine.generate(MESSAGES, max_new_tokens=2, mode="large").usage.completion_tokens == 2
        assert len(seen) == 2, "GET /models, then the completion"
        assert not any("not-for-this-server" in value for headers in seen for value in headers.values())
        assert all("authorization" not in headers for headers in seen)
        seen.clear()
        with RelayEngine.from_endpoints(server.url, None, tokenizer, cues="none", api_key="k3y") as engine:
            engine.generate(MESSAGES, max_new_tokens=2, mode="large")
        assert [headers.get("authorization") for headers in seen] == ["Bearer k3y", "Bearer k3y"]
