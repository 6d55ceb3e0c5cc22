"""Weight formats per model: dtype choice, the pair's per-model formats (``bf16/int8``) and int8 quantization."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import torch
from torch.ao.nn.quantized.dynamic import Linear as DynamicQuantizedLinear
from transformers import PreTrainedModel

from ..core.spans import ModelRole

DTypeName = Literal["auto", "fast", "bf16", "bfloat16", "fp16", "float16", "fp32", "float32", "int8", "gguf"]

_DTYPES: dict[str, torch.dtype] = {
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
    "fp32": torch.float32,
    "float32": torch.float32,
}

# One name per dtype, so "bfloat16", "bf16" and torch.bfloat16 share one loaded copy of the weights.
_CANONICAL = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def pick_dtype(dtype: str | torch.dtype = "auto", device: torch.device | None = None) -> torch.dtype:
    """The activations' dtype for ``dtype`` (see :func:`pick_weights`; ``int8`` computes in fp32)."""
    return pick_weights(dtype, device).dtype


@dataclass(frozen=True)
class WeightFormat:
    """How a model's weights are held: a torch dtype, int8-quantized linear layers over fp32 activations, or the
    GGUF's own 4-bit tensors as int4 layers over bf16 activations (``gguf_int4.py``)."""

    name: str
    dtype: torch.dtype  # the activations' dtype, and the weights' unless ``quantized`` or ``gguf_int4``
    quantized: bool = False
    gguf_int4: bool = False

    @property
    def source_dtype(self) -> torch.dtype:
        """Which converted copy to read and load: an int8 model is quantized from the bf16 copy, loaded in bf16
        (``quantize_linear_int8`` upcasts it, exactly, one layer at a time)."""
        return torch.bfloat16 if self.quantized else self.dtype


def pick_weights(dtype: str | torch.dtype = "auto", device: torch.device | None = None) -> WeightFormat:
    """``auto`` is bf16 everywhere: on CUDA it is the native fast type, and on CPUs it halves the bytes a decode step
    reads (not bit-identical to fp32; ask for fp32 when exactness against an fp32 reference matters).

    ``int8`` (CPU only) quantizes every linear layer to int8 with per-token dynamic activation scales (fbgemm). On
    CPUs without native bf16 instructions (AVX2 only: see ``cpu.py``) bf16 matrix products with more than one
    row are slow, so catch-up, verification and speculation passes cost many decode steps; int8 makes a decode step
    ~2x and an 8-position pass ~6x cheaper there (docs/benchmarks.md). It changes the numbers the model computes,
    so its answers differ from bf16's: measure accuracy before relying on it.

    ``gguf`` (CPU only) computes each 4-bit tensor of the model's GGUF file (Q4_K, Q4_1, Q4_0) with its own codes
    through torch's int4 kernel, bf16 activations, and keeps the other tensors in bf16 (``gguf_int4.py``): the
    distributed model's values up to the rounding of each group's scale, half a byte a 4-bit weight.

    ``fast`` picks by the hardware: int8 on a CPU, bf16 on CUDA. On CPUs int8 was measured ~2x cheaper per decode
    step than bf16 both without native bf16 instructions (AVX2 EPYC: 176 vs 372 ms for the 1.5B model) and with them
    (AMX Xeon: 83 vs 180 ms), and cheaper for every pass up to 32 positions (docs/benchmarks.md). It is opt-in rather
    than ``auto`` because it changes the answers."""
    if isinstance(dtype, torch.dtype):
        return WeightFormat(_CANONICAL.get(dtype, str(dtype).removeprefix("torch.")), dtype)
    if dtype == "auto":
        return WeightFormat("bf16", torch.bfloat16)
    if dtype == "fast":
        on_cpu = device is None or device.type == "cpu"
        return pick_weights("int8" if on_cpu else "bf16", device)
    if dtype in ("int8", "gguf") and device is not None and device.type != "cpu":
        raise ValueError(f"dtype {dtype!r} runs on the CPU only (torch's int8 / int4 CPU matmuls), not on {device}")
    if dtype == "int8":
        return WeightFormat("int8", torch.float32, quantized=True)
    if dtype == "gguf":
        return WeightFormat("gguf", torch.bfloat16, gguf_int4=True)
    if dtype not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}: use one of {['auto', 'fast', *_DTYPES, 'int8', 'gguf']}")
    return WeightFormat(_CANONICAL[_DTYPES[dtype]], _DTYPES[dtype])


