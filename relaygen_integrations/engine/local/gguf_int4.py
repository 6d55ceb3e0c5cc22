"""The GGUF's own 4-bit weights, computed as they are: each Q4_K / Q4_1 / Q4_0 tensor of a model's GGUF becomes an
int4 group-wise linear layer (torch's CPU int4 weight-only matmul, groups of 32, one scale and one zero per group);
every other tensor keeps the model's bf16 copy.

Why: the demo pair *is* a Q4_K_M file. The bf16 copy the registry converts holds those 4-bit values dequantized
(3.5 GB for the large model, 4x the file) and a decode step reads all of it; the int4 layer reads the file's own
codes, half a byte a weight, with bf16 activations (no activation quantization, unlike the ``int8`` format).

The algorithm (``decode_q4_groups``, then ``Int4GroupLinear.from_codes``):

1. Every 4-bit GGUF type stores, per group of 32 weights, 4-bit codes ``q`` in 0..15 and a weight ``w = a*q - b``:

   - Q4_K (256-weight super-blocks of eight groups): ``a = d*sc_j``, ``b = dmin*m_j``; ``d``, ``dmin`` fp16 per
     super-block, ``sc_j``, ``m_j`` 6-bit per group (unpacked by gguf-py's own ``Q4_K.get_scale_min``);
   - Q4_1: ``a = d``, ``b = -m``;  Q4_0: ``a = d``, ``b = 8*d``.

2. torch's kernel computes ``w = (q - 8)*s + z`` per group, so ``s = a`` and ``z = 8*a - b``.

3. ``s`` and ``z`` must be held in the activations' dtype (the kernel refuses others): in bf16 each is rounded once
   (to nearest, 8 significant bits: off by at most 2**-8 of itself), so a weight is off the GGUF's own
   dequantization by at most ``(8*|s| + |z|) * 2**-8`` (8 = the largest ``|q - 8|``) - the order of what rounding
   every dequantized weight to bf16 does (``|w| * 2**-8``), which is what the bf16 copy holds.
   ``tests/test_gguf_int4.py`` checks that bound tensor by tensor against gguf-py's dequantization.

Q5_0, Q6_K and Q8_0 tensors (the small demo model's attention and MLP, the large one's output head and half its
``attn_v`` / ``ffn_down``) have no exact int4 form and stay bf16. Only GGUF architectures that transformers loads
without reordering tensors are taken (its ``TENSOR_PROCESSORS`` rewrite e.g. Llama's q/k rows for rotary).
"""

from __future__ import annotations

import gc
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from transformers import PreTrainedModel

from ..core.backend import BackendCapabilityError

GROUP = 32  # weights per group: every 4-bit GGUF type's sub-block, and a group size torch's kernel takes
# torch's CPU int4 packing needs the output features in multiples of 16 (``_convert_weight_to_int4pack_for_cpu``)
PACK_ROWS = 16


def _quant_types() -> dict[str, tuple[int, int]]:
    """GGUF 4-bit type name -> (weights per block, bytes per block), from gguf-py's table."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    return {name: GGML_QUANT_SIZES[GGMLQuantizationType[name]] for name in ("Q4_K", "Q4_1", "Q4_0")}


def decode_q4_groups(raw: np.ndarray, type_name: str, rows: int, cols: int) -> tuple[np.ndarray, ...]:
    """A 4-bit GGUF tensor's ``rows x cols`` codes (uint8, 0..15) and, per group of 32 along ``cols``, ``a`` and
    ``b`` of ``w = a*q - b`` (float32, ``rows x cols/32``). ``raw``: the tensor's bytes, ``rows`` rows of blocks."""
    from gguf.quants import Q4_K

    per_block, block_bytes = _quant_types()[type_name]
    blocks = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1, block_bytes)
    if blocks.shape[0] * per_block != rows * cols:
        raise ValueError(f"a {type_name} tensor of {rows}x{cols} weights cannot hold {blocks.shape[0]} blocks")
    d = blocks[:, :2].view(np.float16).astype(np.float32)
    if type_name == "Q4_K":
        dmin = blocks[:, 2:4].view(np.float16).astype(np.float32)
        sc, m = Q4_K.get_scale_min(blocks[:, 4:16])
        a, b = d * sc.astype(np.float32), dmin * m.astype(np.float32)
        packed = blocks[:, 16:].reshape(-1, 4, 1, 32)  # 4 x 32 bytes: low nibbles one group, high nibbles the next
    else:
        if type_name == "Q4_1":
            a, b = d, -blocks[:, 2:4].view(np.float16).astype(np.float32)
            packed = blocks[:, 4:].reshape(-1, 1, 1, 16)
        else:
            a, b = d, 8.0 * d
            packed = blocks[:, 2:].reshape(-1, 1, 1, 16)  # one group: low nibbles weights 0-15, high 16-31
    codes = (packed >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)) & np.uint8(0x0F)
    return codes.reshape(rows, cols), a.reshape(rows, cols // GROUP), b.reshape(rows, cols // GROUP)


class Int4GroupLinear(torch.nn.Module):
    """A linear layer over int4 codes in groups of 32 (``torch.ops.aten._weight_int4pack_mm_for_cpu``), activations
    in ``scales_and_zeros.dtype``; ``forward`` flattens the leading dimensions (the kernel takes a matrix)."""

    def __init__(
        self, packed: torch.Tensor, scales_and_zeros: torch.Tensor, bias: torch.Tensor | None, in_features: int
    ) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = scales_and_zeros.shape[1]
        self.register_buffer("packed", packed)
        self.register_buffer("scales_and_zeros", scales_and_zeros)
        self.bias = None if bias is None else torch.nn.Parameter(bias, requires_grad=False)

    @classmethod
    def from_codes(
        cls, codes: np.ndarray, a: np.ndarray, b: np.ndarray, bias: torch.Tensor | None, dtype: torch.dtype
    ) -> Int4GroupLinear:
        """Step 2 of the module docstring: ``s = a``, ``z = 8a - b``, packed as the kernel wants them."""
        cols = codes.shape[1]
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(torch.from_numpy(codes).to(torch.int32), 1)
        scale = torch.from_numpy(a)
        zero = 8.0 * scale - torch.from_numpy(b)
        scales_and_zeros = torch.stack([scale.t(), zero.t()], dim=-1).to(dtype).contiguous()  # [cols/32, rows, 2]
        return cls(packed, scales_and_zeros, None if bias is None else bias.detach().to(dtype), cols)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, self.packed, GROUP, self.scales_and_zeros)
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, group={GROUP}"


