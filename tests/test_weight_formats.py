"""Weight formats: dtype names, and int8 dynamic quantization (the fast CPU path on AVX2-only machines)."""

from __future__ import annotations

import pytest
import torch
from helpers import tiny_qwen2

from relaygen_integrations import RelayEngine
from relaygen_integrations.engine.local.runner import ModelRunner
from relaygen_integrations.engine.local.weights import (
    PairWeights,
    RowScaledInt8Linear,
    WeightFormat,
    pick_pair_weights,
    pick_weights,
    quantize_linear_int8,
)


@pytest.mark.parametrize(
    ("spec", "name", "dtype", "quantized"),
    [
        ("auto", "bf16", torch.bfloat16, False),
        ("bfloat16", "bf16", torch.bfloat16, False),
        (torch.bfloat16, "bf16", torch.bfloat16, False),
        ("fp32", "fp32", torch.float32, False),
        (torch.float32, "fp32", torch.float32, False),
        ("int8", "int8", torch.float32, True),
    ],
)
def test_weight_format_names_are_canonical(spec, name, dtype, quantized):
    # One name per format: the shared-engine cache keys on it, so aliases must share one copy of the weights.
    assert pick_weights(spec) == WeightFormat(name, dtype, quantized)


@pytest.mark.parametrize(
    ("native_bf16", "device", "expected"),
    [
        (False, None, "int8"),  # an AVX2-only CPU: int8 is ~2x cheaper per step, ~6x per multi-position pass
        (False, torch.device("cpu"), "int8"),
        (True, torch.device("cpu"), "int8"),  # AVX512-BF16 / AMX: int8 steps still cost half of bf16's
        (False, torch.device("cuda"), "bf16"),  # a GPU, whatever the host CPU has
    ],
)
def test_fast_picks_int8_on_cpus_and_bf16_on_gpus(monkeypatch, native_bf16, device, expected):
    from relaygen_integrations.engine.local import cpu

    monkeypatch.setattr(cpu, "has_native_bf16", lambda: native_bf16)
    assert pick_weights("fast", device).name == expected
    # "fast" shares the loaded weights of what it resolves to (the shared-engine cache keys on the name).
    assert pick_weights("fast", device) == pick_weights(expected, device)


@pytest.mark.parametrize(
    ("flags", "environment", "native"),
    [
        (("avx2", "fma"), {}, False),
        (("avx2", "avx512f", "amx_bf16"), {}, True),
        (("avx2", "avx512_bf16"), {"ONEDNN_MAX_CPU_ISA": "AVX2"}, False),  # the AVX2 paths of an AMX CPU
        (("avx2", "avx512_bf16"), {"DNNL_MAX_CPU_ISA": "avx512_core_amx"}, True),
        (("avx2", "amx_bf16"), {"MKL_ENABLE_INSTRUCTIONS": "AVX2"}, False),
        (("avx2", "amx_bf16"), {"ATEN_CPU_CAPABILITY": "avx2"}, True),  # ATen's own kernels: not the matmuls
    ],
)
def test_native_bf16_follows_the_cpu_and_the_isa_caps_set(monkeypatch, flags, environment, native):
    from relaygen_integrations.engine.local import cpu

    monkeypatch.setattr(cpu, "cpu_model_and_flags", lambda: ("test CPU", flags))
    for name in cpu.ISA_LIMIT_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    assert cpu.has_native_bf16() is native
    assert cpu.isa_limits() == environment


def test_bench_records_what_fast_resolved_to(monkeypatch):
    from relaygen_integrations.bench.run import resolved_dtype

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolved_dtype("fast") == "int8 (fast)"
    assert resolved_dtype("auto") == "bf16 (auto)"
    assert resolved_dtype("int8") == "int8"
    assert resolved_dtype("bfloat16/int8") == "bf16/int8 (bfloat16/int8)"
    assert resolved_dtype("bf16/int8") == "bf16/int8"


def test_int8_reads_the_bf16_copy_and_refuses_gpus():
    assert pick_weights("int8").source_dtype == torch.bfloat16
    with pytest.raises(ValueError, match="CPU only"):
        pick_weights("int8", torch.device("cuda"))
    with pytest.raises(ValueError, match="unknown dtype 'int4'"):
        pick_weights("int4")


