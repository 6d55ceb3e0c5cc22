"""Verified relay over endpoints: the large server scores each small run with vLLM's ``prompt_logprobs`` and the
transcript is cut where the rule rejects. Two ``relaygen serve --single`` apps (which answer ``prompt_logprobs`` as
vLLM does) over a tiny fp32 pair must give exactly the local engine's verified relay."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from test_remote import ServerThread

from relaygen_integrations import RelayEngine
from relaygen_integrations.engine import GenerationError
from relaygen_integrations.engine.core.spans import TextEvent
from relaygen_integrations.serve.single import create_single_app

MESSAGES = [{"role": "user", "content": "Count the apples: two and three. So how many?"}]
POLICY = {"min_large_tokens": 1, "max_small_tokens": 4}
BUDGET = 48


@pytest.fixture(scope="module")
def large_text(tokenizer, pair):
    return RelayEngine.from_models(*pair, tokenizer, cues=[]).generate(MESSAGES, max_new_tokens=BUDGET, mode="large")


@pytest.fixture(scope="module")
def cues(large_text) -> list[str]:
    """Words of the large model's own greedy text: sure to fire on random weights."""
    return sorted(set(re.findall(r"(?<![\w])[A-Za-z]{2,}(?![\w])", large_text.text)))


@pytest.fixture(scope="module")
def local(tokenizer, pair, cues) -> RelayEngine:
    return RelayEngine.from_models(*pair, tokenizer, cues=cues, policy=POLICY)


@pytest.fixture(scope="module")
def remote(tokenizer, pair, cues) -> Iterator[RelayEngine]:
    large, small = (create_single_app(model, tokenizer) for model in pair)
    with ServerThread(large) as large_server, ServerThread(small) as small_server:
        engine = RelayEngine.from_endpoints(large_server.url, small_server.url, tokenizer, cues=cues, policy=POLICY,
                                            retries=0)  # fmt: skip
        yield engine
        engine.close()


def summary(result) -> tuple:
    usage = result.usage
    return (result.text, result.completion_ids, [(s.model, s.trigger, s.text) for s in result.spans],
            usage.small_tokens, usage.rejected_tokens, usage.verified_tokens, result.finish_reason)  # fmt: skip


@pytest.mark.parametrize("rule", ["greedy", "prob:0.3", "ratio:0.5"])
def test_remote_verified_relay_equals_local(local, remote, rule):
    expected = local.generate(MESSAGES, max_new_tokens=BUDGET, verify=rule)
    result = remote.generate(MESSAGES, max_new_tokens=BUDGET, verify=rule)
    assert expected.usage.rejected_tokens > 0, "the small model's tokens are rejected on these weights"
    assert summary(result) == summary(expected)
    assert result.usage.requests > len(result.spans)  # each small run is scored in a request of its own


def test_greedy_verification_over_endpoints_writes_the_large_models_text(remote, large_text):
    plain = remote.generate(MESSAGES, max_new_tokens=BUDGET)
    verified = remote.generate(MESSAGES, max_new_tokens=BUDGET, verify="greedy")
    assert plain.completion_ids != large_text.completion_ids and plain.usage.small_tokens > 0
    assert verified.completion_ids == large_text.completion_ids and verified.usage.rejected_tokens > 0


def test_streamed_text_is_only_ever_verified_text(local, remote):
    def texts(engine):
        return [(e.model, e.text) for e in engine.stream(MESSAGES, max_new_tokens=BUDGET, verify="prob:0.3")
                if isinstance(e, TextEvent)]  # fmt: skip

    streamed = texts(remote)
    assert streamed == texts(local)
    assert "".join(t for _, t in streamed) == local.generate(MESSAGES, max_new_tokens=BUDGET, verify="prob:0.3").text


def test_a_server_that_cannot_score_is_refused_before_any_generation(tokenizer, pair, cues):
    requests: list[dict] = []
    large = create_single_app(pair[0], tokenizer, report_prompt_logprobs=False)

    @large.middleware("http")
    async def count(request, call_next):
        requests.append({"path": request.url.path})
        return await call_next(request)

    small = create_single_app(pair[1], tokenizer)
    with ServerThread(large) as large_server, ServerThread(small) as small_server:
        engine = RelayEngine.from_endpoints(large_server.url, small_server.url, tokenizer, cues=cues, retries=0)
        with pytest.raises(GenerationError, match="does not score prompts \\(no prompt_logprobs"):
            engine.generate(MESSAGES, max_new_tokens=8, verify="greedy")
        probes = len(requests)
        with pytest.raises(GenerationError, match="prompt_logprobs"):
            engine.generate(MESSAGES, max_new_tokens=8, verify="greedy")
        assert len(requests) == probes, "the server was asked once; the answer is remembered"
        assert engine.generate(MESSAGES, max_new_tokens=8).usage.completion_tokens == 8
        engine.close()
