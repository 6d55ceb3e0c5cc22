"""The remote backend and the HTTP servers, end to end on loopback with tiny random-weight models (fp32).

Two ``relaygen serve --single`` apps (one per model) run in background threads; ``RelayEngine.from_endpoints`` over
them must give exactly what the local engine gives over the same two models.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import uvicorn
from fastapi import FastAPI, Request, Response
from helpers import tiny_qwen2

from relaygen_integrations import RelayEngine
from relaygen_integrations.engine import GenerationError
from relaygen_integrations.engine.core.spans import FinalEvent, SwitchEvent, TextEvent
from relaygen_integrations.engine.local.kv import CacheOptions
from relaygen_integrations.engine.remote.backend import RemoteBackend, cue_stop_strings
from relaygen_integrations.engine.remote.endpoint import EndpointError
from relaygen_integrations.langchain import RelayChatModel
from relaygen_integrations.serve.app import create_app
from relaygen_integrations.serve.single import create_single_app

MESSAGES = [{"role": "user", "content": "Count the apples: two and three. So how many?"}]
POLICY = {"min_large_tokens": 1, "max_small_tokens": 3}


class ServerThread:
    """A uvicorn server for ``app`` on a free loopback port, in a daemon thread (the socket is bound before the
    server starts, so no other process can take the port in between)."""

    def __init__(self, app: FastAPI) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:  # a poll with a 20 s deadline, not a bound on how fast a server starts
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def unused_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def pair(tokenizer):
    return tiny_qwen2(tokenizer, seed=1, hidden=64, layers=2), tiny_qwen2(tokenizer, seed=2, hidden=32, layers=1)


@pytest.fixture(scope="module")
def cues(tokenizer, pair) -> tuple[str, ...]:
    """Whole words of the large model's own greedy text: the relay equals it up to the first cue, so they fire."""
    text = RelayEngine.from_models(pair[0], pair[1], tokenizer, cues=[]).generate(MESSAGES, max_new_tokens=60).text
    return tuple(sorted(set(re.findall(r"(?<![\w])[A-Za-z]{2,}(?![\w])", text))))


@pytest.fixture(scope="module")
def local(tokenizer, pair, cues) -> RelayEngine:
    return RelayEngine.from_models(pair[0], pair[1], tokenizer, cues=list(cues), policy=POLICY)


@pytest.fixture(scope="module")
def servers(tokenizer, pair) -> Iterator[tuple[str, str]]:
    large = create_single_app(pair[0], tokenizer, served_model_name="tiny-large")
    small = create_single_app(pair[1], tokenizer, served_model_name="tiny-small")
    with ServerThread(large) as large_server, ServerThread(small) as small_server:
        yield large_server.url, small_server.url


@pytest.fixture(scope="module")
def remote(tokenizer, servers, cues) -> Iterator[RelayEngine]:
    engine = RelayEngine.from_endpoints(servers[0], servers[1], tokenizer, cues=list(cues), policy=POLICY, retries=0)
    assert isinstance(engine.backend, RemoteBackend)
    with engine:
        yield engine


def span_summary(result) -> list[tuple[str, str, str, int]]:
    return [(s.model, s.trigger, s.text, s.token_count) for s in result.spans]


# -- the remote backend gives the local engine's result ------------------------------------------------------------
def test_remote_relay_equals_local_relay(local, remote):
    expected = local.generate(MESSAGES, max_new_tokens=60)
    result = remote.generate(MESSAGES, max_new_tokens=60)
    assert expected.usage.switches >= 2, "the cue list is built to fire on these weights"
    assert result.text == expected.text
    assert result.completion_ids == expected.completion_ids
    assert span_summary(result) == span_summary(expected)
    assert result.finish_reason == expected.finish_reason
    for name in ("completion_tokens", "large_tokens", "small_tokens", "switches", "rolled_back_tokens"):
        assert getattr(result.usage, name) == getattr(expected.usage, name), name
    # One request per segment at least; every request after a model's first re-sends what it already processed.
    assert result.usage.requests >= len(result.spans)
    assert result.usage.small_catchup_tokens > 0 and result.usage.reused_prefix_tokens > 0
    assert result.usage.large_prefill_tokens == result.usage.small_prefill_tokens == result.usage.prompt_tokens