def test_int8_quantizes_every_linear_layer_and_relay_runs_on_it(tokenizer):
    large, small = tiny_qwen2(tokenizer, seed=1), tiny_qwen2(tokenizer, seed=2, hidden=32)
    reference = large.lm_head.weight.detach().clone()
    for model in (large, small):
        quantize_linear_int8(model)
        assert not [name for name, module in model.named_modules() if type(module) is torch.nn.Linear]
    quantized_head = large.lm_head.weight().dequantize()
    # Per-channel int8: every weight within half its own row's quantization step (row max |w| / 127).
    row_step = reference.abs().amax(dim=1) / 127
    assert ((quantized_head - reference).abs().amax(dim=1) <= row_step / 2 + 1e-7).all()
    engine = RelayEngine.from_models(large, small, tokenizer, cues=["the"])
    messages = [{"role": "user", "content": "Say something about the sea."}]
    for speculative in (False, True):
        result = engine.generate(messages, max_new_tokens=24, speculative=speculative, verify="prob:0.01")
        assert "".join(result.text[s.start : s.end] for s in result.spans) == result.text
        assert result.usage.large_tokens + result.usage.small_tokens == result.usage.completion_tokens == 24


def test_a_bf16_load_quantizes_to_the_numbers_of_an_fp32_load(tokenizer):
    # from_pretrained(dtype="int8") loads the bf16 copy and upcasts one layer at a time (half the peak memory of an
    # fp32 load); the model must be the one quantizing an fp32 load of the same weights gives.
    reference = tiny_qwen2(tokenizer, seed=5, hidden=32).to(torch.bfloat16)
    from_fp32 = quantize_linear_int8(tiny_qwen2(tokenizer, seed=5, hidden=32).to(torch.bfloat16).float())
    from_bf16 = quantize_linear_int8(reference)
    assert all(p.dtype == torch.float32 for p in from_bf16.parameters())  # embeddings and norms: the activations'
    ids = torch.tensor([tokenizer.encode("The sea is calm today.")])
    with torch.inference_mode():
        assert torch.equal(from_bf16(ids).logits, from_fp32(ids).logits)
    assert torch.equal(from_bf16.lm_head.weight().int_repr(), from_fp32.lm_head.weight().int_repr())


def test_from_pretrained_int8_loads_and_quantizes_a_saved_pair(tokenizer, tmp_path):
    for role, seed in (("large", 1), ("small", 2)):
        tiny_qwen2(tokenizer, seed=seed).to(torch.bfloat16).save_pretrained(tmp_path / role)
        tokenizer.save_pretrained(tmp_path / role)
    engine = RelayEngine.from_pretrained(str(tmp_path / "large"), str(tmp_path / "small"), cues="generic", dtype="int8")
    for runner in engine.backend.runners.values():
        assert type(runner.model.lm_head) is RowScaledInt8Linear
        assert runner.model.model.embed_tokens.weight.dtype == torch.float32  # activations in fp32
    result = engine.generate([{"role": "user", "content": "Hello"}], max_new_tokens=8)
    assert result.usage.completion_tokens == 8


@pytest.mark.parametrize(
    ("spec", "large", "small", "name"),
    [
        ("bf16", "bf16", "bf16", "bf16"),
        ("bf16/int8", "bf16", "int8", "bf16/int8"),
        ("bfloat16/int8", "bf16", "int8", "bf16/int8"),  # one canonical name per combination
        ({"large": "bf16", "small": "int8"}, "bf16", "int8", "bf16/int8"),
        ({"small": "int8"}, "int8", "int8", "int8"),  # a missing role takes the other's
        ("int8/int8", "int8", "int8", "int8"),
        ("fp32/bf16", "fp32", "bf16", "fp32/bf16"),
    ],
)
def test_each_model_gets_its_own_format(spec, large, small, name):
    weights = pick_pair_weights(spec)
    assert (weights.large, weights.small) == (pick_weights(large), pick_weights(small))
    assert weights.name == name
    assert weights["large"] is weights.large and weights["small"] is weights.small


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("bf16/int4", "the small model's dtype: unknown dtype 'int4'"),
        ("int3/bf16", "the large model's dtype: unknown dtype 'int3'"),
        ("bf16/", "'LARGE/SMALL'"),
        ("bf16/int8/fp32", "'LARGE/SMALL'"),
        ({"draft": "int8"}, "'large' and/or 'small'"),
    ],
)
def test_a_bad_per_model_format_names_the_part(spec, message):
    with pytest.raises(ValueError, match=message):
        pick_pair_weights(spec)


def test_shared_engines_key_on_the_canonical_combination(monkeypatch):
    from relaygen_integrations.engine.local import loading

    loads: list[object] = []
    monkeypatch.setattr(loading, "_SHARED_PAIRS", {})
    monkeypatch.setattr(RelayEngine, "from_pretrained", classmethod(lambda cls, **kw: loads.append(kw) or object()))
    first = RelayEngine.shared("a", "b", dtype="bf16/int8")
    assert RelayEngine.shared("a", "b", dtype={"large": "bfloat16", "small": "int8"}) is first
    assert RelayEngine.shared("a", "b", dtype="bf16") is not first
    assert len(loads) == 2


