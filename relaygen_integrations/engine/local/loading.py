"""Loading a model pair into this process: device choice, safe weight loading, the pair's end-of-generation ids and
context window, and both models each in its weight format (``weights.py``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerBase

from ...registry import specs
from ...registry.resolve import pair_gguf_paths
from ..core.configuration import pair_formats
from ..core.pairs import (
    ModelLoadError,
    check_tokenizers_match,
    context_window_of,
    known_pair,
    load_tokenizer,
    resolve_reference,
)
from .weights import PairDTypeSpec, WeightFormat, dtype_tag, pick_pair_weights, pick_weights, quantize_linear_int8

Loaded = TypeVar("Loaded")


class DeviceError(ValueError):
    """A device that does not exist or that this torch cannot use (``cuda`` on a CPU-only build); ``field`` is
    ``"device"``."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.field = "device"


def pick_device(device: str | torch.device = "auto") -> torch.device:
    """``auto`` (CUDA when present, else the CPU) or a device this torch can use now, checked before any weights
    load: asking for ``cuda`` on a CPU-only torch is a :class:`DeviceError` naming it, not a failure mid-load."""
    if isinstance(device, str) and device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not isinstance(device, (str, torch.device)):
        raise DeviceError(f"device must be 'auto', 'cpu', 'cuda', 'cuda:N' or a torch.device, got {device!r}")
    try:
        chosen = torch.device(device)
    except RuntimeError as exc:
        raise DeviceError(f"unknown device {device!r}: use 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'") from exc
    if chosen.type == "cuda":
        if not torch.cuda.is_available():
            build = (
                "without CUDA"
                if torch.version.cuda is None
                else f"with CUDA {torch.version.cuda}, but no GPU is visible"
            )
            raise DeviceError(f"device {device!r} is not available: this torch ({torch.__version__}) was built {build}")
        count = torch.cuda.device_count()
        if chosen.index is not None and chosen.index >= count:
            raise DeviceError(f"device {device!r} does not exist: this machine has {count} CUDA device(s)")
    elif chosen.type == "mps" and not torch.backends.mps.is_available():
        raise DeviceError(f"device {device!r} is not available on this machine (no Apple MPS backend)")
    return chosen


def load_causal_lm(
    ref: str,
    dtype: torch.dtype,
    device: torch.device,
    trust_remote_code: bool = False,
    allow_pickle: bool = False,
) -> PreTrainedModel:
    """Loads weights from safetensors only unless ``allow_pickle`` (pickle checkpoints can run code on load)."""
    try:
        model = AutoModelForCausalLM.from_pretrained(
            ref,
            dtype=dtype,
            trust_remote_code=trust_remote_code,
            use_safetensors=None if allow_pickle else True,
        )
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"could not load a causal LM from {ref!r}: {exc}") from exc
    return model.to(device).eval()


def eos_token_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    """The ids that end a generation: the generation config's (chat models list ``<|im_end|>`` there) + the
    tokenizer's own eos."""
    ids: set[int] = set()
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(configured, int):
        ids.add(configured)
    elif configured:
        ids.update(int(i) for i in configured)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return frozenset(ids)


def context_window(model: PreTrainedModel) -> int:
    return context_window_of(model.config.to_dict())


@dataclass
class LoadedPair:
    """Two models loaded for one engine, each in its own weight format, with the large model's tokenizer."""

    large: PreTrainedModel
    small: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    large_name: str
    small_name: str
    pair_name: str | None  # the known pair both name ("demo"), else None


def load_pair(
    large: str,
    small: str,
    device: torch.device,
    dtype: PairDTypeSpec = "auto",
    trust_remote_code: bool = False,
    allow_pickle: bool = False,
) -> LoadedPair:
    """Resolves both references (a known pair's roles, local directories, hub ids), checks that their tokenizers
    agree, and loads each model in its format (``dtype="auto"``: the known pair's shipped formats, else bf16)."""
    weights = pick_pair_weights(pair_formats(known_pair(large, small), device.type, dtype), device)
    large_ref, pair = resolve_reference(large, "large", dtype_tag(weights.large.source_dtype))
    small_ref, small_pair = resolve_reference(small, "small", dtype_tag(weights.small.source_dtype))
    tokenizer = load_tokenizer(large_ref, trust_remote_code)
    check_tokenizers_match(tokenizer, load_tokenizer(small_ref, trust_remote_code))
    models = []
    for role, ref, given in (("large", large_ref, large), ("small", small_ref, small)):
        fmt = weights[role]  # type: ignore[index]
        source = gguf_source(given, ref, role) if fmt.gguf_int4 else None  # missing: refused before loading
        model = load_causal_lm(ref, fmt.source_dtype, device, trust_remote_code, allow_pickle)
        models.append(in_format(model, fmt, source))
    return LoadedPair(
        models[0], models[1], tokenizer,
        large_name=large if pair is None else f"{pair}:large",
        small_name=small if small_pair is None else f"{small_pair}:small",
        pair_name=pair if pair == small_pair else None,
    )  # fmt: skip


