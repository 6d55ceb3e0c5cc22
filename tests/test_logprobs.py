"""Log probabilities (``logprobs=True``, ``top_logprobs=N``): each emitted token's entry is the log probability that
the model whose token was kept gave it, from that model's own logits, in relay with speculation and verified relay
on, streaming and not (fp32 tiny pair: a teacher-forced pass of each model over the final sequence is the
reference)."""

from __future__ import annotations

import copy
import json
import re

import pytest
import torch

from relaygen_integrations import RelayEngine
from relaygen_integrations.engine.core.settings import SettingsError
from relaygen_integrations.engine.core.spans import FinalEvent, TextEvent

MESSAGES = [{"role": "user", "content": "Tell me about the sea and the sky."}]


@pytest.fixture(scope="module")
def engine(tokenizer, pair):
    """The large model of the tiny pair and, as the small one, a copy of it with noise on its output layer: the two
    agree often enough that drafts are accepted and verification keeps small-model tokens, and differ enough that
    each rejects some (two independent random models never agree) and that their log probabilities tell them apart."""
    large = pair[0]
    small = copy.deepcopy(large)
    noise = torch.Generator().manual_seed(3)
    with torch.no_grad():
        small.lm_head.weight.add_(torch.randn(small.lm_head.weight.shape, generator=noise) * 0.05)
    text = RelayEngine.from_models(large, None, tokenizer, mode="large").generate(MESSAGES, max_new_tokens=40).text
    cues = sorted(set(re.findall(r"(?<![\w])[A-Za-z]{2,}(?![\w])", text)))  # words the large model writes
    return RelayEngine.from_models(
        large, small, tokenizer, cues=cues, policy={"min_large_tokens": 1, "max_small_tokens": 4},
        draft_confidence=0.0,
    )  # fmt: skip


def owners(result):
    return [span.model for span in result.spans for _ in range(span.token_count)]


def reference(engine, result, role):
    """``role``'s float32 log-softmax at every completion position, teacher-forced over the final sequence."""
    prompt = engine.encode_messages(MESSAGES)
    ids = torch.tensor([prompt + result.completion_ids])
    with torch.inference_mode():
        logits = engine.backend.local_model(role)(ids).logits[0, len(prompt) - 1 : -1]
    return torch.log_softmax(logits.float(), dim=-1)


def check_entries(engine, result, top):
    entries = result.logprobs
    assert entries is not None and len(entries) == len(result.completion_ids) == result.usage.completion_tokens
    expected = {role: reference(engine, result, role) for role in ("large", "small")}
    for position, (entry, owner, token) in enumerate(zip(entries, owners(result), result.completion_ids, strict=True)):
        assert entry.token_id == token and entry.model == owner, position
        row = expected[owner][position]
        assert entry.logprob == pytest.approx(float(row[token]), abs=1e-4), position
        assert len(entry.top) == top
        best = row.topk(top)
        assert [i for i, _text, _lp in entry.top] == best.indices.tolist()
        assert [lp for *_, lp in entry.top] == pytest.approx(best.values.tolist(), abs=1e-4)
        assert entry.token == engine.tokenizer.decode([token])


CASES = [
    {"speculative": 3, "verify": "greedy"},
    {"speculative": 3},
    {"verify": "prob:0.3"},
    {"mode": "large", "speculative": 4},
    {"temperature": 0.9, "seed": 5, "speculative": 3, "verify": "prob:0.3"},
]


@pytest.mark.parametrize("settings", CASES)
def test_each_token_has_the_writing_models_own_log_probability(engine, settings):
    result = engine.generate(MESSAGES, max_new_tokens=40, logprobs=True, top_logprobs=3, **settings)
    check_entries(engine, result, 3)
    plain = engine.generate(MESSAGES, max_new_tokens=40, **settings)  # asking for them changes no token
    if not settings.get("temperature"):  # a seeded sampled run draws in the same order too, but greedy is the claim
        assert plain.completion_ids == result.completion_ids
        assert [(s.model, s.start, s.end) for s in plain.spans] == [(s.model, s.start, s.end) for s in result.spans]


def test_the_cases_run_both_models_spans_rejections_and_drafts(engine):
    """The check above means something only if both models write, verification rejects and drafts are accepted."""
    result = engine.generate(MESSAGES, max_new_tokens=40, logprobs=True, **CASES[0])
    assert {entry.model for entry in result.logprobs} == {"large", "small"}
    assert result.usage.rejected_tokens > 0 and result.usage.accepted_draft_tokens > 0


def test_the_stream_carries_exactly_the_results_entries(engine):
    events = list(engine.stream(MESSAGES, max_new_tokens=40, logprobs=True, top_logprobs=2, stop=["the"], **CASES[0]))
    result = events[-1].result
    assert isinstance(events[-1], FinalEvent)
    streamed = [entry for event in events if isinstance(event, TextEvent) for entry in event.logprobs]
    assert streamed == result.logprobs
    check_entries(engine, result, 2)
    # Each text event carries the entries of the tokens its text completes: never one whose text comes later.
    emitted, ids = "", []
    for event in events:
        if isinstance(event, TextEvent):
            emitted += event.text
            ids += [entry.token_id for entry in event.logprobs]
            assert emitted.startswith(engine.tokenizer.decode(ids).rstrip("\ufffd"))
    assert ids == result.completion_ids


