"""One model and its KV cache.

A runner knows which token ids its cache holds (``cached_ids``). Asking it for the next-token logits of a sequence
forward-passes only the tokens it has not seen yet - the prompt once, a decode step's single token, or at a switch
the other model's whole segment in one catch-up pass. A new request that shares a prefix with what the cache holds
(a chat's system prompt, an agent's growing history) crops the cache back to that prefix instead of re-prefilling it.
The cache is transformers' ``DynamicCache`` or, with ``CacheOptions(kv_cache="static")``, a preallocated
``StaticCache`` whose one-token step can be compiled (``.kv``).
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel
from transformers.cache_utils import Cache

from .kv import CacheOptions, check_static_support, compile_decode_step, ensure_cache, rewind
from .spans import ModelRole

# Told of every forward pass over committed ids ``[start, end)`` (the transcript counts prefill / catch-up from it).
ForwardObserver = Callable[[int, int], None]


@dataclass
class ForwardStats:
    """Where a runner's forward work went during one request (whose tokens they were: ``Transcript``)."""

    reused_tokens: int = 0
    forward_passes: int = 0
    draft_tokens: int = 0  # speculation: tokens this (small) runner proposed for the large model
    verified_tokens: int = 0  # speculation: draft tokens this (large) runner checked in its verify passes
    forward_seconds: float = 0.0  # wall time inside this model's forward passes (where a request's time went)
    compiled_steps: int = 0  # one-token steps that ran the compiled forward (``compile=True``)


@dataclass
class ModelRunner:
    role: ModelRole
    model: PreTrainedModel
    options: CacheOptions = field(default_factory=CacheOptions)
    cache: Cache | None = None
    cached_ids: list[int] = field(default_factory=list)
    last_logits: torch.Tensor | None = None  # next-token logits after ``cached_ids``
    stats: ForwardStats = field(default_factory=ForwardStats)
    on_forward: ForwardObserver | None = None
    reserved: int = 0  # positions the current request expects to need (a static cache is sized for them up front)
    cache_kwarg: str = field(init=False)
    decode_step: Callable[..., object] | None = field(init=False, default=None)  # compiled one-token forward

    def __post_init__(self) -> None:
        # transformers 5.x renamed ``past_key_values`` to ``cache`` (the old name warns, then goes away in 5.40).
        params = inspect.signature(self.model.forward).parameters
        self.cache_kwarg = "cache" if "cache" in params else "past_key_values"
        if self.options.static:
            check_static_support(self.model)
        if self.options.compile:
            self.decode_step = compile_decode_step(self.model)  # compiles lazily, at the first one-token step

    @property
    def device(self) -> torch.device:
        return self.model.device

    def reset(self) -> None:
        """Forgets everything cached (used after an error, so no half-updated state survives). A static cache keeps
        its buffers (a compiled step is bound to them) and only moves every layer back to position 0."""
        if self.options.static and self.cache is not None:
            rewind(self.cache, 0)
        else:
            self.cache = None
        self.cached_ids = []
        self.last_logits = None

    def begin_request(
        self,
        prompt_ids: list[int],
        reuse_prefix: bool,
        on_forward: ForwardObserver | None = None,
        expected_len: int = 0,
    ) -> None:
        """Keeps the longest cached prefix shared with the new prompt (minus one token, so there is always at
        least one token to forward and fresh logits to sample from); drops the rest with ``Cache.crop``.
        ``on_forward`` is told of each forward pass over the request's committed ids; ``expected_len`` is how many
        positions the request may reach (prompt, budget, draft), so a static cache is sized once."""
        self.stats = ForwardStats()
        self.on_forward = on_forward
        self.reserved = expected_len
        keep = 0
        if reuse_prefix and self.cache is not None:
            limit = min(len(self.cached_ids), len(prompt_ids) - 1)
            while keep < limit and self.cached_ids[keep] == prompt_ids[keep]:
                keep += 1
        if keep == 0:
            self.reset()
            return
        if keep < len(self.cached_ids):
            rewind(self.cache, keep)  # type: ignore[arg-type]
            del self.cached_ids[keep:]
            self.last_logits = None
        self.stats.reused_tokens = keep

    def logits_for(self, ids: list[int]) -> torch.Tensor:
        """Next-token logits (1-D, float32) after ``ids``, forwarding only the tokens this runner has not seen."""
        seen = len(self.cached_ids)
        if seen == len(ids) and self.last_logits is not None:
            return self.last_logits
        if seen >= len(ids):
            raise RuntimeError(f"{self.role} runner holds {seen} tokens but the sequence has only {len(ids)}")
        self._account(seen, len(ids))
        self.last_logits = forward_tokens(self, ids[seen:])
        return self.last_logits

    def draft_step(self, token: int) -> torch.Tensor:
        """Appends one draft token (not yet accepted by anyone) and returns the logits after it."""
        self.stats.draft_tokens += 1
        self.stats.forward_passes += 1
        self.last_logits = forward_tokens(self, [token])
        return self.last_logits

    def verify(self, ids: list[int], draft: list[int]) -> torch.Tensor:
        """Logits after ``ids`` and after each draft prefix — ``len(draft) + 1`` rows — in ONE forward pass over the
        unseen part of ``ids`` followed by the draft (speculative verification)."""
        if len(self.cached_ids) >= len(ids):
            self.sync_to(ids)  # always leave one committed token to forward, so row 0 comes from this pass
        seen = len(self.cached_ids)
        self._account(seen, len(ids))
        self.stats.verified_tokens += len(draft)
        logits = forward_tokens(self, ids[seen:] + draft, keep=len(draft) + 1).reshape(len(draft) + 1, -1)
        self.last_logits = logits[-1]
        return logits

    def score(self, ids: list[int], start: int) -> torch.Tensor:
        """Verified relay: one forward pass that returns this model's logits at every position predicting
        ``ids[start:]`` plus the row after the whole sequence - ``len(ids) - start + 1`` rows (2-D). Forwards only
        what the cache lacks from position ``start - 1`` on; the extra rows cost only the output projection."""
        self.sync_to(ids[:start])  # the pass must include position start - 1, whose output predicts ids[start]
        seen = len(self.cached_ids)
        self._account(seen, len(ids))
        keep = len(ids) - start + 1
        rows = forward_tokens(self, ids[seen:], keep=keep).reshape(keep, -1)
        self.last_logits = rows[-1]
        return rows

    def sync_to(self, ids: list[int]) -> None:
        """Crops the cache to its longest prefix shared with ``ids`` — dropping rejected or discarded draft tokens —
        and at most ``len(ids) - 1`` tokens, so the next call has a token to forward and fresh logits."""
        keep = 0
        limit = min(len(self.cached_ids), len(ids) - 1)
        while keep < limit and self.cached_ids[keep] == ids[keep]:
            keep += 1
        if keep < len(self.cached_ids):
            if keep == 0:
                self.reset()
                return
            rewind(self.cache, keep)  # type: ignore[arg-type]
            del self.cached_ids[keep:]
            self.last_logits = None

    def _account(self, seen: int, total: int) -> None:
        self.stats.forward_passes += 1
        if self.on_forward is not None:
            self.on_forward(seen, total)