def test_servers_with_a_static_cache_give_the_same_relay(tokenizer, pair, cues, local):
    """`relaygen serve --single --compile` runs its model over a static cache; nothing changes but the speed."""
    static = CacheOptions(kv_cache="static", block=16)  # small blocks: the cache grows (by copying) several times
    large = create_single_app(pair[0], tokenizer, cache=static)
    small = create_single_app(pair[1], tokenizer, cache=static)
    with ServerThread(large) as large_server, ServerThread(small) as small_server:
        engine = RelayEngine.from_endpoints(
            large_server.url, small_server.url, tokenizer, cues=list(cues), policy=POLICY, retries=0
        )
        with engine:
            result = engine.generate(MESSAGES, max_new_tokens=60)
    expected = local.generate(MESSAGES, max_new_tokens=60)
    assert span_summary(result) == span_summary(expected) and result.completion_ids == expected.completion_ids


@pytest.mark.parametrize("mode", ["large", "small"])
def test_single_model_modes_equal_local(local, remote, mode):
    expected = local.generate(MESSAGES, max_new_tokens=30, mode=mode)
    result = remote.generate(MESSAGES, max_new_tokens=30, mode=mode)
    assert (result.text, result.completion_ids, result.finish_reason) == (
        expected.text,
        expected.completion_ids,
        expected.finish_reason,
    )
    assert result.usage.requests == 1 and span_summary(result) == span_summary(expected)


@pytest.mark.parametrize("with_ids", [True, False])
def test_stop_sequence_across_a_switch_equals_local(tokenizer, local, servers, text_servers, cues, with_ids):
    """The caller's stop strings go to servers that stream ids too (the matched one comes back from the ids); the
    client finds every stop itself, across switches, and ends exactly where the local engine does."""
    reference = local.generate(MESSAGES, max_new_tokens=60)
    # A stop string that begins in the last character of one span and ends in the next one.
    boundary = next(s.start for s in reference.spans[1:] if s.start >= 1 and len(s.text) >= 2)
    stop = reference.text[boundary - 1 : boundary + 2]
    expected = local.generate(MESSAGES, max_new_tokens=60, stop=[stop])
    urls = servers if with_ids else text_servers
    with RelayEngine.from_endpoints(*urls, tokenizer, cues=list(cues), policy=POLICY) as remote:
        result = remote.generate(MESSAGES, max_new_tokens=60, stop=[stop])
    assert result.finish_reason == expected.finish_reason == "stop_sequence"
    assert result.text == expected.text == reference.text[: reference.text.index(stop)]
    assert span_summary(result) == span_summary(expected)


def test_stream_events_equal_local(local, remote):
    def events(engine):
        return list(engine.stream(MESSAGES, max_new_tokens=40))

    expected, got = events(local), events(remote)
    switches = [(e.from_model, e.to_model, e.trigger, e.char_offset) for e in got if isinstance(e, SwitchEvent)]
    assert switches == [
        (e.from_model, e.to_model, e.trigger, e.char_offset) for e in expected if isinstance(e, SwitchEvent)
    ]
    text = [(e.model, e.text) for e in got if isinstance(e, TextEvent)]
    assert "".join(t for _, t in text) == got[-1].result.text
    assert text == [(e.model, e.text) for e in expected if isinstance(e, TextEvent)]
    assert isinstance(got[-1], FinalEvent) and sum(isinstance(e, FinalEvent) for e in got) == 1


async def test_async_generation_and_concurrency(remote):
    alone = remote.generate(MESSAGES, max_new_tokens=20)
    together = await asyncio.gather(*(remote.agenerate(MESSAGES, max_new_tokens=20) for _ in range(3)))
    assert [r.completion_ids for r in together] == [alone.completion_ids] * 3


def test_server_stops_are_only_a_hint(tokenizer, servers, cues, remote):
    """Without server-side stops the servers run on until the client closes the stream: same result, fewer
    requests (no continuation after a false stop match)."""
    with RelayEngine.from_endpoints(
        servers[0], servers[1], tokenizer, cues=list(cues), policy=POLICY, server_stops=False
    ) as plain:
        without = plain.generate(MESSAGES, max_new_tokens=60)
    with_stops = remote.generate(MESSAGES, max_new_tokens=60)
    assert (without.text, span_summary(without)) == (with_stops.text, span_summary(with_stops))
    assert without.usage.requests == len(without.spans)


def test_cue_stop_strings_keep_word_boundaries():
    from relaygen_integrations.engine.core.cues import CueSet

    stops = cue_stop_strings(CueSet(("So", "So,", "now")))
    assert set(stops) == {" So ", "\nSo ", " So,", "\nSo,", " now ", "\nnow ", " now,", "\nnow,"}
    assert not any(s in "I know, also" for s in stops)


