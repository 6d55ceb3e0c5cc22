"""One model and its KV cache.

A runner knows which token ids its cache holds (``cached_ids``). Asking it for the next-token logits of a sequence
forward-passes only the tokens it has not seen yet - the prompt once, a decode step's single token, or at a switch
the other model's whole segment in one catch-up pass. A new request that shares a prefix with what the cache holds
(a chat's system prompt, an agent's growing history) crops the cache back to that prefix instead of re-prefilling it.
The cache is transformers' ``DynamicCache`` or, with ``CacheOptions(kv_cache="static")``, a preallocated
``StaticCache`` whose one-token step can be compiled (``.kv``). A drafting small model may score its drafts over a
reduced vocabulary (``.draft_head``): those passes keep the last hidden state, and the full logits are projected from
it only if the model is then asked to write a token of its own.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel
from transformers.cache_utils import Cache

from ..core.spans import ModelRole
from .draft_head import DraftHead
from .kv import CacheOptions, check_static_support, compile_decode_step, ensure_cache, rewind
from .wide_passes import wide_pass, wide_pass_rows

# What a forward pass was for. A runner knows it from the call: ``decode`` forwards the one token its model wrote
# last (for the small model: its sentences and answers), ``catchup`` the other model's tokens it missed (several at
# once), ``prefill`` prompt tokens, ``draft`` a speculative draft step, ``verify_drafts`` the large model's check of a
# draft, ``verify_lookup`` its check of a draft copied from the context (``prompt_lookup.py``), ``verify_sentences``
# verified relay's scoring of a small sentence.
PASS_KINDS = ("prefill", "decode", "catchup", "draft", "verify_drafts", "verify_lookup", "verify_sentences")

# Told of every forward pass over committed ids ``[start, end)`` (the transcript counts prefill / catch-up from it).
ForwardObserver = Callable[[int, int], None]


def cache_keyword(model: PreTrainedModel) -> str:
    """The keyword ``model.forward`` takes its KV cache under: transformers 5.x renamed ``past_key_values`` to
    ``cache`` (the old name warns, then goes away in 5.40)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