@dataclass
class GgufInt4Report:
    """What ``use_gguf_int4`` did: which layers became int4 and which kept bf16 (by GGUF type), and the bytes."""

    int4_layers: list[str] = field(default_factory=list)
    kept: dict[str, list[str]] = field(default_factory=dict)  # GGUF type -> layers left in the model's dtype
    int4_bytes: int = 0  # codes + scales and zeros
    replaced_bytes: int = 0  # what the replaced layers' weights took before


def gguf_linear_tensors(model: PreTrainedModel, reader: object) -> dict[str, object]:
    """The model's ``nn.Linear`` module names mapped to their GGUF tensors (gguf-py's own name table for the file's
    architecture). Refuses an architecture whose tensors transformers rewrites on load."""
    from gguf import MODEL_ARCH_NAMES, get_tensor_name_map
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS

    arch_name = str(reader.get_field("general.architecture").contents())  # type: ignore[attr-defined]
    if arch_name in TENSOR_PROCESSORS:
        raise BackendCapabilityError(
            "local",
            f"load a {arch_name!r} GGUF in dtype 'gguf'",
            "that format reads the 4-bit tensors as stored, and transformers reorders this architecture's tensors "
            "on load (its TENSOR_PROCESSORS); use dtype='bf16' or 'int8' for this model",
            field="dtype",
        )
    arch = next((key for key, name in MODEL_ARCH_NAMES.items() if name == arch_name), None)
    if arch is None:
        raise BackendCapabilityError(
            "local", f"load a {arch_name!r} GGUF in dtype 'gguf'", "gguf-py has no tensor names for it", field="dtype"
        )
    names = get_tensor_name_map(arch, model.config.num_hidden_layers)
    by_name = {tensor.name: tensor for tensor in reader.tensors}  # type: ignore[attr-defined]
    # The output head stays as loaded: the draft head reads its rows (``draft_head.py``), and the demo pair's heads
    # are Q6_K / Q8_0, with no int4 form anyway.
    head = model.get_output_embeddings()
    found: dict[str, object] = {}
    for module_name, module in model.named_modules():
        if type(module) is torch.nn.Linear and module is not head:
            gguf_name = names.get_name(module_name)
            tensor = by_name.get(f"{gguf_name}.weight") if gguf_name else None
            if tensor is not None:
                found[module_name] = tensor
    return found


def use_gguf_int4(model: PreTrainedModel, gguf_path: Path) -> GgufInt4Report:
    """Replaces, in place, each linear layer whose GGUF tensor is 4-bit by an :class:`Int4GroupLinear` over that
    tensor's own codes (activations in the model's dtype); the rest keep the model's weights. CPU only."""
    import gguf

    dtype = model.dtype
    if model.device.type != "cpu":
        raise BackendCapabilityError(
            "local",
            f"run dtype 'gguf' on {model.device}",
            "it uses torch's CPU int4 kernel; use dtype='bf16' there",
            field="dtype",
        )
    reader = gguf.GGUFReader(str(gguf_path))
    report = GgufInt4Report()
    four_bit = _quant_types()
    for module_name, tensor in gguf_linear_tensors(model, reader).items():
        layer = model.get_submodule(module_name)
        type_name = tensor.tensor_type.name  # type: ignore[attr-defined]
        rows, cols = layer.out_features, layer.in_features
        if type_name not in four_bit or rows % PACK_ROWS or cols % four_bit[type_name][0]:
            report.kept.setdefault(type_name, []).append(module_name)
            continue
        codes, a, b = decode_q4_groups(np.asarray(tensor.data), type_name, rows, cols)  # type: ignore[attr-defined]
        replacement = Int4GroupLinear.from_codes(codes, a, b, layer.bias, dtype)
        report.replaced_bytes += layer.weight.numel() * layer.weight.element_size()
        report.int4_bytes += replacement.packed.numel() + replacement.scales_and_zeros.nbytes
        report.int4_layers.append(module_name)
        model.set_submodule(module_name, replacement)
    del reader
    gc.collect()
    return report