def test_a_drafter_in_another_format_changes_no_greedy_answer(tokenizer, pair):
    # The large model decides every token of a greedy speculative answer, so the small model's format (here int8
    # under an fp32 large model) changes what is drafted and accepted, never the text.
    import copy

    large, small = pair
    int8_small = quantize_linear_int8(copy.deepcopy(small))
    messages = [{"role": "user", "content": "Tell me about the sea and the sky."}]
    alone = RelayEngine.from_models(large, None, tokenizer).generate(messages, mode="large", max_new_tokens=40)
    drafted = {}
    for name, drafter in (("fp32", small), ("int8", int8_small)):
        engine = RelayEngine.from_models(large, drafter, tokenizer, speculative=True)
        result = engine.generate(messages, mode="large", max_new_tokens=40)
        assert result.completion_ids == alone.completion_ids, name
        drafted[name] = (result.usage.draft_tokens, result.usage.accepted_draft_tokens)
    assert drafted["int8"][0] > 0 and drafted["fp32"][0] > 0
    assert isinstance(pick_pair_weights("fp32/int8"), PairWeights)


def test_from_pretrained_loads_each_model_in_its_own_format(tokenizer, tmp_path):
    for role, seed in (("large", 1), ("small", 2)):
        tiny_qwen2(tokenizer, seed=seed).to(torch.bfloat16).save_pretrained(tmp_path / role)
        tokenizer.save_pretrained(tmp_path / role)
    engine = RelayEngine.from_pretrained(
        str(tmp_path / "large"), str(tmp_path / "small"), cues="generic", dtype="bf16/int8"
    )
    runners = engine.backend.runners
    assert runners["large"].model.lm_head.weight.dtype == torch.bfloat16
    assert type(runners["small"].model.lm_head) is RowScaledInt8Linear
    result = engine.generate([{"role": "user", "content": "Hello"}], max_new_tokens=8, speculative=True)
    assert result.usage.completion_tokens == 8


def test_auto_takes_the_formats_and_speculation_a_known_pair_ships(monkeypatch, tmp_path):
    import json

    from relaygen_integrations.engine.core import configuration
    from relaygen_integrations.engine.core.configuration import PairConfiguration, pair_formats
    from relaygen_integrations.engine.core.pairs import known_pair
    from relaygen_integrations.engine.core.shipped import ShippedProfile

    profile = tmp_path / "p.json"
    profile.write_text(json.dumps({"dtype": {"cpu": "bf16/int8", "cuda": "bf16", "benchmark": "x"},
                                   "speculative": {"draft": True}, "mode": {"mode": "nonsense"}}))  # fmt: skip
    shipped = ShippedProfile.read(profile)
    monkeypatch.setattr(configuration, "shipped_profile", lambda pair: shipped if pair == "demo" else None)
    assert known_pair("demo", "demo:small") == "demo" and known_pair("demo", "/some/dir") is None
    assert pair_formats("demo", "cpu", "auto") == "bf16/int8"
    assert pair_formats("demo", "cuda", "auto") == "bf16"
    assert pair_formats("demo", "cpu", "fp32") == "fp32"  # an explicit choice wins
    assert pair_formats(None, "cpu", "auto") == "auto"  # bf16 for an unknown pair
    assert (
        PairConfiguration.shipped("demo").speculative is True and PairConfiguration.shipped(None).speculative is False
    )
    assert PairConfiguration.shipped("demo").mode == "relay"  # an entry naming no mode is ignored, not passed on


