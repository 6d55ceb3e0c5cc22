"""dtype='gguf': a GGUF's own 4-bit tensors computed as int4 group-wise layers (engine/local/gguf_int4.py), on a tiny
random model written as a GGUF with gguf-py (Q4_K, Q4_1, Q4_0 tensors, one Q8_0 that stays bf16)."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf.quants import dequantize
from helpers import tiny_qwen2

from relaygen_integrations import RelayEngine
from relaygen_integrations.engine.core.backend import BackendCapabilityError
from relaygen_integrations.engine.core.pairs import ModelLoadError
from relaygen_integrations.engine.local.gguf_int4 import Int4GroupLinear, decode_q4_groups, use_gguf_int4
from relaygen_integrations.engine.local.weights import pick_pair_weights, pick_weights

HIDDEN = 256  # Q4_K rows are whole 256-weight super-blocks
BF16_ROUNDING = 2.0**-8  # bf16 keeps 8 significant bits: rounding to nearest is off by at most 2^-8, relative


def random_blocks(type_name: str, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Valid random blocks: random codes and packed scales, fp16 super-scales of a trained model's size."""
    per_block, block_bytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[type_name]]
    blocks = rng.integers(0, 256, size=(rows * cols // per_block, block_bytes), dtype=np.uint8)
    scales = {"Q4_K": 2, "Q4_1": 2, "Q4_0": 1, "Q8_0": 1}[type_name]  # leading fp16 fields: d (, dmin / m)
    for field in range(scales):
        value = rng.uniform(0.0005, 0.003, size=len(blocks)).astype(np.float16)
        if type_name == "Q4_1" and field == 1:
            value = -value * 8  # m, the group's minimum
        blocks[:, 2 * field : 2 * field + 2] = value.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(rows, -1)


# Which GGUF type each layer's tensors get: every 4-bit type, and one that has no int4 form.
LAYER_TYPES = {0: "Q4_K", 1: "Q4_1"}
SPECIAL = {"model.layers.1.self_attn.q_proj": "Q4_0", "model.layers.1.mlp.down_proj": "Q8_0"}


def write_gguf_model(tokenizer, directory: Path, seed: int) -> dict[str, tuple[str, np.ndarray]]:
    """A tiny Qwen2 whose linear layers hold the dequantization of random GGUF blocks (in bf16, as the registry's
    converted copy holds a GGUF's), saved with the GGUF beside it; returns module -> (type, blocks)."""
    model = tiny_qwen2(tokenizer, seed=seed, hidden=HIDDEN)
    rng = np.random.default_rng(seed)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN2, model.config.num_hidden_layers)
    writer = gguf.GGUFWriter(str(directory / "model.gguf"), "qwen2")
    written: dict[str, tuple[str, np.ndarray]] = {}
    for name, module in model.named_modules():
        if type(module) is not torch.nn.Linear or name == "lm_head":
            continue
        type_name = SPECIAL.get(name, LAYER_TYPES[int(name.split(".")[2])])
        rows, cols = module.weight.shape
        blocks = random_blocks(type_name, rows, cols, rng)
        qtype = gguf.GGMLQuantizationType[type_name]
        writer.add_tensor(f"{names.get_name(name)}.weight", blocks, raw_shape=blocks.shape, raw_dtype=qtype)
        with torch.no_grad():
            module.weight.copy_(torch.from_numpy(dequantize(blocks, qtype)).reshape(rows, cols))
        written[name] = (type_name, blocks)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    model.to(torch.bfloat16).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return written


@pytest.fixture(scope="module")
def gguf_pair(tokenizer, tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf-pair")
    written = {}
    for role, seed in (("large", 1), ("small", 2)):
        (root / role).mkdir()
        written[role] = write_gguf_model(tokenizer, root / role, seed)
    return root, written


def bound(int4: Int4GroupLinear) -> torch.Tensor:
    """The rounding bound of the module docstring, per weight: (8*|s| + |z|) * 2^-8 (s, z as the kernel holds them)."""
    scale, zero = int4.scales_and_zeros.float().unbind(-1)  # [groups, rows]
    per_group = (8 * scale.abs() + zero.abs()) * BF16_ROUNDING
    return per_group.t().repeat_interleave(32, dim=1)


def kernel_weights(int4: Int4GroupLinear) -> torch.Tensor:
    """The weights the kernel computes with: its output for the identity (fp32 activations: no output rounding)."""
    identity = torch.eye(int4.in_features)
    scales = int4.scales_and_zeros.float()
    return torch.ops.aten._weight_int4pack_mm_for_cpu(identity, int4.packed, 32, scales).t()


def test_each_4bit_tensor_computes_the_ggufs_own_dequantization_within_the_scale_rounding(gguf_pair):
    root, written = gguf_pair
    model = (
        RelayEngine.from_pretrained(str(root / "large"), str(root / "small"), cues="generic", dtype="gguf")
        .backend.runners["large"]
        .model
    )
    checked = set()
    for name, (type_name, blocks) in written["large"].items():
        layer = model.get_submodule(name)
        if type_name == "Q8_0":
            assert type(layer) is torch.nn.Linear  # no int4 form: the bf16 copy stays
            continue
        assert isinstance(layer, Int4GroupLinear), name
        reference = torch.from_numpy(dequantize(blocks, gguf.GGMLQuantizationType[type_name])).reshape(
            layer.out_features, layer.in_features
        )
        error = (kernel_weights(layer) - reference).abs()
        assert (error <= bound(layer) + 1e-7).all(), (name, type_name, float(error.max()))
        checked.add(type_name)
    assert checked == {"Q4_K", "Q4_1", "Q4_0"}


def test_decoding_matches_gguf_py_for_every_4bit_type():
    # The codes and group constants alone (no kernel, no rounding): a*q - b is gguf-py's dequantization exactly.
    rng = np.random.default_rng(0)
    for type_name in ("Q4_K", "Q4_1", "Q4_0"):
        blocks = random_blocks(type_name, 32, 512, rng)
        codes, a, b = decode_q4_groups(blocks, type_name, 32, 512)
        ours = np.repeat(a, 32, axis=1) * codes - np.repeat(b, 32, axis=1)
        theirs = dequantize(blocks, gguf.GGMLQuantizationType[type_name]).reshape(32, 512)
        np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-7, err_msg=type_name)


def test_the_int4_model_computes_what_the_bf16_copy_does_and_the_engine_runs_on_it(gguf_pair, tokenizer):
    root, _ = gguf_pair
    bf16 = RelayEngine.from_pretrained(str(root / "large"), str(root / "small"), cues="generic", dtype="bf16")
    int4 = RelayEngine.from_pretrained(str(root / "large"), str(root / "small"), cues="generic", dtype="gguf/bf16")
    large_q = int4.backend.runners["large"].model.get_submodule("model.layers.0.self_attn.q_proj")
    small_q = int4.backend.runners["small"].model.get_submodule("model.layers.0.self_attn.q_proj")
    assert isinstance(large_q, Int4GroupLinear) and type(small_q) is torch.nn.Linear  # each model its own format
    ids = torch.tensor([tokenizer.encode("Natalia sold clips to 48 of her friends in April")])
    with torch.no_grad():
        expected = bf16.backend.runners["large"].model(ids).logits.float()
        got = int4.backend.runners["large"].model(ids).logits.float()
    # Same weights up to the scale rounding: logits agree to a small part of their spread.
    assert (got - expected).abs().max() < 0.05 * expected.std()
    messages = [{"role": "user", "content": "Count to five."}]
    assert int4.generate(messages, max_new_tokens=12).usage.completion_tokens == 12
    spec = int4.generate(messages, max_new_tokens=12, speculative=True)
    assert spec.usage.completion_tokens == 12


def test_gguf_is_refused_where_it_cannot_run(tokenizer, tmp_path):
    with pytest.raises(ValueError, match="CPU only"):
        pick_weights("gguf", torch.device("cuda"))
    assert pick_pair_weights("gguf/int8").name == "gguf/int8"
    # A model directory without its GGUF: named before any weights load.
    tiny_qwen2(tokenizer, seed=3).save_pretrained(tmp_path / "plain")
    tokenizer.save_pretrained(tmp_path / "plain")
    with pytest.raises(ModelLoadError, match=r"exactly one \.gguf"):
        RelayEngine.from_pretrained(str(tmp_path / "plain"), str(tmp_path / "plain"), cues="generic", dtype="gguf")
    # An architecture whose tensors transformers reorders on load (Llama's q/k rows): refused, naming the field.
    model = tiny_qwen2(tokenizer, seed=1, hidden=HIDDEN)
    llama = tmp_path / "llama.gguf"
    writer = gguf.GGUFWriter(str(llama), "llama")
    writer.add_tensor("blk.0.attn_q.weight", np.zeros((HIDDEN, HIDDEN), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(BackendCapabilityError) as refused:
        use_gguf_int4(model, llama)
    assert refused.value.field == "dtype"
