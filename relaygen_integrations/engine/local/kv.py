"""KV-cache layouts for a :class:`~.runner.ModelRunner`, and the compiled one-token decode step.

``dynamic`` (the default) is transformers' ``DynamicCache``: it grows by concatenation at every step and is cropped
on rollback. ``static`` preallocates a ``StaticCache`` of fixed shape and writes each forward at explicit positions;
rollback only moves the write position back (``StaticCache.crop``), and the stale slots after it are masked as future
positions by transformers' causal mask (a static layer reports its full length to the mask, which then masks every
key after the query's position), so they are overwritten before anything reads them. Fixed shapes are what let
``torch.compile`` capture the one-token decode step once (on CUDA as a CUDA graph, ``mode="reduce-overhead"``):
an eager batch-1 step of a 1-2B model on a GPU is bound by kernel launches, so both models cost about the same per
token and neither relay nor speculation gains anything until the step is captured.

Multi-position passes (prefill, catch-up, speculative verification, verified relay's scoring) run eagerly over the
same static cache: their lengths vary, and compiling each length would cost more than it saves.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError, model_validator
from transformers import DynamicCache, PreTrainedModel, StaticCache
from transformers.cache_utils import Cache

from ..core.settings import GenerationError

KVCacheKind = Literal["auto", "dynamic", "static"]
DEFAULT_BLOCK = 256


class CacheOptions(BaseModel):
    """How a runner keeps its model's KV cache. ``kv_cache="auto"`` is ``static`` when ``compile`` is on (a
    compiled step needs fixed shapes) and ``dynamic`` otherwise."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kv_cache: KVCacheKind = "auto"
    compile: StrictBool = False  # strict: "yes" is a mistake, not True
    # A static cache is sized in whole blocks, so requests of similar length reuse one allocation (and a compiled
    # step its graph); it grows - copying what it holds - only when a request outruns it.
    block: int = Field(DEFAULT_BLOCK, ge=1)

    @model_validator(mode="after")
    def _compile_needs_static(self) -> CacheOptions:
        if self.compile and self.kv_cache == "dynamic":
            raise ValueError("compile=True needs kv_cache='static' (or 'auto'): a compiled step needs fixed shapes")
        return self

    @property
    def static(self) -> bool:
        return self.kv_cache == "static" or (self.kv_cache == "auto" and self.compile)

    @property
    def label(self) -> str:
        """``dynamic`` / ``static`` / ``static+compiled``: what a benchmark's machine line reports."""
        return ("static" if self.static else "dynamic") + ("+compiled" if self.compile else "")


def cache_options(kv_cache: KVCacheKind | str = "auto", compile: bool = False) -> CacheOptions:
    """Validated options; a bad value is a :class:`GenerationError` naming the setting."""
    try:
        return CacheOptions(kv_cache=kv_cache, compile=compile)  # type: ignore[arg-type]
    except ValidationError as exc:
        error = exc.errors()[0]
        field = str(error["loc"][0]) if error["loc"] else "compile"  # the model check is compile's
        message = str(error["msg"]).removeprefix("Value error, ")
        raise GenerationError(f"invalid setting {field}: {message}", field=field) from None


def check_static_support(model: PreTrainedModel) -> None:
    """A static cache here assumes full-attention layers: a sliding-window static layer rolls its buffer, so moving
    its write position back does not restore what it held."""
    config = model.config.get_text_config(decoder=True)
    layer_types = getattr(config, "layer_types", None) or []
    if any(kind != "full_attention" for kind in layer_types):
        raise GenerationError(
            f"kv_cache='static' supports full-attention models only; {type(model).__name__} has layers of kind "
            f"{sorted(set(layer_types) - {'full_attention'})}",
            field="kv_cache",
        )


def capacity(needed: int, block: int) -> int:
    return max(block, math.ceil(needed / block) * block)


def static_capacity(cache: Cache) -> int:
    return int(cache.layers[0].max_cache_len)  # type: ignore[attr-defined]


def ensure_cache(cache: Cache | None, model: PreTrainedModel, options: CacheOptions, needed: int, cached: int) -> Cache:
    """A cache that can hold ``needed`` positions, of which the first ``cached`` are already written. A static
    cache that is too small is replaced by a larger one holding a copy of those positions (exact, no recompute)."""
    if not options.static:
        return cache if cache is not None else DynamicCache(config=model.config)
    if cache is not None and static_capacity(cache) >= needed:
        return cache
    grown = StaticCache(config=model.config, max_cache_len=capacity(needed, options.block))
    if cache is not None and cached:
        for old, new in zip(cache.layers, grown.layers, strict=True):
            new.update(old.keys[:, :, :cached], old.values[:, :, :cached])  # type: ignore[attr-defined]
    return grown


@torch.inference_mode()  # a cache built inside a forward pass holds inference tensors: edit them in that mode too
def rewind(cache: Cache, keep: int) -> None:
    """Moves every layer back to ``keep`` positions - also layers a failed forward pass left at different
    lengths - without freeing a static cache's buffers (a compiled step keeps their addresses)."""
    for layer in cache.layers:
        held = int(layer.get_seq_length())
        if held > keep and hasattr(layer, "crop"):
            layer.crop(keep - held)  # a negative count means "remove this many": what every 5.x release accepts
        elif held > keep:
            # Static layers before transformers 5.2x have no crop (5.17 on the GPU image; benchmarks/data/gpu-h200):
            # move the write position back in place, as their crop does where it exists (a compiled step holds the
            # tensor's address).
            layer.cumulative_length.sub_(held - keep)  # type: ignore[attr-defined]


def compile_decode_step(model: PreTrainedModel) -> Callable[..., Any]:
    """The model's forward compiled for one-token steps over a static cache. On CUDA ``reduce-overhead`` captures
    it as a CUDA graph (replayed each step, one launch); on a CPU inductor fuses the step into generated C++."""
    mode = "reduce-overhead" if model.device.type == "cuda" else None
    return torch.compile(model, mode=mode, fullgraph=True, dynamic=False)