@torch.inference_mode()
def forward_tokens(runner: ModelRunner, new_ids: list[int], keep: int = 1) -> torch.Tensor:
    """One forward pass over ``new_ids`` appended to the runner's cache; returns the last position's logits (1-D),
    or with ``keep > 1`` the last ``keep`` positions' logits (2-D, one row per position).

    ``logits_to_keep`` matters: a 32-token catch-up would otherwise project all 32 positions onto a 152k vocab.
    """
    seen = len(runner.cached_ids)
    needed = max(seen + len(new_ids), runner.reserved)
    runner.cache = ensure_cache(runner.cache, runner.model, runner.options, needed, seen)
    input_ids = torch.tensor([new_ids], dtype=torch.long, device=runner.device)
    kwargs: dict[str, object] = {runner.cache_kwarg: runner.cache}
    forward: Callable[..., object] = runner.model
    compiled = runner.decode_step is not None and len(new_ids) == 1 and keep == 1
    if runner.options.static:
        # Positions are explicit: a rewound static cache still holds stale slots, which only positions can mask.
        kwargs["position_ids"] = torch.arange(seen, seen + len(new_ids), device=runner.device)[None]
        if compiled:
            forward = runner.decode_step  # type: ignore[assignment]
            runner.stats.compiled_steps += 1
    started = time.perf_counter()
    output = forward(input_ids=input_ids, use_cache=True, logits_to_keep=keep, **kwargs)
    logits = output.logits[0, -1].float() if keep == 1 else output.logits[0, -keep:].float()  # type: ignore[attr-defined]
    if compiled:
        logits = logits.clone()  # a CUDA graph's outputs are overwritten by its next replay
    if logits.device.type == "cuda":
        # Kernels run asynchronously; the sampler would wait for them right after anyway, so timing here costs nothing.
        torch.cuda.synchronize(logits.device)
    runner.stats.forward_seconds += time.perf_counter() - started
    runner.cached_ids.extend(new_ids)
    return logits
