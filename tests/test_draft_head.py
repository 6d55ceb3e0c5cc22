"""A reduced draft vocabulary (``draft_vocab``): drafts score a subset of the vocabulary, the output stays the large
model's (greedy: token-identical; sampling: the acceptance rule holds for a draft distribution that is zero outside
the subset), the small model's own segments still use its full output layer, and bad values are typed errors."""

from __future__ import annotations

import re

import pytest
import torch
from helpers import tiny_qwen2

from relaygen_integrations import RelayEngine
from relaygen_integrations.engine import GenerationError
from relaygen_integrations.engine.local.draft_head import DraftHead, draft_vocab_ids
from relaygen_integrations.engine.local.sampling import Sampler, SamplingParams
from relaygen_integrations.engine.local.speculative import accept
from relaygen_integrations.engine.local.weights import quantize_linear_int8

MESSAGES = [{"role": "user", "content": "Count the apples: two and three. So how many?"}]
# Random weights write ids from the whole vocabulary; 60k of 152k keeps many of them and rejects the rest.
VOCAB = 60_000


@pytest.fixture(scope="module")
def cues(tokenizer, pair):
    """Words the large model writes: random weights seldom write English, so cues must come from its own text."""
    text = RelayEngine.from_models(*pair, tokenizer, cues=[]).generate(MESSAGES, max_new_tokens=40, mode="large").text
    return sorted(set(re.findall(r"(?<![\w])[A-Za-z]{2,}(?![\w])", text)))


def engine_over(tokenizer, large, small, cues=(), **kwargs) -> RelayEngine:
    kwargs.setdefault("draft_confidence", 0.0)  # random weights: every draft would stop after one token otherwise
    return RelayEngine.from_models(
        large, small, tokenizer, cues=list(cues), policy={"min_large_tokens": 1, "max_small_tokens": 4}, **kwargs
    )


@pytest.mark.parametrize(
    ("mode", "settings"),
    [("large", {}), ("relay", {}), ("relay", {"verify": "greedy"}), ("relay", {"verify": "prob:0.3"})],
)
def test_greedy_drafts_over_a_subset_write_the_same_tokens(tokenizer, pair, cues, mode, settings):
    full = engine_over(tokenizer, *pair, cues=cues)
    reduced = engine_over(tokenizer, *pair, cues=cues, draft_vocab=VOCAB)
    prompt_ids = full.encode_messages(MESSAGES)
    plain = full.generate_ids(prompt_ids, max_new_tokens=40, mode=mode, **settings)
    spec = reduced.generate_ids(prompt_ids, max_new_tokens=40, mode=mode, speculative=5, **settings)
    assert spec.completion_ids == plain.completion_ids
    assert [(s.model, s.text) for s in spec.spans] == [(s.model, s.text) for s in plain.spans]
    assert spec.usage.draft_tokens > 0
    assert spec.usage.small_tokens == plain.usage.small_tokens
    if mode == "relay" and not settings:
        assert spec.usage.small_tokens > 0  # verification may reject every small token of a random model


def test_drafts_propose_only_subset_and_prompt_tokens_and_a_twin_is_rejected_only_outside(tokenizer, pair):
    twin = tiny_qwen2(tokenizer, seed=1, hidden=64, layers=2)
    engine = engine_over(tokenizer, pair[0], twin, draft_vocab=VOCAB)
    prompt_ids = engine.encode_messages(MESSAGES)
    large = engine.backend.runners["large"]
    rounds: list[tuple[list[int], list[int]]] = []  # (draft, the large model's choice after each draft prefix)
    check_draft = large.check_draft

    def recording(ids: list[int], draft: list[int], kind: str = "verify_drafts") -> torch.Tensor:
        logits = check_draft(ids, draft, kind)
        rounds.append((list(draft), torch.argmax(logits, dim=-1).tolist()))
        return logits

    large.check_draft = recording  # type: ignore[method-assign]
    result = engine.generate_ids(prompt_ids, max_new_tokens=40, mode="large", speculative=6)
    allowed = set(range(VOCAB)) | set(prompt_ids) | set(tokenizer.all_special_ids)
    assert rounds and all(set(draft) <= allowed for draft, _ in rounds)
    # The twin agrees with the large model wherever the large model's choice is in the subset, so a draft is
    # rejected exactly where the large model's choice lies outside it.
    first_mismatches = [
        next(c for d, c in zip(draft, choices, strict=False) if d != c)
        for draft, choices in rounds
        if draft != choices[: len(draft)]
    ]
    assert first_mismatches and all(choice not in allowed for choice in first_mismatches)
    assert result.usage.acceptance_rate < 1.0
    plain = engine_over(tokenizer, pair[0], twin).generate_ids(prompt_ids, max_new_tokens=40, mode="large")
    assert result.completion_ids == plain.completion_ids