@dataclass
class ForwardStats:
    """Where a runner's forward work went during one request (whose tokens they were: ``Transcript``)."""

    reused_tokens: int = 0
    forward_passes: int = 0
    draft_tokens: int = 0  # speculation: tokens this (small) runner proposed for the large model
    verified_tokens: int = 0  # speculation: draft tokens this (large) runner checked in its verify passes
    forward_seconds: float = 0.0  # wall time inside this model's forward passes (where a request's time went)
    # The same wall time by what each pass was for (PASS_KINDS): the per-answer time split of ``Usage.time_split``.
    seconds_by_kind: dict[str, float] = field(default_factory=dict)
    compiled_steps: int = 0  # one-token steps that ran the compiled forward (``compile=True``)
    # Passes by how many new positions each read ({1: decode and draft steps, 4: a 3-token draft's check, ...}): with
    # a machine's cost per pass (``tune/costs.py``) this predicts the request's forward seconds on any machine.
    passes: dict[int, int] = field(default_factory=dict)
    # Their wall time by the same sizes: what this machine really charged for each (``tune/observed.py``).
    pass_seconds: dict[int, float] = field(default_factory=dict)

    def add_seconds(self, kind: str, seconds: float, positions: int) -> None:
        self.forward_seconds += seconds
        self.seconds_by_kind[kind] = self.seconds_by_kind.get(kind, 0.0) + seconds
        self.pass_seconds[positions] = self.pass_seconds.get(positions, 0.0) + seconds


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
    prompt_len: int = 0  # the current request's prompt length (a pass below it is prefill)
    reserved: int = 0  # positions the current request expects to need (a static cache is sized for them up front)
    draft_head: DraftHead | None = None  # drafts score a reduced vocabulary (``draft_head.py``)
    last_hidden: torch.Tensor | None = None  # after a draft-head pass: the hidden state whose full logits are unmade
    cache_kwarg: str = field(init=False)
    decode_step: Callable[..., object] | None = field(init=False, default=None)  # compiled one-token forward
    wide_rows: int | None = field(init=False, default=None)  # passes this wide run their linears in fp32 (wide_passes)

    def __post_init__(self) -> None:
        self.cache_kwarg = cache_keyword(self.model)
        if self.options.static:
            check_static_support(self.model)
        if self.options.compile:
            self.decode_step = compile_decode_step(self.model)  # compiles lazily, at the first one-token step
        self.wide_rows = wide_pass_rows(self.model)

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
        self.last_logits = self.last_hidden = None

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
        self.prompt_len = len(prompt_ids)
        if self.draft_head is not None:
            self.draft_head.begin_request(prompt_ids)
        keep = self._shared_prefix(prompt_ids) if reuse_prefix and self.cache is not None else 0
        self._keep(keep)
        self.stats.reused_tokens = keep

    def logits_for(self, ids: list[int], kind: str = "decode") -> torch.Tensor:
        """Next-token logits (1-D, float32) after ``ids``, forwarding only the tokens this runner has not seen.
        ``kind``: what a one-token pass is for (``decode``: this model writes; ``draft``: it drafts)."""
        seen = len(self.cached_ids)
        if seen == len(ids) and self.last_logits is None and self.last_hidden is not None:
            # The last pass scored a draft over a reduced vocabulary: project its hidden state onto the whole one.
            self.last_logits = self.project(self.last_hidden)
        if seen == len(ids) and self.last_logits is not None:
            return self.last_logits
        self._check_unseen(ids)
        self._account(seen, len(ids))
        self.last_logits, self.last_hidden = (
            self.forward_tokens(ids[seen:], kind=self._kind(seen, len(ids), kind)),
            None,
        )
        return self.last_logits

    def _kind(self, seen: int, end: int, one_token_kind: str) -> str:
        """What a pass over committed ids ``[seen, end)`` is: prefill while it reads the prompt, catch-up when it
        reads several (the other model's tokens), else what the caller does with the one token."""
        if seen < self.prompt_len:
            return "prefill"
        return "catchup" if end - seen > 1 else one_token_kind

    def draft_logits(self, ids: list[int]) -> torch.Tensor:
        """:meth:`logits_for` for a draft's first token: over the draft head's subset when there is one."""
        seen = len(self.cached_ids)
        if self.draft_head is None or (seen == len(ids) and self.last_logits is not None):
            return self.logits_for(ids, kind="draft")
        if seen == len(ids) and self.last_hidden is not None:
            return self.draft_head.logits(self.last_hidden)[0]
        self._check_unseen(ids)
        self._account(seen, len(ids))
        return self._draft_pass(ids[seen:], self._kind(seen, len(ids), "draft"))

    def draft_step(self, token: int) -> torch.Tensor:
        """Appends one draft token (not yet accepted by anyone) and returns the logits after it."""
        self.stats.draft_tokens += 1
        self.stats.forward_passes += 1
        if self.draft_head is not None:
            return self._draft_pass([token], "draft")
        self.last_logits, self.last_hidden = self.forward_tokens([token], kind="draft"), None
        return self.last_logits

    def _draft_pass(self, new_ids: list[int], kind: str) -> torch.Tensor:
        assert self.draft_head is not None
        self.last_hidden, self.last_logits = self.forward_hidden(new_ids, kind), None
        started = time.perf_counter()
        logits = self.draft_head.logits(self.last_hidden)[0]
        self.stats.add_seconds(kind, time.perf_counter() - started, len(new_ids))  # the output layer is in the pass
        return logits

    def check_draft(self, ids: list[int], draft: list[int], kind: str = "verify_drafts") -> torch.Tensor:
        """Speculation: logits after ``ids`` and after each draft prefix — ``len(draft) + 1`` rows — in ONE forward
        pass over the unseen part of ``ids`` followed by the draft (``kind``: whose draft, for ``time_split``).
        (Verified relay's pass is :meth:`score`.)"""
        if len(self.cached_ids) >= len(ids):
            self.sync_to(ids)  # always leave one committed token to forward, so row 0 comes from this pass
        seen = len(self.cached_ids)
        self._account(seen, len(ids))
        self.stats.verified_tokens += len(draft)
        kind = "prefill" if seen < self.prompt_len else kind  # a first round also reads the prompt
        logits = self.forward_tokens(ids[seen:] + draft, keep=len(draft) + 1, kind=kind)
        logits = logits.reshape(len(draft) + 1, -1)
        self.last_logits, self.last_hidden = logits[-1], None
        return logits

    def score(self, ids: list[int], start: int) -> torch.Tensor:
        """Verified relay: one forward pass that returns this model's logits at every position predicting
        ``ids[start:]`` plus the row after the whole sequence - ``len(ids) - start + 1`` rows (2-D). Forwards only
        what the cache lacks from position ``start - 1`` on; the extra rows cost only the output projection."""
        self.sync_to(ids[:start])  # the pass must include position start - 1, whose output predicts ids[start]
        seen = len(self.cached_ids)
        self._account(seen, len(ids))
        keep = len(ids) - start + 1
        rows = self.forward_tokens(ids[seen:], keep=keep, kind="verify_sentences").reshape(keep, -1)
        self.last_logits, self.last_hidden = rows[-1], None
        return rows

    def sync_to(self, ids: list[int]) -> None:
        """Crops the cache to its longest prefix shared with ``ids`` — dropping rejected or discarded draft tokens —
        and at most ``len(ids) - 1`` tokens, so the next call has a token to forward and fresh logits."""
        keep = self._shared_prefix(ids)
        if keep < len(self.cached_ids):
            self._keep(keep)

    def _shared_prefix(self, ids: list[int]) -> int:
        """How many leading cached ids ``ids`` shares, at most ``len(ids) - 1``: one token is always left to
        forward, so the next pass has fresh logits to sample from."""
        keep = 0
        limit = min(len(self.cached_ids), len(ids) - 1)
        while keep < limit and self.cached_ids[keep] == ids[keep]:
            keep += 1
        return keep

    def _keep(self, keep: int) -> None:
        """Crops the cache to its first ``keep`` ids (all of it gone: a reset)."""
        if keep == 0:
            self.reset()
        elif keep < len(self.cached_ids):
            rewind(self.cache, keep)  # type: ignore[arg-type]
            del self.cached_ids[keep:]
            self.last_logits = self.last_hidden = None

    def _check_unseen(self, ids: list[int]) -> None:
        """A pass needs a token of ``ids`` this runner has not seen (what it holds answered the rest already): a
        sequence no longer than its cache is another request's, or a caller's mistake."""
        if len(self.cached_ids) >= len(ids):
            raise RuntimeError(f"{self.role} runner holds {len(self.cached_ids)} tokens but the sequence has only "
                               f"{len(ids)}")  # fmt: skip

    def _account(self, seen: int, total: int) -> None:
        self.stats.forward_passes += 1
        if self.on_forward is not None:
            self.on_forward(seen, total)

    @torch.inference_mode()
    def forward_tokens(self, new_ids: list[int], keep: int = 1, kind: str = "decode") -> torch.Tensor:
        """One forward pass over ``new_ids`` appended to the runner's cache; returns the last position's logits (1-D),
        or with ``keep > 1`` the last ``keep`` positions' logits (2-D, one row per position).

        ``logits_to_keep`` matters: a 32-token catch-up would otherwise project all 32 positions onto a 152k vocab.
        """
        new_ids = self._prefill_up_to_the_last_prompt_token(new_ids, keep)
        input_ids, kwargs = self._pass_inputs(new_ids)
        forward: Callable[..., object] = self.model
        compiled = self.decode_step is not None and len(new_ids) == 1 and keep == 1
        if compiled:
            forward = self.decode_step  # type: ignore[assignment]
            self.stats.compiled_steps += 1
        started = time.perf_counter()
        with wide_pass(self.wide_rows, len(new_ids)):
            output = forward(input_ids=input_ids, use_cache=True, logits_to_keep=keep, **kwargs)
        rows = output.logits[0]  # type: ignore[attr-defined]
        logits = rows[-1].float() if keep == 1 else rows[-keep:].float()
        if compiled:
            logits = logits.clone()  # a CUDA graph's outputs are overwritten by its next replay
        self._finish_pass(new_ids, started, logits, kind)
        return logits

    @torch.inference_mode()
    def forward_hidden(self, new_ids: list[int], kind: str = "draft") -> torch.Tensor:
        """:meth:`forward_tokens` without the output layer: the last position's final hidden state, ``(1, hidden)``,
        for a draft head to score (the model's body runs eagerly: a compiled step includes the full projection)."""
        new_ids = self._prefill_up_to_the_last_prompt_token(new_ids, 1)
        input_ids, kwargs = self._pass_inputs(new_ids)
        started = time.perf_counter()
        with wide_pass(self.wide_rows, len(new_ids)):
            output = self.model.base_model(input_ids=input_ids, use_cache=True, **kwargs)
        hidden = output.last_hidden_state[0, -1:]  # type: ignore[attr-defined]
        self._finish_pass(new_ids, started, hidden, kind)
        return hidden

    def _prefill_up_to_the_last_prompt_token(self, new_ids: list[int], keep: int) -> list[int]:
        """Runs the part of a pass that reads the prompt before its last token as a pass of its own; returns the rest.

        A request whose prompt prefix is cached (``begin_request`` keeps all but the last prompt token) forwards
        that last token, with whatever follows it in the same pass (a draft, the other model's text). A cold request
        would read the whole prompt in that pass, and a pass's shape decides its arithmetic (a bf16 model's wide
        passes run in fp32 on CPUs without bf16 instructions; kernels block by rows): the logits after the prompt,
        and with them greedy decoding, would depend on what the cache held. With the prompt's head always in a pass
        of its own, everything from the last prompt token on runs the same passes cold and warm. It costs one pass
        per cold request (the positions are the same). A pass that must return rows from the head is not split.
        The head's pass is an ordinary one (its one row of logits unread: the model's body alone is not on every
        causal LM); it ends where the prompt's last token starts, so it is not split again."""
        head = self.prompt_len - 1 - len(self.cached_ids)
        if head <= 0 or len(new_ids) - head < max(keep, 1):
            return new_ids
        self.forward_tokens(new_ids[:head], kind="prefill")
        return new_ids[head:]

    @torch.inference_mode()
    def project(self, hidden: torch.Tensor) -> torch.Tensor:
        """The full next-token logits (1-D, float32) from a final hidden state, as the model's own forward computes."""
        return self.model.get_output_embeddings()(hidden[None])[0, -1].float()

    def _pass_inputs(self, new_ids: list[int]) -> tuple[torch.Tensor, dict[str, object]]:
        seen = len(self.cached_ids)
        needed = max(seen + len(new_ids), self.reserved)
        self.cache = ensure_cache(self.cache, self.model, self.options, needed, seen)
        input_ids = torch.tensor([new_ids], dtype=torch.long, device=self.device)
        kwargs: dict[str, object] = {self.cache_kwarg: self.cache}
        if self.options.static:
            # Positions are explicit: a rewound static cache still holds stale slots, which only positions can mask.
            kwargs["position_ids"] = torch.arange(seen, seen + len(new_ids), device=self.device)[None]
        return input_ids, kwargs

    def _finish_pass(self, new_ids: list[int], started: float, result: torch.Tensor, kind: str) -> None:
        if result.device.type == "cuda":
            # Kernels run asynchronously; the sampler would wait for them right after anyway: timing here costs nothing.
            torch.cuda.synchronize(result.device)
        self.stats.add_seconds(kind, time.perf_counter() - started, len(new_ids))
        self.stats.passes[len(new_ids)] = self.stats.passes.get(len(new_ids), 0) + 1
        self.cached_ids.extend(new_ids)