@dataclass(frozen=True)
class PairWeights:
    """Each model's own weight format: e.g. the large model in bf16 and the small one in int8, where the small model
    mostly drafts (a drafter's format cannot change a greedy speculative answer: the large model decides every token).

    ``name`` is the one canonical spelling of the combination (``"bf16"`` when both agree, else ``"bf16/int8"``,
    large first): the shared-engine key and the benchmark's machine line use it, so ``"bfloat16/int8"`` and
    ``{"large": "bf16", "small": "int8"}`` share one loaded copy."""

    large: WeightFormat
    small: WeightFormat

    @property
    def name(self) -> str:
        return self.large.name if self.large == self.small else f"{self.large.name}/{self.small.name}"

    def __getitem__(self, role: ModelRole) -> WeightFormat:
        return self.large if role == "large" else self.small


PairDTypeSpec = str | torch.dtype | Mapping[str, str | torch.dtype]


def pick_pair_weights(dtype: PairDTypeSpec = "auto", device: torch.device | None = None) -> PairWeights:
    """Each model's :class:`WeightFormat` from one spec: a format for both (``"bf16"``, see :func:`pick_weights`),
    ``"LARGE/SMALL"`` (``"bf16/int8"``), or a mapping ``{"large": ..., "small": ...}`` (a missing role takes the
    other's). A bad part raises ``ValueError`` naming it, before any weights load."""
    if isinstance(dtype, Mapping):
        unknown = sorted(set(dtype) - {"large", "small"})
        if unknown or not dtype:
            raise ValueError(f"a per-model dtype maps 'large' and/or 'small' to a format, got keys {sorted(dtype)}")
        large_spec = dtype.get("large", dtype.get("small"))
        small_spec = dtype.get("small", large_spec)
    elif isinstance(dtype, str) and "/" in dtype:
        large_spec, _, small_spec = dtype.partition("/")
        if not large_spec or not small_spec or "/" in small_spec:
            raise ValueError(f"a per-model dtype is 'LARGE/SMALL' (e.g. 'bf16/int8'), got {dtype!r}")
    else:
        large_spec = small_spec = dtype
    formats = []
    for role, spec in (("large", large_spec), ("small", small_spec)):
        try:
            formats.append(pick_weights(spec, device))  # type: ignore[arg-type]
        except ValueError as exc:
            raise ValueError(f"the {role} model's dtype: {exc}") from exc
    return PairWeights(*formats)