def test_the_small_models_own_tokens_come_from_its_full_output_layer(tokenizer, pair, cues):
    engine = engine_over(tokenizer, *pair, cues=cues, draft_vocab=1000)  # almost nothing the random model writes
    prompt_ids = engine.encode_messages(MESSAGES)
    result = engine.generate_ids(prompt_ids, max_new_tokens=40, speculative=4)
    assert result.usage.small_tokens > 0
    plain = engine_over(tokenizer, *pair, cues=cues).generate_ids(prompt_ids, max_new_tokens=40)
    assert result.completion_ids == plain.completion_ids
    ids = prompt_ids + result.completion_ids
    runner = engine.backend.runners["small"]
    cached = runner.logits_for(ids)  # full logits, whether the last pass was a draft or not
    with torch.no_grad():
        fresh = pair[1](torch.tensor([ids])).logits[0, -1].float()
    torch.testing.assert_close(cached, fresh, atol=1e-4, rtol=1e-4)
    assert torch.isfinite(cached).all()


@pytest.mark.parametrize("quantized", [None, "per-tensor", "per-channel"])
def test_the_subset_logits_are_the_full_layers_rows(tokenizer, quantized):
    model = tiny_qwen2(tokenizer, seed=3, hidden=32, layers=1)
    if quantized == "per-tensor":
        model = quantize_linear_int8(model)
    elif quantized == "per-channel":
        from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

        model = quantize_dynamic(model, {torch.nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8)
    ids = draft_vocab_ids(5000, tokenizer, len(tokenizer))
    assert ids is not None and len(ids) == 5000 + sum(i >= 5000 for i in set(tokenizer.all_special_ids) | set(
        tokenizer.added_tokens_decoder))  # fmt: skip
    head = DraftHead(model, ids)
    head.begin_request([7, 90_000, 120_000, 90_000])
    assert head.size == len(ids) + 2
    hidden = torch.randn(3, 32)
    with torch.no_grad():
        full = model.get_output_embeddings()(hidden).float()
    reduced = head.logits(hidden)
    kept = torch.cat([ids, torch.tensor([90_000, 120_000])])
    if quantized:
        assert torch.equal(reduced[:, ids], full[:, ids])  # same int8 weights and scales: the very same numbers
        torch.testing.assert_close(reduced[:, kept], full[:, kept], atol=0.05, rtol=0.05)  # prompt rows: float
    else:
        torch.testing.assert_close(reduced[:, kept], full[:, kept])
    outside = torch.ones(len(tokenizer), dtype=torch.bool)
    outside[kept] = False
    assert torch.isneginf(reduced[:, outside]).all()


def test_sampled_drafts_from_a_subset_keep_the_target_distribution():
    """q is zero outside the subset {0, 1, 2}; the committed token must still be distributed as p (token 3 only
    through the residual)."""
    p = torch.tensor([0.4, 0.2, 0.1, 0.3])
    q = torch.tensor([0.2, 0.5, 0.3, 0.0])
    sampler = Sampler(SamplingParams(temperature=1.0, seed=0))
    target_logits = torch.log(p).repeat(2, 1)
    counts = torch.zeros(4)
    for _ in range(20_000):
        draft = [int(torch.multinomial(q, 1, generator=sampler.generator))]
        committed, _ = accept(draft, target_logits, [q], sampler, [0])
        counts[committed[0]] += 1
    assert 0.5 * float((counts / counts.sum() - p).abs().sum()) < 0.015


def test_sampling_with_a_reduced_vocabulary_is_seeded_and_reproducible(tokenizer, pair):
    engine = engine_over(tokenizer, *pair, draft_vocab=VOCAB)
    settings = {"max_new_tokens": 30, "temperature": 1.0, "top_k": 50, "seed": 3, "speculative": 4}
    first, second = engine.generate(MESSAGES, **settings), engine.generate(MESSAGES, **settings)
    assert first.completion_ids == second.completion_ids and first.usage.draft_tokens > 0


@pytest.mark.parametrize("value", [0, -5, True, "32k", 2.5, [1, 10**9], []])
def test_bad_draft_vocab_is_a_typed_error_naming_it(tokenizer, pair, value):
    with pytest.raises(GenerationError, match="draft_vocab") as caught:
        engine_over(tokenizer, *pair, draft_vocab=value)
    assert caught.value.field == "draft_vocab"


def test_a_subset_as_large_as_the_vocabulary_is_the_full_layer(tokenizer, pair):
    assert engine_over(tokenizer, *pair, draft_vocab=10**6).backend.draft_head(None) is None
    listed = engine_over(tokenizer, *pair, draft_vocab=[5, 6, 7]).backend.draft_head(None)
    assert listed.size == 3 + len(set(tokenizer.all_special_ids) | set(tokenizer.added_tokens_decoder))


def test_a_request_chooses_its_draft_vocabulary(tokenizer, pair, cues):
    twin = tiny_qwen2(tokenizer, seed=1, hidden=64, layers=2)  # a drafter that agrees wherever it can propose
    engine = engine_over(tokenizer, pair[0], twin, cues=cues, draft_vocab=VOCAB)
    prompt_ids = engine.encode_messages(MESSAGES)
    runs = {
        vocab: engine.generate_ids(prompt_ids, max_new_tokens=30, mode="large", speculative=4, draft_vocab=vocab)
        for vocab in (None, 0, 2000)
    }
    assert len({tuple(r.completion_ids) for r in runs.values()}) == 1  # the same text whatever the drafts score
    backend = engine.backend
    assert set(backend.draft_heads) == {VOCAB, 2000}  # the engine's default and the request's, each built once
    assert backend.draft_head(0) is None and backend.draft_head(2000) is backend.draft_heads[2000]
    # The full vocabulary accepts drafts a 2000-token subset cannot propose.
    assert runs[0].usage.acceptance_rate == 1.0 > runs[2000].usage.acceptance_rate
    with pytest.raises(GenerationError, match="draft_vocab") as caught:
        engine.generate_ids(prompt_ids, max_new_tokens=4, speculative=2, draft_vocab=-1)
    assert caught.value.field == "draft_vocab"


def test_a_model_that_transforms_its_logits_is_refused(tokenizer):
    model = tiny_qwen2(tokenizer, seed=4, hidden=32, layers=1)
    model.config.final_logit_softcapping = 30.0
    with pytest.raises(GenerationError, match="final_logit_softcapping"):
        RelayEngine.from_models(tiny_qwen2(tokenizer, seed=1, hidden=32, layers=1), model, tokenizer, draft_vocab=100)


def test_a_static_cache_drafts_over_a_subset_exactly_too(tokenizer, pair, cues):
    prompt_ids = engine_over(tokenizer, *pair).encode_messages(MESSAGES)
    eager = engine_over(tokenizer, *pair, cues=cues).generate_ids(prompt_ids, max_new_tokens=40)
    static = engine_over(tokenizer, *pair, cues=cues, draft_vocab=VOCAB, kv_cache="static")
    result = static.generate_ids(prompt_ids, max_new_tokens=40, speculative=4)
    assert result.completion_ids == eager.completion_ids and result.usage.draft_tokens > 0


def test_the_demo_pair_ships_the_draft_vocabulary_its_benchmark_chose():
    """The size the demo pair gets is read from its benchmark's results, not from the profile that names it: the one
    reduced vocabulary the benchmark measured (its ``mode@size`` modes), where every speculative mode ran faster than
    over the whole vocabulary, each small-model token cost less and acceptance stayed as it was."""
    import json
    from pathlib import Path

    from relaygen_integrations.engine.core.configuration import PairConfiguration
    from relaygen_integrations.engine.core.shipped import shipped_profile

    profile = shipped_profile("demo").data
    benchmark = profile["draft_vocab"]["benchmark"]
    assert benchmark.startswith("benchmarks/data/")  # where the choice is measured
    results = json.loads((Path(__file__).resolve().parents[1] / benchmark / "results.json").read_text(encoding="utf-8"))
    subset_modes = [mode for mode in results["config"]["modes"] if "@" in mode]
    size = PairConfiguration.shipped("demo").draft_vocab
    assert subset_modes and {int(mode.rsplit("@", 1)[1]) for mode in subset_modes} == {size}, (subset_modes, size)
    summary = results["summary"]
    for mode in subset_modes:
        subset, whole = summary[mode], summary[mode.rsplit("@", 1)[0]]
        assert subset["speedup_vs_large"] > whole["speedup_vs_large"], mode
        assert subset["ms_per_small_token"] < whole["ms_per_small_token"], mode
        # "Unchanged acceptance": within the run-to-run spread of 8 problems (0.825 -> 0.812 for relay-spec).
        assert abs(subset["acceptance_rate"] - whole["acceptance_rate"]) < 0.02, mode
    assert PairConfiguration.shipped(None).draft_vocab is None
    assert PairConfiguration.shipped("no-such-pair").draft_vocab is None