@pytest.fixture(scope="module")
def text_servers(tokenizer, pair) -> Iterator[tuple[str, str]]:
    """Servers that stream only text (no token ids), like one without vLLM's return_token_ids."""
    large = create_single_app(pair[0], tokenizer, report_token_ids=False)
    small = create_single_app(pair[1], tokenizer, report_token_ids=False)
    with ServerThread(large) as large_server, ServerThread(small) as small_server:
        yield large_server.url, small_server.url


def assert_same_text_up_to_the_budget(result, expected) -> None:
    """Re-tokenized text can take a few more tokens than the model wrote, so the same budget may end a little
    sooner; up to there the text and who wrote it must be the same."""
    assert len(result.text) > len(expected.text) // 2 and expected.text.startswith(result.text)
    written = [(s.model, s.text) for s in result.spans]
    assert written[:-1] == [(s.model, s.text) for s in expected.spans[: len(written) - 1]]
    assert expected.spans[len(written) - 1].text.startswith(written[-1][1])


def test_text_only_servers_give_the_same_text(tokenizer, text_servers, cues, local):
    """Each text chunk is tokenized on its own; the continuation prompts are built from those ids."""
    expected = local.generate(MESSAGES, max_new_tokens=60)
    with RelayEngine.from_endpoints(*text_servers, tokenizer, cues=list(cues), policy=POLICY) as engine:
        result = engine.generate(MESSAGES, max_new_tokens=60)
    assert_same_text_up_to_the_budget(result, expected)
    assert result.usage.switches >= 2


@pytest.fixture(scope="module")
def spaced_cues(tokenizer, pair) -> list[str]:
    """Words the large model writes between spaces: the server-side stops (" word ") really fire on them."""
    text = RelayEngine.from_models(pair[0], pair[1], tokenizer, cues=[]).generate(MESSAGES, max_new_tokens=60).text
    return sorted(set(re.findall(r"(?<= )([A-Za-z]{2,})(?= )", text)))


@pytest.mark.parametrize("with_ids", [True, False])
def test_server_side_stops_are_checked_by_the_policy(tokenizer, pair, servers, text_servers, spaced_cues, with_ids):
    """A server that streams ids stops at every " cue "; the first one comes before min_large_tokens, so the policy
    does not act on it and the large model continues with a new request; a later one switches. The stop text the
    server dropped comes back from its ids: the result equals the local one. A text-only server gets no stops."""
    policy = {"min_large_tokens": 26, "max_small_tokens": 3}
    expected = RelayEngine.from_models(pair[0], pair[1], tokenizer, cues=spaced_cues, policy=policy).generate(
        MESSAGES, max_new_tokens=60
    )
    urls = servers if with_ids else text_servers
    with RelayEngine.from_endpoints(*urls, tokenizer, cues=spaced_cues, policy=policy) as engine:
        first = engine.generate(MESSAGES, max_new_tokens=60)  # each endpoint's first request goes without stops
        result = engine.generate(MESSAGES, max_new_tokens=60)
    assert first.text == result.text
    assert expected.usage.switches >= 1
    if with_ids:
        assert result.usage.requests > len(result.spans), "the early false stop costs one more request"
        assert (result.text, span_summary(result)) == (expected.text, span_summary(expected))
    else:
        assert result.usage.requests == len(result.spans), "a text-only server gets no stops"
        assert_same_text_up_to_the_budget(result, expected)


def test_cancel_flag_and_abandoned_streams(remote):
    expected = remote.generate(MESSAGES, max_new_tokens=40)
    cancel = threading.Event()
    events = []
    for event in remote.stream(MESSAGES, max_new_tokens=40, cancel=cancel):
        events.append(event)
        cancel.set()  # after the first event: the loop stops at the next chunk
    result = events[-1].result
    assert result.finish_reason == "cancelled" and expected.text.startswith(result.text)
    assert result.usage.completion_tokens < expected.usage.completion_tokens
    abandoned = remote.stream(MESSAGES, max_new_tokens=40)
    next(abandoned)
    abandoned.close()  # closes the open HTTP stream
    assert remote.generate(MESSAGES, max_new_tokens=40).text == expected.text


def test_langchain_adapter_runs_on_the_remote_engine(remote):
    model = RelayChatModel(engine=remote, max_tokens=24)
    message = model.invoke(MESSAGES[0]["content"])
    expected = remote.generate(MESSAGES, max_new_tokens=24)
    assert message.content == expected.text
    assert message.response_metadata["relaygen"]["large_tokens"] == expected.usage.large_tokens
    assert "".join(chunk.content for chunk in model.stream(MESSAGES[0]["content"])) == expected.text