def test_without_logprobs_nothing_is_computed_or_reported(engine):
    result = engine.generate(MESSAGES, max_new_tokens=8)
    assert result.logprobs is None and "logprobs" not in result.to_dict()
    events = list(engine.stream(MESSAGES, max_new_tokens=8))
    assert all(not event.logprobs for event in events if isinstance(event, TextEvent))


@pytest.mark.parametrize(
    ("settings", "field"),
    [({"top_logprobs": 2}, "top_logprobs"), ({"logprobs": True, "top_logprobs": 21}, "top_logprobs")],
)
def test_bad_logprob_settings_name_the_field(engine, settings, field):
    with pytest.raises(SettingsError) as refused:
        engine.generate(MESSAGES, max_new_tokens=4, **settings)
    assert refused.value.field == field


# -- relaygen serve: OpenAI's response shape ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def client(engine):
    from fastapi.testclient import TestClient

    from relaygen_integrations.serve.app import create_app

    with TestClient(create_app(engine)) as test_client:
        yield test_client


def sse_chunks(response):
    return [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: {")]


def test_the_server_reports_logprobs_in_openais_shape_streaming_and_not(engine, client):
    body = {"messages": MESSAGES, "max_tokens": 30, "logprobs": True, "top_logprobs": 2, **CASES[0]}
    data = client.post("/v1/chat/completions", json=body).json()
    content = data["choices"][0]["logprobs"]["content"]
    expected = engine.generate(MESSAGES, max_new_tokens=30, logprobs=True, top_logprobs=2, **CASES[0])
    same_entries(content, [entry.to_openai() for entry in expected.logprobs])
    assert len(content) == data["usage"]["completion_tokens"]
    assert {"token", "logprob", "bytes", "top_logprobs", "model"} <= set(content[0])
    assert len(content[0]["top_logprobs"]) == 2
    stream = client.post("/v1/chat/completions", json={**body, "stream": True})
    chunks = sse_chunks(stream)
    streamed = [
        entry for c in chunks if c["choices"][0]["logprobs"] for entry in c["choices"][0]["logprobs"]["content"]
    ]
    assert streamed == content
    plain = client.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 4}).json()
    assert plain["choices"][0]["logprobs"] is None


def same_entries(got, expected):
    """OpenAI-shaped entries of the same tokens from two runs: equal up to float32 rounding (a reused cached prefix
    computes other positions in one pass than a fresh run)."""
    assert [(e["token"], e["model"], [t["token"] for t in e["top_logprobs"]]) for e in got] == [
        (e["token"], e["model"], [t["token"] for t in e["top_logprobs"]]) for e in expected
    ]
    assert [e["logprob"] for e in got] == pytest.approx([e["logprob"] for e in expected], abs=1e-4)


# -- the adapters ---------------------------------------------------------------------------------------------------
def test_langchain_reports_logprobs_in_response_metadata_invoke_and_stream(engine):
    from relaygen_integrations.langchain import RelayChatModel

    model = RelayChatModel(engine=engine, max_tokens=30, logprobs=True, top_logprobs=2, **CASES[0])
    expected = engine.generate(MESSAGES, max_new_tokens=30, logprobs=True, top_logprobs=2, **CASES[0])
    openai_shape = [entry.to_openai() for entry in expected.logprobs]
    message = model.invoke(MESSAGES[0]["content"])
    same_entries(message.response_metadata["logprobs"]["content"], openai_shape)
    merged = None
    for chunk in model.stream(MESSAGES[0]["content"]):
        merged = chunk if merged is None else merged + chunk
    same_entries(merged.response_metadata["logprobs"]["content"], openai_shape)
    assert "logprobs" not in RelayChatModel(engine=engine, max_tokens=4).invoke("hi").response_metadata


def test_llama_index_reports_logprobs_on_chat_responses_and_stream_deltas(engine):
    from llama_index.core.llms import ChatMessage

    from relaygen_integrations.llama_index import RelayLLM

    llm = RelayLLM(engine=engine, max_tokens=30, logprobs=True, top_logprobs=2, **CASES[0])
    expected = engine.generate(MESSAGES, max_new_tokens=30, logprobs=True, top_logprobs=2, **CASES[0])
    response = llm.chat([ChatMessage(role="user", content=MESSAGES[0]["content"])])
    assert [[lp.token for lp in token] for token in response.logprobs][:3] == [
        [entry.token, *(text for i, text, _ in entry.top if i != entry.token_id)] for entry in expected.logprobs[:3]
    ]
    values = [entry.logprob for entry in expected.logprobs]
    assert [token[0].logprob for token in response.logprobs] == pytest.approx(values, abs=1e-4)
    deltas = list(llm.stream_chat([ChatMessage(role="user", content=MESSAGES[0]["content"])]))
    streamed = [token[0].logprob for d in deltas[:-1] if d.logprobs for token in d.logprobs]
    assert streamed == pytest.approx(values, abs=1e-4)
    assert [token[0].logprob for token in deltas[-1].logprobs] == streamed