def test_int8_layers_scale_each_token_alone():
    # fbgemm's dynamic int8 linear quantizes a whole pass with one scale: an outlier row (an attention sink) would
    # coarsen every other row. The engine's int8 layers give each row its own scale, so a row's output is the same
    # alone or in a pass, and as close to fp32 as alone.
    from torch.ao.quantization import quantize_dynamic

    torch.manual_seed(0)
    reference = torch.nn.Linear(256, 256)
    plain = quantize_dynamic(torch.nn.Sequential(reference), {torch.nn.Linear}, dtype=torch.qint8)[0]
    model = torch.nn.Sequential(torch.nn.Linear(256, 256))
    model[0].load_state_dict(reference.state_dict())
    model.config = None  # quantize_linear_int8 only walks the modules
    layer = quantize_linear_int8(model)[0]
    assert isinstance(layer, RowScaledInt8Linear)
    x = torch.randn(2, 256)
    x[1] *= 50
    with torch.inference_mode():
        exact = reference(x[:1])
        # Bit for bit: a fixed quantization step for the scaled rows, not one from each pass's min/max (with that,
        # measured here: rows differed by up to 0.007, enough to turn greedy decoding after a reused prefix).
        assert torch.equal(layer(x)[:1], layer(x[:1]))
        wide = torch.randn(9, 256) * torch.logspace(-1, 1, 9)[:, None]
        assert all(torch.equal(layer(wide)[row], layer(wide[row : row + 1])[0]) for row in range(9))
        assert (layer(x)[:1] - exact).abs().max() < 0.05
        assert (plain(x)[:1] - exact).abs().max() > 0.5  # what a shared scale does to the same row
        # One row alone: closer to fp32 than the plain layer's 7-bit activations give it.
        assert (layer(x[:1]) - exact).abs().mean() < 0.7 * (plain(x[:1]) - exact).abs().mean()


def test_int8_layers_keep_each_output_channel_and_all_eight_activation_bits():
    # torch's default dynamic qconfig scales a weight tensor as a whole: the rows of a layer whose rows differ in
    # size (here a hundredfold) keep a few levels each. And fbgemm's 7-bit activations double the error of 8 bits.
    from torch.ao.quantization import quantize_dynamic

    torch.manual_seed(0)
    reference = torch.nn.Linear(256, 256)
    with torch.no_grad():
        reference.weight.mul_(torch.logspace(-2, 0, 256)[:, None])
    plain = quantize_dynamic(torch.nn.Sequential(reference), {torch.nn.Linear}, dtype=torch.qint8)[0]
    model = torch.nn.Sequential(torch.nn.Linear(256, 256))
    model[0].load_state_dict(reference.state_dict())
    model.config = None
    layer = quantize_linear_int8(model)[0]
    row_step = reference.weight.abs().amax(dim=1) / 127
    for quantized, bound in ((layer, 0.5), (plain, None)):
        error = (quantized.weight().dequantize() - reference.weight).abs().amax(dim=1) / row_step
        assert (error.max() <= bound + 1e-3) if bound is not None else error.max() > 10  # per tensor: 50 steps
    x = torch.randn(4, 256)
    with torch.inference_mode():
        exact = reference(x)
        relative = ((layer(x) - exact).abs() / exact.abs().mean(dim=0)).mean(dim=0)
        plain_relative = ((plain(x) - exact).abs() / exact.abs().mean(dim=0)).mean(dim=0)
        assert relative[:64].mean() < 0.1 * plain_relative[:64].mean()  # the small rows: measured 0.003 vs 0.081
        packed, scale = layer._packed_params._packed_params, x.abs().amax(dim=-1, keepdim=True)
        seven_bits = torch.ops.quantized.linear_dynamic(x / scale, packed, reduce_range=True) - layer.float_bias
        seven_bits = seven_bits * scale + layer.float_bias
        assert (layer(x) - exact).abs().mean() < 0.7 * (seven_bits - exact).abs().mean()  # measured 0.57


def test_an_int8_models_logits_do_not_depend_on_what_its_cache_held(tokenizer):
    # A warm request (its prompt's prefix reused) runs the prompt's last token in a one-token pass; a cold one runs
    # the prompt before it in a pass of its own and then that token alone, so both give the very same logits and
    # greedy decoding does not turn on what ran before (with the whole prompt in one pass and each pass quantized at
    # its own step the warm logits differed by up to 0.32 here). Within a pass the int8 layers compute each row as
    # alone (test_int8_layers_scale_each_token_alone); attention over 1 query or 5 need not round alike.
    model = quantize_linear_int8(tiny_qwen2(tokenizer, seed=1))
    runner = ModelRunner("small", model)
    prompt = tokenizer("Natalia sold clips to 48 of her friends in April, and half as many in May.")["input_ids"]
    runner.begin_request(prompt, reuse_prefix=False)
    cold = runner.logits_for(prompt)
    steps, ids = [cold], list(prompt)
    for _ in range(4):
        ids.append(int(steps[-1].argmax()))
        steps.append(runner.logits_for(ids))
    runner.begin_request(prompt, reuse_prefix=True)
    assert runner.stats.reused_tokens == len(prompt) - 1
    assert torch.equal(runner.logits_for(prompt), cold)
    for step, token in enumerate(ids[len(prompt) :], start=1):
        assert torch.equal(runner.logits_for([*ids[: len(prompt) + step - 1], token]), steps[step])