def test_llama_index_adapter_runs_on_the_remote_engine(remote):
    from relaygen_integrations.llama_index import RelayLLM

    llm = RelayLLM(engine=remote, max_tokens=16)
    expected = remote.generate(MESSAGES, max_new_tokens=16)
    assert llm.complete(MESSAGES[0]["content"]).text == expected.text
    assert llm.metadata.context_window == remote.context_window


def test_speculative_and_reprefill_are_refused_before_any_request(remote):
    with pytest.raises(GenerationError, match="remote backend cannot run speculative decoding"):
        remote.generate(MESSAGES, speculative=True)
    with pytest.raises(GenerationError, match="remote backend cannot run speculative decoding") as refused:
        remote.generate(MESSAGES, prompt_lookup=True)  # drafts copied from the context need the logits too
    assert refused.value.field == "prompt_lookup"
    with pytest.raises(GenerationError, match="reprefill_segments"):
        remote.generate(MESSAGES, reprefill_segments=True)
    with pytest.raises(GenerationError, match="cannot report log probabilities") as refused:
        remote.generate(MESSAGES, logprobs=True)
    assert refused.value.field == "logprobs"
    with pytest.raises(GenerationError, match="cannot constrain tokens by a grammar") as refused:
        remote.generate(MESSAGES, grammar='start: "yes"')
    assert refused.value.field == "grammar"
    # Verified relay over endpoints: tests/test_remote_verify.py.


