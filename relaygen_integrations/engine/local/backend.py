"""The local backend: two in-process transformers models, one KV cache each (``ModelRunner``)."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..constraints.grammar import GrammarTokenizer
from ..core.backend import BackendCapabilityError
from ..core.settings import DEFAULT_MAX_DRAFT, GenerationError, GenerationPlan
from ..core.spans import ModelRole
from ..core.transcript import Transcript
from .draft_head import DraftHead, DraftVocab, build_draft_head
from .kv import CacheOptions
from .loading import context_window, eos_token_ids
from .prompt_lookup import PromptLookupDrafter
from .runner import ModelRunner
from .sampling import Sampler
from .session import LocalSession, Speculation
from .speculative import DEFAULT_DRAFT_CONFIDENCE, Drafter, DraftLength, SmallModelDrafter


class LocalBackend:
    """A large and (optionally) a small model in this process. Requests run one at a time: each cache holds one
    sequence, and on a CPU a second concurrent generation would only split the same cores."""

    kind = "local"
    serialized = True
    grammars = True  # masks tokens by a grammar (``constraints/grammar.py``)

    def __init__(
        self,
        large: PreTrainedModel,
        small: PreTrainedModel | None,
        tokenizer: PreTrainedTokenizerBase,
        *,
        large_name: str = "large",
        small_name: str = "small",
        reuse_prefix: bool = True,
        draft_confidence: float = DEFAULT_DRAFT_CONFIDENCE,
        draft_vocab: DraftVocab = None,
        cache: CacheOptions | None = None,
    ) -> None:
        number = isinstance(draft_confidence, (int, float)) and not isinstance(draft_confidence, bool)
        if not number or not 0.0 <= draft_confidence <= 1.0:
            raise GenerationError(f"draft_confidence must be a probability in [0, 1], got {draft_confidence!r}")
        self.large_name, self.small_name = large_name, small_name
        self.cache_options = cache or CacheOptions()
        self.runners: dict[ModelRole, ModelRunner] = {"large": ModelRunner("large", large, self.cache_options)}
        if small is not None:
            self.runners["small"] = ModelRunner("small", small, self.cache_options)
        self.tokenizer = tokenizer
        # Reduced draft vocabularies, built once per size asked for; the engine's default one is built (and
        # checked) now, so a bad ``draft_vocab`` fails before any request.
        self.draft_heads: dict[object, DraftHead | None] = {}
        self.default_draft_vocab = draft_vocab
        self.draft_head(None)
        self.eos_ids = eos_token_ids(large, tokenizer)
        self.context_window = context_window(large)
        # Padding rows aside, an id past either model's embedding table would index out of range.
        self.vocab_size = min([len(tokenizer)] + [int(r.model.config.vocab_size) for r in self.runners.values()])
        self.reuse_prefix = reuse_prefix
        # llguidance's view of the tokenizer, built on the first constrained request (~1 s); masks as wide as the
        # large model's logits (its padding rows are never allowed).
        self.logits_width = int(large.config.get_text_config(decoder=True).vocab_size)
        self.grammar_tokenizer = GrammarTokenizer(tokenizer, self.logits_width, sorted(self.eos_ids))
        # Speculation: a draft stops after a token the small model gave less than this probability (0 = never).
        self.draft_confidence = float(draft_confidence)

    @property
    def roles(self) -> frozenset[ModelRole]:
        return frozenset(self.runners)

    def check(self, plan: GenerationPlan) -> None:
        """A grammar must compile (compiled once per grammar); the rest is checked by the engine front already."""
        if plan.settings.grammar is not None:
            self.grammar_tokenizer.check(plan.settings.grammar)

    def open(
        self, plan: GenerationPlan, transcript: Transcript, step_lock: threading.Lock | None = None
    ) -> LocalSession:
        """The request's session. ``step_lock``: the runners are shared with sessions that interleave per step
        (``serve/single.py``); the engine front serializes whole requests instead and passes none."""
        # Speculation in mode "large" needs the small model too (as the drafter); mode "small" has nothing to draft.
        both = plan.mode == "relay" or (plan.mode == "large" and plan.speculative > 0)
        runners = {role: self.runners[role] for role in (("large", "small") if both else (plan.mode,))}
        drafter: Drafter | None = None
        if plan.speculative and both:
            drafter = SmallModelDrafter(self.runners["small"], DraftLength(plan.speculative), self.draft_confidence)
        if plan.prompt_lookup and plan.mode != "small":  # copies first; the small model's drafts (if any) fill in
            length = DraftLength(plan.speculative or DEFAULT_MAX_DRAFT)
            drafter = PromptLookupDrafter(drafter, self.logits_width, length)
        speculation = Speculation(drafter) if drafter is not None else None
        if "small" in runners:  # only drafts read it: a request that drafts nothing prepares no subset
            self.runners["small"].draft_head = self.draft_head(plan.settings.draft_vocab) if speculation else None
        return LocalSession(
            runners,
            transcript,
            Sampler(plan.sampling),
            reuse_prefix=self.reuse_prefix and not plan.reprefill_segments,
            reprefill_segments=plan.reprefill_segments,
            speculation=speculation,
            step_lock=step_lock,
            grammar=(
                self.grammar_tokenizer.state(
                    plan.settings.grammar,
                    len(plan.prompt_ids),
                    self.grammar_tokenizer.call_opening(plan.call_tag) if plan.call_tag is not None else None,
                )
                if plan.settings.grammar is not None
                else None
            ),
        )

    def draft_head(self, request: int | None) -> DraftHead | None:
        """The drafting model's output layer for a request's ``draft_vocab`` (None: the engine's default; 0: the
        whole vocabulary), built on first use."""
        spec: DraftVocab = self.default_draft_vocab if request is None else (request or None)
        small = self.runners.get("small")
        if spec is None or small is None:
            return None
        key = tuple(spec) if isinstance(spec, Sequence) and not isinstance(spec, str) else spec
        if key not in self.draft_heads:
            self.draft_heads[key] = build_draft_head(small.model, self.tokenizer, spec)
        return self.draft_heads[key]

    def token_margins(self, role: ModelRole, prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> list[float]:
        return token_margins(self.local_model(role), prompt_ids, completion_ids)

    def local_model(self, role: ModelRole) -> PreTrainedModel:
        if role not in self.runners:
            raise BackendCapabilityError(self.kind, f"use a {role} model", "this engine was built without one")
        return self.runners[role].model

    def close(self) -> None:
        """Drops both caches (the weights stay loaded while the engine is referenced)."""
        for runner in self.runners.values():
            runner.reset()


@torch.inference_mode()
def token_margins(model: PreTrainedModel, prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> list[float]:
    """Top-1 − top-2 probability of ``model`` at each position that predicts a completion token (teacher forcing:
    one forward pass over prompt + completion)."""
    if not completion_ids:
        return []
    ids = torch.tensor([list(prompt_ids) + list(completion_ids)], device=model.device)
    logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].float()
    top2 = torch.softmax(logits, dim=-1).topk(2, dim=-1).values
    return (top2[:, 0] - top2[:, 1]).tolist()