def load_model(
    ref: str, device: str | torch.device = "auto", dtype: str | torch.dtype = "auto"
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """One model and its tokenizer (``relaygen serve --single``): a known pair's role (``demo:small``), a local
    directory or a hub id, in one weight format (see ``weights.pick_weights``)."""
    torch_device = pick_device(device)
    weights = pick_weights(dtype, torch_device)
    reference, _pair = resolve_reference(ref, "large", dtype_tag(weights.source_dtype))
    source = gguf_source(ref, reference, "large") if weights.gguf_int4 else None
    model = load_causal_lm(reference, weights.source_dtype, torch_device)
    return in_format(model, weights, source), load_tokenizer(reference)


def gguf_source(given: str, resolved: str, role: str) -> Path:
    """The GGUF file whose 4-bit tensors ``dtype='gguf'`` computes with: a known pair's downloaded file for the role
    (``demo``, ``demo:small``), else the one ``*.gguf`` file in the model's directory."""
    pair, _, named_role = given.partition(":")
    if pair in specs.KNOWN_PAIRS:
        paths = pair_gguf_paths(pair)
        if paths is None:
            raise ModelLoadError(
                f"dtype 'gguf' reads the {pair!r} pair's GGUF files, which are not kept here: run "
                f"`relaygen models fetch {pair}` (it keeps them unless told not to)"
            )
        return Path(paths.for_role(named_role or role))  # type: ignore[arg-type]
    files = sorted(Path(resolved).glob("*.gguf")) if Path(resolved).is_dir() else []
    if len(files) != 1:
        found = ", ".join(f.name for f in files) or "none"
        raise ModelLoadError(
            f"dtype 'gguf' needs exactly one .gguf file beside the model in {resolved!r} (found: {found}); use "
            "dtype='bf16' or 'int8' for a model without one"
        )
    return files[0]


def in_format(model: PreTrainedModel, fmt: WeightFormat, gguf_file: Path | None = None) -> PreTrainedModel:
    """A model loaded in ``fmt.source_dtype`` turned into ``fmt``: int8 layers, or the GGUF's int4 layers."""
    if fmt.quantized:
        return quantize_linear_int8(model)
    if fmt.gguf_int4:
        from .gguf_int4 import use_gguf_int4

        assert gguf_file is not None, "gguf_source() names the file before the model loads"
        use_gguf_int4(model, gguf_file)
    return model


def pair_key(
    large: str, small: str, device: str | torch.device, dtype: PairDTypeSpec, options: Mapping[str, Any]
) -> tuple[Any, ...]:
    """What one loaded copy of a pair is: both references, the device ``auto`` resolves to, the canonical per-model
    formats (``"bfloat16"``, ``"bf16"`` and, for a pair that is not a known one, ``auto`` share one copy), and the
    loading options given other than at their defaults."""
    torch_device = pick_device(device)
    pair = known_pair(large, small)
    if pair is not None and isinstance(dtype, str) and dtype == "auto":
        # A known pair's "auto" is the configuration tuned for this machine (``tune/``), which may differ from the
        # profile's formats: it is a copy of its own, so an explicit format never gets a tuned engine by mistake.
        return (large, small, str(torch_device), "auto", *sorted(options.items()))
    weights = pick_pair_weights(pair_formats(pair, torch_device.type, dtype), torch_device)
    return (large, small, str(torch_device), weights.name, *sorted(options.items()))


_SHARED_PAIRS: dict[tuple[Any, ...], Any] = {}
_SHARED_LOCK = threading.Lock()


def shared_pair(key: tuple[Any, ...], load: Callable[[], Loaded]) -> Loaded:
    """One loaded copy per :func:`pair_key` in this process (``RelayEngine.shared``), loaded on first use; the lock
    makes two threads asking at once load it once."""
    with _SHARED_LOCK:
        if key not in _SHARED_PAIRS:
            _SHARED_PAIRS[key] = load()
        return _SHARED_PAIRS[key]