class RowScaledInt8Linear(DynamicQuantizedLinear):
    """An int8 dynamically quantized linear layer that keeps what int8 can keep: each output channel's weights with
    their own scale, each token's activations with their own scale, and all 8 bits of the activations.

    torch's eager dynamic linear (fbgemm) loses accuracy three ways, each fixed here at no cost in speed:
    - One weight scale per tensor (``quantize_dynamic``'s default qconfig): a layer whose rows differ in size rounds
      its small rows to a few levels. Per output channel (``per_channel_dynamic_qconfig``) instead.
    - One activation scale per pass: in a pass over several positions (prefill, catch-up, a speculative or
      verified-relay check) one large activation - the first token's attention-sink rows reach ~50x the others -
      widens every other row's step, so a token's output depends on its neighbours in the pass (a random 256x256
      layer: an outlier row made the other row's error 44x larger, 1.29 vs 0.029). Each row is divided by its own
      absolute maximum first and the output rows multiplied back (the layer is linear; the bias is taken out and put
      back), and the scaled rows are quantized with one fixed step (1/127 of [-1, 1]) instead of a step from the
      pass's own min/max: a k-position pass computes exactly, bit for bit, what k one-token steps compute (with the
      per-pass step a warm request's one-token pass and a cold request's prompt pass gave different logits, and
      greedy decoding took another path: LangChain's json-mode test). It costs agreement with fp32 on rows mostly of
      one sign; mapping each row by its own centre and half-range recovers more than that, at more small operations
      per layer (``benchmarks/int8_row_mapping.py``): not adopted yet.
    - 7-bit activations (``reduce_range=True``, fbgemm's guard against int16 saturation in AVX2's u8 x s8 pair
      sums): full range here. The rows arrive scaled to [-1, 1], and the measured error is what 8 bits give, with
      the AVX2 kernels forced as well.
    Measured on the demo pair against fp32, teacher-forced GSM8K answers: the large model's top token agreed at 68 %
    of positions with the per-tensor, 7-bit layer (one answer, ``benchmarks/data/int8-kernels``; bf16: 98 %) and at
    91 % with this one (two answers, ``benchmarks/data/int8-row-mapping``; 92 % with the per-pass step)."""

    float_bias: torch.Tensor | None = None  # kept beside the packed copy: ``bias()`` unpacks the weight every call
    reduce_range = False  # all 8 bits of the scaled rows (fbgemm's default, True, keeps 7)

    def set_weight_bias(self, w: torch.Tensor, b: torch.Tensor | None) -> None:
        super().set_weight_bias(w, b)
        self.float_bias = None if b is None else b.detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = x.abs().amax(dim=-1, keepdim=True).clamp_min(1e-12)
        # The scaled rows lie in [-1, 1]: one fixed quantization step for every pass, not one from each pass's own
        # min/max, so a row's integers do not depend on the other rows in its pass.
        levels = 63 if self.reduce_range else 127
        y = torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32(
            x / scale, 1.0 / levels, levels + 1, self._packed_params._packed_params
        )
        bias = self.float_bias
        return y * scale if bias is None else (y - bias) * scale + bias


def quantize_linear_int8(model: PreTrainedModel) -> PreTrainedModel:
    """Replaces the model's ``nn.Linear`` layers (the output projection included) by int8 dynamically quantized ones
    with per-channel weight and per-token activation scales (``RowScaledInt8Linear``: a pass over several positions
    computes what one-token steps compute), in place, and makes the rest (embeddings, norms) fp32, the activations'
    dtype. A model loaded in bf16 is quantized layer by layer, each layer upcast (exactly) to fp32 just before, so the
    whole model never exists in fp32: the numbers are those of quantizing an fp32 load, at about half its peak
    memory. torch marks its eager quantization API as deprecated in favour of torchao; in the torch this package pins
    it is the one with fast CPU kernels (fbgemm): torchao 0.18's int8 dynamic-activation layer ran the demo pair's
    steps 7-17x slower, eager (``benchmarks/data/int8-kernels``). Its warning is silenced here."""
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    linear_layers = [name for name, module in model.named_modules() if type(module) is torch.nn.Linear]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for index, name in enumerate(linear_layers):
            layer = model.get_submodule(name).float()
            bias = None if layer.bias is None else layer.bias.detach().clone()
            holder = torch.nn.Sequential(layer)
            quantize_dynamic(holder, {torch.nn.Linear: per_channel_dynamic_qconfig}, inplace=True)
            quantized = holder[0]
            quantized.__class__ = RowScaledInt8Linear  # the same packed weights, per-token activation scales
            quantized.float_bias = bias
            model.set_submodule(name, quantized)
            if index % 16 == 15:
                # A replaced fp32 layer lives on in a reference cycle of the quantization API until the collector
                # runs: without this the fp32 copies pile up (13.2 GiB peak loading the demo pair, 7.8 with it).
                gc.collect()
    model = model.float()
    _release_freed_memory()
    return model


def _release_freed_memory() -> None:
    """Collects what quantization left in reference cycles and hands the freed heap back to the OS (glibc keeps
    freed blocks of this size for reuse: 11.6 GiB resident after loading the demo pair in int8, 4.0 GiB after)."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def dtype_tag(dtype: torch.dtype) -> str:
    """The registry's name for a dtype (its cache keeps a bf16 and an fp32 copy)."""
    return "fp32" if dtype == torch.float32 else "bf16"
