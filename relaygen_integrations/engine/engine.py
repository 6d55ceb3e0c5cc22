"""RelayEngine: the public, framework-free entry point (load a pair once, generate / stream, sync or async)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from pydantic import ValidationError
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..chat.template import render_prompt_ids
from .cues import CueConfigError, CueSet, resolve_cues
from .generate import Speculation, relay_stream
from .models import (
    check_tokenizers_match,
    context_window,
    eos_token_ids,
    load_causal_lm,
    load_tokenizer,
    pick_device,
    pick_dtype,
    reasoning_end_marker,
    resolve_reference,
)
from .policy import Mode, PolicyConfig, RelayPolicy
from .runner import ModelRunner
from .sampling import Sampler, SamplingParams
from .spans import FinalEvent, ModelRole, RelayResult, StreamEvent
from .speculative import DEFAULT_DRAFT_CONFIDENCE, DEFAULT_MAX_DRAFT, DraftLength

MODES: tuple[Mode, ...] = ("relay", "large", "small")


class GenerationError(ValueError):
    """A generation request is invalid (bad settings, prompt too long for the context window, ...)."""


@dataclass(frozen=True)
class GenerationPlan:
    """A validated request, ready to run."""

    prompt_ids: list[int]
    max_new_tokens: int
    sampling: SamplingParams
    stop: tuple[str, ...]
    mode: Mode
    cues: CueSet  # the request's own, or the engine's when the request names none
    reprefill_segments: bool = False
    speculative: int = 0  # maximum draft length of self-speculative decoding; 0 = off


class _Failure:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


_DONE = object()
_SHARED_ENGINES: dict[tuple[Any, ...], RelayEngine] = {}
_SHARED_LOCK = threading.Lock()


class RelayEngine:
    """Two models that share a tokenizer, each with its own KV cache, writing one answer together.

    Requests are serialized (one lock): the caches hold one sequence at a time, and on a CPU a second concurrent
    generation would only split the same cores. Threads and asyncio tasks can share one engine safely.
    """

    def __init__(
        self,
        large: PreTrainedModel,
        small: PreTrainedModel | None,
        tokenizer: PreTrainedTokenizerBase,
        cues: CueSet | str | list[str] = "generic",
        policy: PolicyConfig | Mapping[str, Any] | None = None,
        *,
        large_name: str = "large",
        small_name: str = "small",
        pair_name: str | None = None,
        reuse_prefix: bool = True,
        speculative: bool | int = False,
        draft_confidence: float = DEFAULT_DRAFT_CONFIDENCE,
    ) -> None:
        self.tokenizer = tokenizer
        self.large_name, self.small_name, self.pair_name = large_name, small_name, pair_name
        self.cues = resolve_cues(cues, pair_name) if not isinstance(cues, CueSet) else cues
        config = policy if isinstance(policy, PolicyConfig) else PolicyConfig(**dict(policy or {}))
        if config.reasoning_end is None:
            config = config.model_copy(update={"reasoning_end": reasoning_end_marker(tokenizer)})
        self.policy_config = config
        self.reuse_prefix = reuse_prefix
        self.runners: dict[ModelRole, ModelRunner] = {"large": ModelRunner("large", large)}
        if small is not None:
            self.runners["small"] = ModelRunner("small", small)
        self.eos_ids = eos_token_ids(large, tokenizer)
        self.context_window = context_window(large)
        self._lock = threading.Lock()
        self.speculative = self._draft_limit(speculative)  # the default for requests that do not say
        if not 0.0 <= draft_confidence <= 1.0:
            raise GenerationError(f"draft_confidence must be a probability in [0, 1], got {draft_confidence!r}")
        # Speculation: a draft stops after a token the small model gave less than this probability (0 = never).
        self.draft_confidence = draft_confidence

    # -- construction ------------------------------------------------------------------------------------------
    @classmethod
    def from_pretrained(
        cls,
        large: str = "demo",
        small: str = "demo",
        cues: str | list[str] | CueSet = "auto",
        device: str | torch.device = "auto",
        dtype: str | torch.dtype = "auto",
        *,
        policy: PolicyConfig | Mapping[str, Any] | None = None,
        trust_remote_code: bool = False,
        allow_pickle: bool = False,
        reuse_prefix: bool = True,
        speculative: bool | int = False,
        draft_confidence: float = DEFAULT_DRAFT_CONFIDENCE,
    ) -> RelayEngine:
        """Loads both models (a known pair name such as ``"demo"``, a local directory, or a hub id).

        The tokenizer and chat template come from the large model; the small model's tokenizer must agree with it.
        """
        torch_device = pick_device(device)
        torch_dtype = pick_dtype(dtype, torch_device)
        large_ref, pair = resolve_reference(large, "large", torch_dtype)
        small_ref, small_pair = resolve_reference(small, "small", torch_dtype)
        tokenizer = load_tokenizer(large_ref, trust_remote_code)
        check_tokenizers_match(tokenizer, load_tokenizer(small_ref, trust_remote_code))
        large_model = load_causal_lm(large_ref, torch_dtype, torch_device, trust_remote_code, allow_pickle)
        small_model = load_causal_lm(small_ref, torch_dtype, torch_device, trust_remote_code, allow_pickle)
        return cls(
            large_model,
            small_model,
            tokenizer,
            cues=resolve_cues(cues, pair if pair == small_pair else None),
            policy=policy,
            large_name=large if pair is None else f"{pair}:large",
            small_name=small if small_pair is None else f"{small_pair}:small",
            pair_name=pair if pair == small_pair else None,
            reuse_prefix=reuse_prefix,
            speculative=speculative,
            draft_confidence=draft_confidence,
        )

    @classmethod
    def shared(cls, large: str = "demo", small: str = "demo", **kwargs: Any) -> RelayEngine:
        """One engine (one copy of the weights) per distinct configuration, loaded on first use; adapters use this
        so two chat models built with the same settings share everything."""
        # "auto" and what it resolves to must share one copy of the weights.
        resolved = dict(kwargs, device=pick_device(kwargs.get("device", "auto")))
        resolved["dtype"] = pick_dtype(kwargs.get("dtype", "auto"), resolved["device"])
        key = (large, small, *sorted((k, repr(v)) for k, v in resolved.items()))
        with _SHARED_LOCK:
            engine = _SHARED_ENGINES.get(key)
            if engine is None:
                engine = cls.from_pretrained(large=large, small=small, **kwargs)
                _SHARED_ENGINES[key] = engine
            return engine

    @classmethod
    def from_endpoints(
        cls,
        large: str,
        small: str | None,
        tokenizer: str | PreTrainedTokenizerBase,
        cues: CueSet | str | list[str] = "auto",
        policy: PolicyConfig | Mapping[str, Any] | None = None,
        *,
        api_key: str | None = None,
        timeout: float = 60.0,
        retries: int = 2,
        **options: Any,
    ) -> RelayEngine:
        """The same engine over two OpenAI-compatible completion servers (vLLM, SGLang, llama.cpp, ``relaygen serve
        --single``): ``large``/``small`` are base URLs such as ``http://host:8000/v1``; ``tokenizer`` (a hub id, a
        local directory or a tokenizer) renders the chat template here and must be the servers' tokenizer.

        ``options``: ``large_model``/``small_model`` (served model names; default: the first each server lists),
        ``context_window``, ``server_stops`` (default True), ``trust_remote_code``. Design: ``engine/remote.py``.
        """
        try:
            from .remote import RemoteRelayEngine
        except ModuleNotFoundError as exc:
            if exc.name != "httpx":
                raise
            raise ImportError("the remote backend needs httpx: pip install 'relaygen-integrations[serve]'") from exc
        return RemoteRelayEngine(
            large, small, tokenizer, cues, policy, api_key=api_key, timeout=timeout, retries=retries, **options
        )

    # -- request preparation ------------------------------------------------------------------------------------
    def encode_messages(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        assistant_prefix: str | None = None,
    ) -> list[int]:
        return render_prompt_ids(self.tokenizer, messages, tools, chat_template_kwargs, assistant_prefix)

    def plan(
        self,
        prompt_ids: Sequence[int],
        max_new_tokens: int = 256,
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int | None = None,
        seed: int | None = None,
        stop: str | Sequence[str] | None = None,
        mode: Mode = "relay",
        reprefill_segments: bool = False,
        cues: CueSet | str | list[str] | None = None,
        speculative: bool | int | None = None,
    ) -> GenerationPlan:
        """Validates every setting before any model work starts, so a bad request leaves nothing half-done."""
        if mode not in MODES:
            raise GenerationError(f"unknown mode {mode!r}: use one of {list(MODES)}")
        if mode != "large" and "small" not in self.runners:
            raise GenerationError(f"mode {mode!r} needs a small model, and this engine has none")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens <= 0:
            raise GenerationError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
        try:
            sampling = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, seed=seed)
        except ValidationError as exc:
            raise GenerationError(
                f"invalid sampling settings: {exc.errors()[0]['loc'][0]} {exc.errors()[0]['msg']}"
            ) from exc
        stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
        for s in stops:
            if not isinstance(s, str) or not s:
                raise GenerationError(f"stop sequences must be non-empty strings, got {s!r}")
            if "\ufffd" in s or any(0xD800 <= ord(ch) <= 0xDFFF for ch in s):
                raise GenerationError(f"stop sequence {s!r} is not valid UTF-8 text")
        ids = [int(i) for i in prompt_ids]
        if not ids:
            raise GenerationError("the prompt is empty")
        room = self.context_window - len(ids)
        if room <= 0:
            raise GenerationError(
                f"the prompt has {len(ids)} tokens but the context window is {self.context_window} tokens"
            )
        try:
            # Per-request cues (e.g. comparing cue sets on one loaded pair); None keeps the engine's own.
            request_cues = self.cues if cues is None else resolve_cues(cues, self.pair_name)
        except CueConfigError as exc:
            raise GenerationError(str(exc)) from exc
        draft_limit = self.speculative if speculative is None else self._draft_limit(speculative)
        return GenerationPlan(
            ids, min(max_new_tokens, room), sampling, stops, mode, request_cues, reprefill_segments, draft_limit
        )

    def _draft_limit(self, speculative: bool | int) -> int:
        """``False`` -> 0 (off), ``True`` -> the default maximum draft length, an int -> that maximum."""
        if speculative is True:
            speculative = DEFAULT_MAX_DRAFT
        if speculative is False or speculative == 0:
            return 0
        if not isinstance(speculative, int) or not 1 <= speculative <= 64:
            raise GenerationError(f"speculative must be True, False or a draft length 1..64, got {speculative!r}")
        if "small" not in self.runners:
            raise GenerationError("speculative decoding needs a small model to draft, and this engine has none")
        return speculative

    # -- running ------------------------------------------------------------------------------------------------
    def run_plan(self, plan: GenerationPlan, cancel: threading.Event | None = None) -> Iterator[StreamEvent]:
        """The stream of one planned request. Holds the engine lock while it runs; closing it stops generation."""
        with self._lock:
            # Speculation in mode "large" needs the small model too (as the drafter); mode "small" has nothing to draft.
            both = plan.mode == "relay" or (plan.mode == "large" and plan.speculative > 0)
            runners = {role: self.runners[role] for role in (("large", "small") if both else (plan.mode,))}
            speculation = (
                Speculation(DraftLength(plan.speculative), self.draft_confidence) if plan.speculative and both else None
            )
            policy = RelayPolicy(plan.cues, self.policy_config, plan.mode)
            yield from relay_stream(
                runners,
                self.tokenizer,
                plan.prompt_ids,
                policy,
                Sampler(plan.sampling),
                plan.max_new_tokens,
                self.eos_ids,
                plan.stop,
                cancel,
                self.reuse_prefix and not plan.reprefill_segments,
                plan.reprefill_segments,
                speculation,
            )

    def stream_ids(
        self, prompt_ids: Sequence[int], cancel: threading.Event | None = None, **settings: Any
    ) -> Iterator[StreamEvent]:
        """Raw path: stream from prompt token ids (no chat template)."""
        return self.run_plan(self.plan(prompt_ids, **settings), cancel)

    def generate_ids(self, prompt_ids: Sequence[int], **settings: Any) -> RelayResult:
        return _final(self.stream_ids(prompt_ids, **settings))

    def stream(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        assistant_prefix: str | None = None,
        cancel: threading.Event | None = None,
        **settings: Any,
    ) -> Iterator[StreamEvent]:
        """Streams TextEvent / SwitchEvent as text becomes final, then one FinalEvent with the whole result."""
        prompt_ids = self.encode_messages(messages, tools, chat_template_kwargs, assistant_prefix)
        return self.stream_ids(prompt_ids, cancel, **settings)

    def generate(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        assistant_prefix: str | None = None,
        **settings: Any,
    ) -> RelayResult:
        return _final(
            self.stream(
                messages,
                tools=tools,
                chat_template_kwargs=chat_template_kwargs,
                assistant_prefix=assistant_prefix,
                **settings,
            )
        )

    async def astream_plan(self, plan: GenerationPlan) -> AsyncIterator[StreamEvent]:
        """Runs the plan on a worker thread and hands events back through the event loop, which is never blocked.
        Cancelling the consumer (or closing the iterator) stops generation within one decode step."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()
        cancel = threading.Event()

        def deliver(item: Any) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, item)
            except RuntimeError:  # the loop closed under us: nobody is listening any more
                cancel.set()

        def work() -> None:
            try:
                for event in self.run_plan(plan, cancel):
                    deliver(event)
            except BaseException as exc:
                deliver(_Failure(exc))
            finally:
                deliver(_DONE)

        worker = threading.Thread(target=work, name="relaygen-generate", daemon=True)
        worker.start()
        try:
            while True:
                item = await queue.get()
                if item is _DONE:
                    return
                if isinstance(item, _Failure):
                    raise item.exc
                yield item
        finally:
            cancel.set()

    async def astream(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        assistant_prefix: str | None = None,
        **settings: Any,
    ) -> AsyncIterator[StreamEvent]:
        plan = self.plan(self.encode_messages(messages, tools, chat_template_kwargs, assistant_prefix), **settings)
        async for event in self.astream_plan(plan):
            yield event

    async def agenerate(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        assistant_prefix: str | None = None,
        **settings: Any,
    ) -> RelayResult:
        async for event in self.astream(
            messages,
            tools=tools,
            chat_template_kwargs=chat_template_kwargs,
            assistant_prefix=assistant_prefix,
            **settings,
        ):
            if isinstance(event, FinalEvent):
                return event.result
        raise RuntimeError("generation ended without a result")

    async def agenerate_ids(self, prompt_ids: Sequence[int], **settings: Any) -> RelayResult:
        async for event in self.astream_plan(self.plan(prompt_ids, **settings)):
            if isinstance(event, FinalEvent):
                return event.result
        raise RuntimeError("generation ended without a result")


def _final(events: Iterator[StreamEvent]) -> RelayResult:
    for event in events:
        if isinstance(event, FinalEvent):
            return event.result
    raise RuntimeError("generation ended without a result")
