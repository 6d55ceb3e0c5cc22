"""Reliability on the tiny pair: bad input, concurrency, cancellation, safe loading (fast, no real weights)."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
import torch
from helpers import PassGate, cancel_while_held, tiny_qwen2

from relaygen_integrations import RelayEngine
from relaygen_integrations.engine import GenerationError, ModelLoadError
from relaygen_integrations.engine.local.loading import load_causal_lm
from relaygen_integrations.langchain import RelayChatModel

MESSAGES = [{"role": "user", "content": "Count the apples: two and three. So how many?"}]


@pytest.fixture(scope="module")
def engine(tokenizer) -> RelayEngine:
    large, small = tiny_qwen2(tokenizer, seed=1), tiny_qwen2(tokenizer, seed=2, hidden=32, layers=1)
    return RelayEngine.from_models(large, small, tokenizer, cues=["the", "a", "and"], policy={"min_large_tokens": 1})


def models(engine: RelayEngine) -> list[torch.nn.Module]:
    return [runner.model for runner in engine.backend.runners.values()]


def spans(result) -> list[tuple[str, str, str, int]]:
    return [(s.model, s.trigger, s.text, s.token_count) for s in result.spans]


def prompts(n: int) -> list[list[dict[str, str]]]:
    return [[{"role": "user", "content": f"Question number {i}: what is {i} plus {i}?"}] for i in range(n)]


async def test_sixteen_concurrent_requests_each_get_their_own_answer(engine):
    batch = prompts(16)
    alone = [engine.generate(m, max_new_tokens=12) for m in batch]
    together = await asyncio.gather(*(engine.agenerate(m, max_new_tokens=12) for m in batch))
    assert [r.completion_ids for r in together] == [r.completion_ids for r in alone]
    assert [spans(r) for r in together] == [spans(r) for r in alone]
    assert [r.finish_reason for r in together] == [r.finish_reason for r in alone] == ["length"] * 16
    # (the cues never fire within 12 tokens of these prompts: each answer is one large-model span)
    assert all(spans(r) == [("large", "start", r.text, 12)] for r in together)


async def test_sixteen_concurrent_langchain_ainvokes(engine):
    model = RelayChatModel(engine=engine, max_tokens=10)
    batch = [m[0]["content"] for m in prompts(16)]
    alone = [model.invoke(q).content for q in batch]
    together = await asyncio.gather(*(model.ainvoke(q) for q in batch))
    assert [m.content for m in together] == alone


def test_threads_share_one_engine_safely(engine):
    batch = prompts(6)
    alone = [engine.generate(m, max_new_tokens=10).completion_ids for m in batch]
    results: dict[int, list[int]] = {}

    def work(i: int) -> None:
        results[i] = engine.generate(batch[i], max_new_tokens=10).completion_ids

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(batch))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert [results[i] for i in range(len(batch))] == alone


def test_cancel_stops_within_one_decode_step(engine):
    cancel = threading.Event()
    stream = engine.stream(MESSAGES, max_new_tokens=500, cancel=cancel)
    for count, event in enumerate(stream, start=1):
        if count == 3:
            passes_at_cancel = sum(r.stats.forward_passes for r in engine.backend.runners.values())
            cancel.set()
        if hasattr(event, "result"):
            result = event.result
    passes_after = sum(r.stats.forward_passes for r in engine.backend.runners.values())
    assert result.finish_reason == "cancelled"
    assert passes_after - passes_at_cancel <= 1
    # The next request starts from consistent caches and gives the answer a fresh engine would.
    runners = engine.backend.runners
    fresh = RelayEngine.from_models(
        runners["large"].model, runners["small"].model, engine.tokenizer, cues=engine.cues,
        policy=engine.policy_config, reuse_prefix=False,
    )  # fmt: skip
    assert (
        engine.generate(MESSAGES, max_new_tokens=15).completion_ids
        == fresh.generate(MESSAGES, max_new_tokens=15).completion_ids
    )


async def test_cancelled_langchain_call_leaves_the_model_usable(engine):
    model = RelayChatModel(engine=engine, max_tokens=15)
    expected = model.invoke("Count the apples").content
    task = asyncio.create_task(model.ainvoke("Count the apples", max_tokens=2000))
    assert await cancel_while_held(PassGate(*models(engine), hold_at=5), task) <= 1
    assert (await model.ainvoke("Count the apples")).content == expected


@pytest.mark.parametrize(
    ("call", "message"),
    [
        ({"max_tokens": 0}, "max_new_tokens should be greater than 0"),
        ({"temperature": -0.5}, "temperature"),
        ({"top_p": 1.5}, "top_p"),
        ({"stop": ["\ud800"]}, "not valid UTF-8"),
    ],
)
def test_langchain_surfaces_bad_settings_as_exceptions(engine, call, message):
    with pytest.raises(GenerationError, match=message):
        RelayChatModel(engine=engine).invoke("hello", **call)


def test_langchain_prompt_too_long_names_the_numbers(engine):
    with pytest.raises(GenerationError, match=r"prompt has \d+ tokens but the context window is 2048"):
        RelayChatModel(engine=engine).invoke("word " * 3000)


def test_missing_or_corrupt_model_dir_is_a_clear_error(tmp_path):
    with pytest.raises(ModelLoadError, match="could not load"):
        load_causal_lm(str(tmp_path / "missing"), torch.float32, torch.device("cpu"))
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "config.json").write_text("{ this is not json")
    with pytest.raises(ModelLoadError, match="could not load"):
        load_causal_lm(str(corrupt), torch.float32, torch.device("cpu"))


def test_pickle_checkpoints_are_refused_unless_allowed(tmp_path, tokenizer):
    model = tiny_qwen2(tokenizer, seed=3, hidden=32, layers=1)
    model.config.save_pretrained(tmp_path)
    torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")
    with pytest.raises(ModelLoadError, match="could not load"):
        load_causal_lm(str(tmp_path), torch.float32, torch.device("cpu"))
    loaded = load_causal_lm(str(tmp_path), torch.float32, torch.device("cpu"), allow_pickle=True)
    assert json.loads(loaded.config.to_json_string())["hidden_size"] == 32


async def test_sixteen_concurrent_llama_index_achats(engine):
    from llama_index.core.base.llms.types import ChatMessage

    from relaygen_integrations.llama_index import RelayLLM

    llm = RelayLLM(engine=engine, max_tokens=10)
    batch = [[ChatMessage(role="user", content=m[0]["content"])] for m in prompts(16)]
    alone = [llm.chat(messages).message.content for messages in batch]
    together = await asyncio.gather(*(llm.achat(messages) for messages in batch))
    assert [r.message.content for r in together] == alone


async def test_cancelled_llama_index_call_leaves_the_llm_usable(engine):
    from relaygen_integrations.llama_index import RelayLLM

    llm = RelayLLM(engine=engine, max_tokens=15)
    expected = llm.complete("Count the apples").text
    task = asyncio.create_task(llm.acomplete("Count the apples", max_tokens=2000))
    assert await cancel_while_held(PassGate(*models(engine), hold_at=5), task) <= 1
    assert (await llm.acomplete("Count the apples")).text == expected


def test_llama_index_surfaces_bad_settings_as_exceptions(engine):
    from relaygen_integrations.llama_index import RelayLLM

    with pytest.raises(GenerationError, match="temperature"):
        RelayLLM(engine=engine).complete("hello", temperature=-1.0)
    with pytest.raises(GenerationError, match="context window"):
        RelayLLM(engine=engine).complete("word " * 3000)


def test_auto_and_resolved_settings_share_one_engine(monkeypatch, engine):
    loads = []

    def fake(cls, large="demo", small="demo", **kwargs):
        loads.append(kwargs)
        return engine

    monkeypatch.setattr(RelayEngine, "from_pretrained", classmethod(fake))
    monkeypatch.setattr("relaygen_integrations.engine.local.loading._SHARED_PAIRS", {})
    first = RelayEngine.shared("org/a", "org/b", dtype="auto", device="auto")
    assert RelayEngine.shared("org/a", "org/b", dtype="bf16", device="cpu") is first
    assert RelayEngine.shared("org/a", "org/b") is first and len(loads) == 1
    RelayEngine.shared("org/a", "org/b", dtype="fp32")
    assert len(loads) == 2