def test_a_tool_chat_over_endpoints_runs_unconstrained(remote):
    """The servers hand out sampled tokens, not logits: a chat with tools runs as without constraints (the
    prefill, the parser), and says nothing it cannot do."""
    from relaygen_integrations.chat.relay_chat import prepare_chat, prepare_turn
    from relaygen_integrations.engine.core.settings import merge_settings

    tool = {"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {}}}}
    plan = prepare_turn(remote, prepare_chat(MESSAGES, merge_settings({}), [tool], tool_choice="required")).plan
    assert plan.settings.grammar is None and plan.call_tag is None
    assert remote.tokenizer.decode(plan.prompt_ids).endswith('<tool_call>\n{"name": "')


# -- failures are fast and name the server ------------------------------------------------------------------------
def test_dead_endpoint_fails_fast_naming_the_url(tokenizer):
    url = f"http://127.0.0.1:{unused_port()}/v1"
    engine = RelayEngine.from_endpoints(url, url, tokenizer, large_model="m", small_model="m", retries=1, timeout=60)
    started = time.monotonic()
    with engine, pytest.raises(EndpointError, match=re.escape(url)) as info:
        engine.generate(MESSAGES, max_new_tokens=4)
    # A refused connection is not waited on: two attempts and one backoff of about 0.5 s, far from the 60 s timeout.
    assert time.monotonic() - started < 30
    assert "2 attempt(s)" in str(info.value) and info.value.url == f"{url}/completions"


def test_server_errors_are_retried_then_named(tokenizer, pair):
    app = create_single_app(pair[0], tokenizer)
    failures = {"left": 2}

    @app.middleware("http")
    async def flaky(request: Request, call_next):  # two 503s, then the real server
        if request.url.path.endswith("/completions") and failures["left"] > 0:
            failures["left"] -= 1
            return Response("overloaded", status_code=503)
        return await call_next(request)

    with ServerThread(app) as server:
        with RelayEngine.from_endpoints(server.url, None, tokenizer, cues="none", retries=2) as engine:
            assert engine.generate(MESSAGES, max_new_tokens=3, mode="large").usage.completion_tokens == 3
        failures["left"] = 5
        with RelayEngine.from_endpoints(server.url, None, tokenizer, cues="none", retries=1) as engine:
            with pytest.raises(EndpointError, match=r"HTTP 503: overloaded") as info:
                engine.generate(MESSAGES, max_new_tokens=3, mode="large")
            assert info.value.status == 503
            # A 4xx is the request's fault: raised at once with the server's message, no retry.
            failures["left"] = 0
            with pytest.raises(EndpointError, match="context window is 2048") as info:
                engine.generate_ids(list(range(2040)), max_new_tokens=50, mode="large")
            assert info.value.status == 400


# -- the servers ----------------------------------------------------------------------------------------------------
def test_single_server_completions(tokenizer, servers):
    url = servers[0]
    body = {"model": "tiny-large", "prompt": "Count the apples:", "max_tokens": 12, "temperature": 0}
    plain = httpx.post(f"{url}/completions", json={**body, "return_token_ids": True}).json()
    choice = plain["choices"][0]
    assert choice["finish_reason"] == "length" and len(choice["token_ids"]) == 12
    assert choice["text"] == tokenizer.decode(choice["token_ids"])
    assert plain["usage"]["completion_tokens"] == 12
    # A stop string: the text ends before it, stop_reason names it, the ids still hold its tokens (as vLLM does).
    stop = choice["text"][4:6]
    stopped = httpx.post(f"{url}/completions", json={**body, "stop": [stop], "return_token_ids": True}).json()
    choice = stopped["choices"][0]
    assert (choice["finish_reason"], choice["stop_reason"]) == ("stop", stop)
    assert choice["text"] == plain["choices"][0]["text"][: plain["choices"][0]["text"].index(stop)]
    assert tokenizer.decode(choice["token_ids"]).startswith(choice["text"] + stop)
    # Streaming: SSE chunks of the same text, then [DONE]; a token-id prompt works the same as its text.
    ids = tokenizer.encode("Count the apples:")
    with httpx.stream("POST", f"{url}/completions", json={**body, "prompt": ids, "stream": True}) as response:
        lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == plain["choices"][0]["text"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    bad = httpx.post(f"{url}/completions", json={**body, "top_p": 3})
    assert bad.status_code == 400 and "top_p" in bad.json()["error"]["message"]


@pytest.fixture(scope="module")
def relay_server(local) -> Iterator[str]:
    with ServerThread(create_app(local, served_model_name="tiny-relay", api_key="sekrit")) as server:
        yield server.url


AUTH = {"Authorization": "Bearer sekrit"}


def test_relay_server_chat_completions(local, relay_server):
    expected = local.generate(MESSAGES, max_new_tokens=30)
    body = {"model": "tiny-relay", "messages": MESSAGES, "max_tokens": 30}
    data = httpx.post(f"{relay_server}/chat/completions", json=body, headers=AUTH, timeout=30).json()
    assert data["choices"][0]["message"] == {"role": "assistant", "content": expected.text}
    assert data["choices"][0]["finish_reason"] == {"length": "length", "stop": "stop"}[expected.finish_reason]
    assert data["usage"]["large_tokens"] == expected.usage.large_tokens
    assert data["usage"]["small_tokens"] == expected.usage.small_tokens
    assert data["usage"]["completion_tokens"] == expected.usage.completion_tokens
    assert [(s["model"], s["text"]) for s in data["relaygen"]["spans"]] == [(s.model, s.text) for s in expected.spans]


def test_relay_server_streams_sse(local, relay_server):
    expected = local.generate(MESSAGES, max_new_tokens=30)
    body = {"messages": MESSAGES, "max_tokens": 30, "stream": True}
    with httpx.stream("POST", f"{relay_server}/chat/completions", json=body, headers=AUTH, timeout=30) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    content = [
        (c["relaygen"]["model"], c["choices"][0]["delta"]["content"]) for c in chunks[1:-1] if c["choices"][0]["delta"]
    ]
    assert "".join(text for _, text in content) == expected.text
    assert {model for model, _ in content} == {"large", "small"}
    switches = [c["relaygen"]["switch"] for c in chunks if "switch" in c.get("relaygen", {})]
    assert len(switches) == expected.usage.switches
    assert chunks[-1]["usage"]["small_tokens"] == expected.usage.small_tokens
    assert chunks[-1]["choices"][0]["finish_reason"] is not None


def test_relay_server_models_auth_and_bad_requests(relay_server):
    assert httpx.get(f"{relay_server}/models").status_code == 401
    wrong = httpx.get(f"{relay_server}/models", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and "API key" in wrong.json()["error"]["message"]
    models = httpx.get(f"{relay_server}/models", headers=AUTH).json()
    assert [m["id"] for m in models["data"]] == ["tiny-relay"]
    refused = httpx.post(f"{relay_server}/chat/completions", json={"messages": MESSAGES, "max_tokens": 2})
    assert refused.status_code == 401
    empty = httpx.post(f"{relay_server}/chat/completions", json={"messages": []}, headers=AUTH)
    assert empty.status_code == 400 and "messages is empty" in empty.json()["error"]["message"]
    bad = httpx.post(f"{relay_server}/chat/completions", json={"messages": MESSAGES, "temperature": -1}, headers=AUTH)
    assert bad.status_code == 400 and "temperature" in bad.json()["error"]["message"]


def test_remote_engine_with_an_api_key(tokenizer, pair):
    app = create_single_app(pair[0], tokenizer, served_model_name="keyed", api_key="k3y")
    with ServerThread(app) as server:
        with RelayEngine.from_endpoints(server.url, None, tokenizer, api_key="k3y") as engine:
            assert engine.generate(MESSAGES, max_new_tokens=3, mode="large").usage.completion_tokens == 3
        with RelayEngine.from_endpoints(server.url, None, tokenizer, api_key="wrong") as engine:
            with pytest.raises(EndpointError, match="HTTP 401") as info:
                engine.generate(MESSAGES, max_new_tokens=3, mode="large")
            assert info.value.url == f"{server.url}/models"


def test_bad_endpoint_settings_are_named(tokenizer):
    with pytest.raises(ValueError, match="http"):
        RelayEngine.from_endpoints("localhost:8000", None, tokenizer)
    with pytest.raises(ValueError, match="timeout"):
        RelayEngine.from_endpoints("http://127.0.0.1:1/v1", None, tokenizer, timeout=0)
    with pytest.raises(ValueError, match="retries"):
        RelayEngine.from_endpoints("http://127.0.0.1:1/v1", None, tokenizer, retries=-1)


def test_cli_serve_single_builds_a_keyed_completion_server(monkeypatch, tokenizer, pair):
    """`relaygen serve --single --model X` loads X through the usual loaders and serves it (server start stubbed)."""
    from fastapi.testclient import TestClient

    import relaygen_integrations.serve.http as serve_http
    from relaygen_integrations.cli.main import main
    from relaygen_integrations.engine.local import loading

    started: dict[str, object] = {}
    monkeypatch.setattr(loading, "load_causal_lm", lambda ref, dtype, device: pair[1])
    monkeypatch.setattr(loading, "load_tokenizer", lambda ref: tokenizer)
    monkeypatch.setattr(serve_http, "run_server", lambda app, host, port: started.update(app=app, host=host, port=port))
    assert main(["serve", "--single", "--model", "someone/tiny", "--port", "8123", "--api-key", "k"]) == 0
    assert (started["host"], started["port"]) == ("127.0.0.1", 8123)
    client = TestClient(started["app"])
    assert client.get("/v1/models").status_code == 401
    models_list = client.get("/v1/models", headers={"Authorization": "Bearer k"}).json()
    assert models_list["data"][0]["id"] == "someone/tiny"
    assert main(["serve", "--single"]) == 2  # --single without --model is named, not a traceback


def test_stream_chunks_restore_dropped_stop_text_and_drop_eos(tokenizer):
    """How one server chunk becomes token ids, for servers unlike ours: ids without the matched stop's tokens,
    text-only chunks, a missing stop report, an eos id at the end."""
    from relaygen_integrations.engine.remote.backend import CompletionStream, Endpoint

    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    with httpx.Client() as client:
        endpoint = Endpoint("large", "http://127.0.0.1:9/v1", client, "m", retries=0)

        def chunk(choice: dict, stops=(" So ",), user_stops=("END",)) -> tuple[str, CompletionStream]:
            stream = CompletionStream(endpoint, httpx.Response(200), tokenizer, frozenset({eos}), stops, user_stops)
            return tokenizer.decode(stream._batch(choice)), stream

        ids = tokenizer.encode("It is 5", add_special_tokens=False)
        # The policy's stop comes back without its trailing space (the model's next token carries that).
        text, _ = chunk({"text": "It is 5", "token_ids": ids, "finish_reason": "stop", "stop_reason": " So "})
        assert text == "It is 5 So"
        # The caller's stop comes back whole (the generation ends there); SGLang names it matched_stop.
        text, _ = chunk({"text": "abc", "finish_reason": "stop", "matched_stop": "END"})
        assert text == "abcEND" and endpoint.streams_token_ids is False
        text, stream = chunk(
            {"text": "It is 5", "token_ids": [*ids, eos], "finish_reason": "stop", "stop_reason": None}
        )
        assert text == "It is 5" and stream.model_ended and endpoint.streams_token_ids is True
        with pytest.raises(EndpointError, match="server_stops=False"):
            chunk({"text": "x", "finish_reason": "stop"})
        text, stream = chunk({"text": "x", "finish_reason": "stop"}, stops=())  # no stops sent: it is the eos
        assert text == "x" and stream.model_ended
