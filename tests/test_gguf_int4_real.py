"""dtype='gguf' on the demo pair's own files: each 4-bit tensor of three layers (first, middle, last: every kind of
tensor) in its int4 form against gguf-py's dequantization of it, within the rounding of its group's scale and zero
to bf16 (engine/local/gguf_int4.py, step 3), and the kernel's weights for one tensor of each kind. All 168 of the
large model took 181 s on the AVX512-BF16 EPYC (gguf-py's numpy dequantization), too long for every CI run."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from gguf.quants import dequantize
from test_gguf_int4 import BF16_ROUNDING, bound, kernel_weights

from relaygen_integrations.engine.local.gguf_int4 import Int4GroupLinear, decode_q4_groups
from relaygen_integrations.registry import pair_gguf_paths

pytestmark = pytest.mark.real_pair
FOUR_BIT = ("Q4_K", "Q4_1", "Q4_0")


@pytest.mark.parametrize("role", ["large", "small"])
def test_every_4bit_tensor_of_the_demo_files_is_its_gguf_dequantization_within_the_scale_rounding(role):
    paths = pair_gguf_paths("demo")
    if paths is None:
        pytest.fail("the demo pair's GGUF files are not kept: run `relaygen models fetch demo` (make test does)")
    reader = gguf.GGUFReader(str(paths.for_role(role)))
    last = {"large": 27, "small": 23}[role]
    layers = {f"blk.{n}." for n in (0, last // 2, last)}
    checked, kinds = 0, set()
    for tensor in reader.tensors:
        if tensor.tensor_type.name not in FOUR_BIT or not any(tensor.name.startswith(p) for p in layers):
            continue  # the embedding (not a layer) is a lookup: it stays as the bf16 copy holds it
        cols, rows = (int(n) for n in tensor.shape)
        codes, a, b = decode_q4_groups(np.asarray(tensor.data), tensor.tensor_type.name, rows, cols)
        scale = torch.from_numpy(a).to(torch.bfloat16).float()
        zero = (8.0 * torch.from_numpy(a) - torch.from_numpy(b)).to(torch.bfloat16).float()
        ours = (torch.from_numpy(codes).float() - 8).view(rows, -1, 32) * scale[..., None] + zero[..., None]
        theirs = torch.from_numpy(dequantize(np.asarray(tensor.data), tensor.tensor_type)).view(rows, -1, 32)
        limit = ((8 * scale.abs() + zero.abs()) * BF16_ROUNDING)[..., None] + 1e-7
        assert ((ours - theirs).abs() <= limit).all(), tensor.name
        kind = tensor.name.split(".")[-2]
        if kind not in kinds and rows % 16 == 0:  # the kernel's own weights, once per kind of tensor
            kinds.add(kind)
            layer = Int4GroupLinear.from_codes(codes, a, b, None, torch.bfloat16)
            error = (kernel_weights(layer) - theirs.view(rows, cols)).abs()
            assert (error <= bound(layer) + 1e-7).all(), tensor.name
        checked += 1
    # The large model: every attention and MLP projection kind (half of attn_v / ffn_down are Q6_K); the small one:
    # the Q4_K half of ffn_down (the rest is Q5_0 / Q6_K / Q8_0).
    expected = {"large": {"attn_q", "attn_k", "attn_output", "ffn_gate", "ffn_up"}, "small": {"ffn_down"}}[role]
    assert checked >= len(expected) and expected <= kinds, (checked, kinds)
