"""RelayEngine: the public, framework-free front (load a pair once, generate / stream, sync or async).

The front plans and validates every request (one :class:`GenerationSettings`), owns the switching policy and the
transcript, serializes requests where the backend needs it, and runs the one generation loop (``core/loop.drive``)
over a :class:`~relaygen_integrations.engine.core.backend.Backend`: ``LocalBackend`` (two in-process models) or
``RemoteBackend`` (two OpenAI-compatible servers). Async and streaming are built here once for every backend.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from typing import Any, Literal

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..tune.configuration import configure_pair, cost_recorder
from .constraints.grammar import GrammarTokenizer
from .core.backend import Backend, BackendCapabilityError
from .core.configuration import PairConfiguration
from .core.cues import CueConfigError, CueSet, resolve_cues
from .core.guard import EngineBusyError, RequestLock, check_prompt_ids, policy_config
from .core.loop import drive
from .core.pairs import known_pair, reasoning_end_marker
from .core.policy import PolicyConfig, RelayPolicy
from .core.prompt import chat_of_checked, render_chat_ids, render_prompt_ids
from .core.settings import (
    GenerationError,
    GenerationPlan,
    GenerationSettings,
    PromptError,
    SettingsError,
    merge_settings,
    shown,
)
from .core.spans import FinalEvent, Mode, RelayResult, StreamEvent, Usage
from .core.transcript import Transcript
from .core.verify import VerifyRule, parse_verify_default
from .core.worker_stream import stream_on_worker
from .local.backend import LocalBackend
from .local.draft_head import DraftVocab
from .local.kv import KVCacheKind, cache_options
from .local.loading import load_pair, pair_key, pick_device, shared_pair
from .local.speculative import DEFAULT_DRAFT_CONFIDENCE
from .local.weights import PairDTypeSpec
from .remote import connect

__all__ = ["BackendCapabilityError", "EngineBusyError", "GenerationError", "GenerationPlan", "RelayEngine"]


class RelayEngine:
    """Two models that share a tokenizer writing one answer together, behind one front for every backend.

    Local requests are serialized (one lock): the caches hold one sequence at a time, and on a CPU a second
    concurrent generation would only split the same cores. Threads and asyncio tasks can share one engine safely.
    Construct it with :meth:`from_pretrained`, :meth:`from_models`, :meth:`from_endpoints`, or over any backend.
    """

    def __init__(
        self,
        backend: Backend,
        tokenizer: PreTrainedTokenizerBase,
        cues: CueSet | str | list[str] = "generic",
        policy: PolicyConfig | Mapping[str, Any] | None = None,
        *,
        pair_name: str | None = None,
        mode: Mode | None = None,
        speculative: bool | int = False,
        verify: VerifyRule | str | None = None,
        prompt_lookup: bool = False,
    ) -> None:
        self.backend = backend
        self.tokenizer = tokenizer
        self.configuration: PairConfiguration | None = None  # where the defaults came from (from_pretrained)
        self.on_usage: Callable[[Usage], None] | None = None  # told each finished generation's usage (tune/observed)
        self.pair_name = pair_name
        self.cues = cues if isinstance(cues, CueSet) else resolve_cues(cues, pair_name)
        config = policy_config(policy)
        if config.reasoning_end is None:
            config = config.model_copy(update={"reasoning_end": reasoning_end_marker(tokenizer)})
        self.policy_config = config
        self._lock = RequestLock()
        self._cue_cache: dict[Any, CueSet] = {}
        # The ids every model of the pair can read: the tokenizer's, and no more than the backend's models take.
        self.vocab_size = min(len(tokenizer), backend.vocab_size)
        # Defaults for requests that do not say, validated like a request's. ``mode=None``: relay with a small model.
        fallback: Mode = "relay" if "small" in backend.roles else "large"
        self.mode: Mode = self._checked_mode(merge_settings({"mode": mode}).mode or fallback)
        self.speculative = self._draft_limit(merge_settings({"speculative": speculative}), default=0)
        self.prompt_lookup = bool(merge_settings({"prompt_lookup": prompt_lookup}).prompt_lookup)
        try:  # the rule for requests that leave ``verify`` unset; None = off
            self.verify = parse_verify_default(verify)
        except ValueError as exc:
            raise SettingsError(f"verify: {exc}", "verify") from exc

    # -- construction ------------------------------------------------------------------------------------------
    @classmethod
    def from_models(
        cls,
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
        mode: Mode | None = None,
        speculative: bool | int = False,
        verify: VerifyRule | str | None = None,
        draft_confidence: float = DEFAULT_DRAFT_CONFIDENCE,
        draft_vocab: DraftVocab = None,
        kv_cache: KVCacheKind = "auto",
        compile: bool = False,
        prompt_lookup: bool = False,
    ) -> RelayEngine:
        """An engine over two loaded transformers models (the small one may be None: mode ``large`` only).
        ``kv_cache="static"`` preallocates each model's KV cache; ``compile=True`` (static cache implied) compiles the
        one-token decode step (``local/kv.py``). ``draft_vocab=N``: drafts score the N most frequent tokens (+ special,
        prompt) only (``draft_head.py``) - lossless in exact arithmetic; in bf16 texts can part at near-ties."""
        backend = LocalBackend(
            large, small, tokenizer, large_name=large_name, small_name=small_name, reuse_prefix=reuse_prefix,
            draft_confidence=draft_confidence, draft_vocab=draft_vocab, cache=cache_options(kv_cache, compile),
        )  # fmt: skip
        return cls(backend, tokenizer, cues, policy, pair_name=pair_name, mode=mode, speculative=speculative,
                   verify=verify, prompt_lookup=prompt_lookup)  # fmt: skip

    @classmethod
    def from_pretrained(
        cls,
        large: str = "demo",
        small: str = "demo",
        cues: str | list[str] | CueSet = "auto",
        device: str | torch.device = "auto",
        dtype: PairDTypeSpec = "auto",
        *,
        policy: PolicyConfig | Mapping[str, Any] | None = None,
        trust_remote_code: bool = False,
        allow_pickle: bool = False,
        reuse_prefix: bool = True,
        mode: Mode | Literal["auto"] = "auto",
        speculative: bool | int | Literal["auto"] = "auto",
        verify: VerifyRule | str | None = "auto",
        draft_confidence: float = DEFAULT_DRAFT_CONFIDENCE,
        draft_vocab: DraftVocab | Literal["auto"] = "auto",
        kv_cache: KVCacheKind = "auto",
        compile: bool = False,
        prompt_lookup: bool | Literal["auto"] = "auto",
    ) -> RelayEngine:
        """Loads both models (a known pair name such as ``"demo"``, a local directory, or a hub id).

        The tokenizer and chat template come from the large model; the small model's tokenizer must agree with it.
        ``mode`` / ``verify`` / ``draft_vocab`` / ``speculative`` / ``dtype`` all ``"auto"``: a known pair's
        configuration tuned for this machine (``tune/``: the fastest accuracy-backed one), else (``RELAYGEN_TUNE=off``
        or any given) the profile's for the rest (``engine.configuration`` says which). ``dtype`` may give each
        model its own format: ``"bf16/int8"`` (large/small) or ``{"large": "bf16", "small": "int8"}``.
        """
        torch_device = pick_device(device)
        given = dict(mode=mode, speculative=speculative, verify=verify, dtype=dtype, draft_vocab=draft_vocab,
                     prompt_lookup=prompt_lookup)  # fmt: skip
        configuration = configure_pair(known_pair(large, small), torch_device, given)
        formats = configuration.dtype if isinstance(dtype, str) and dtype == "auto" else dtype
        loaded = load_pair(large, small, torch_device, formats, trust_remote_code, allow_pickle)
        large_model, small_model, tokenizer, pair_name = loaded.large, loaded.small, loaded.tokenizer, loaded.pair_name
        engine = cls.from_models(
            large_model, small_model, tokenizer, cues=resolve_cues(cues, pair_name), policy=policy,
            large_name=loaded.large_name, small_name=loaded.small_name, pair_name=pair_name, reuse_prefix=reuse_prefix,
            mode=configuration.mode if mode == "auto" else mode,  # type: ignore[arg-type]
            speculative=configuration.speculative if speculative == "auto" else speculative,
            verify=configuration.verify if verify == "auto" else verify, draft_confidence=draft_confidence,
            draft_vocab=configuration.draft_vocab if draft_vocab == "auto" else draft_vocab, kv_cache=kv_cache,
            compile=compile or configuration.compile,
            prompt_lookup=configuration.prompt_lookup if prompt_lookup == "auto" else prompt_lookup,
        )  # fmt: skip
        engine.configuration, engine.on_usage = configuration, cost_recorder(pair_name, configuration)
        return engine

    @classmethod
    def shared(
        cls,
        large: str = "demo",
        small: str = "demo",
        device: str | torch.device = "auto",
        dtype: PairDTypeSpec = "auto",
        **options: Any,
    ) -> RelayEngine:
        """One engine - one copy of the weights - per pair of models, device and dtype (plus loading ``options``
        such as ``trust_remote_code``), loaded on first use. Cues, policy and speculation are per request, so
        adapters that differ only in those share the weights."""
        # An option passed at its default (``compile=False``) must share the copy loaded without it.
        defaults = {name: p.default for name, p in inspect.signature(cls.from_pretrained).parameters.items()}
        chosen = {k: v for k, v in options.items() if k not in defaults or v != defaults[k]}
        return shared_pair(
            pair_key(large, small, device, dtype, chosen),
            lambda: cls.from_pretrained(large=large, small=small, device=device, dtype=dtype, **options),
        )

    @classmethod
    def from_endpoints(
        cls,
        large: str,
        small: str | None,
        tokenizer: str | PreTrainedTokenizerBase,
        cues: CueSet | str | list[str] = "auto",
        policy: PolicyConfig | Mapping[str, Any] | None = None,
        **options: Any,
    ) -> RelayEngine:
        """The same engine over two OpenAI-compatible completion servers (tested: vLLM, llama-cpp-python's server,
        ``relaygen serve --single``): ``large``/``small`` are base URLs such as ``http://host:8000/v1``;
        ``tokenizer`` (a hub id, a local directory or a tokenizer) renders the chat template here and must be the
        servers' tokenizer.

        ``options``: ``api_key``, ``timeout``, ``retries``, ``large_model``/``small_model`` (served model names;
        default: the first each server lists), ``context_window``, ``server_stops`` (default True),
        ``trust_remote_code``; ``verify`` (the default rule; needs a server that scores prompts); ``mode`` (the
        default for requests that name none: relay, or ``"large"`` without a small server). Design:
        ``engine/remote/backend.py``.
        """
        verify = options.pop("verify", None)
        mode = options.pop("mode", None)
        backend = connect(large, small, tokenizer, **options)
        return cls(backend, backend.tokenizer, cues, policy, mode=mode, verify=verify)

    # -- identity and lifetime ------------------------------------------------------------------------------------
    @property
    def large_name(self) -> str:
        return self.backend.large_name

    @property
    def small_name(self) -> str:
        return self.backend.small_name

    @property
    def context_window(self) -> int:
        return self.backend.context_window

    @property
    def eos_ids(self) -> frozenset[int]:
        return self.backend.eos_ids

    @property
    def grammar_tokenizer(self) -> GrammarTokenizer | None:
        """The tokenizer a tool or schema grammar is built with; None where the backend cannot mask tokens."""
        return self.backend.grammar_tokenizer if self.backend.grammars else None

    def close(self) -> None:
        """Releases the backend's resources (HTTP connections; local caches)."""
        self.backend.close()

    def __enter__(self) -> RelayEngine:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- request preparation ------------------------------------------------------------------------------------
    def encode_messages(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        assistant_prefix: str | None = None,
        *,
        raw_markup: bool = False,
        checked: bool = False,
    ) -> list[int]:
        """Prompt ids of a chat (validated first: ``MessageError`` / ``ToolSchemaError`` name what is wrong).
        Control-token strings in the messages are encoded as text; ``raw_markup=True`` makes them tokens, for a
        caller who really passes chat markup. ``checked=True``: the caller checked the messages and tools already
        (``validate_messages`` / ``validate_tools``, as the chat layer's ``prepare_chat`` does), so a request is
        checked once; the template variables (they need this tokenizer) and the prefix are checked here either way."""
        if checked:
            chat = chat_of_checked(self.tokenizer, messages, tools, chat_template_kwargs, assistant_prefix)
            return render_chat_ids(self.tokenizer, chat, raw_markup=raw_markup)
        return render_prompt_ids(
            self.tokenizer, messages, tools, chat_template_kwargs, assistant_prefix, raw_markup=raw_markup
        )

    def plan(
        self, prompt_ids: Sequence[int], settings: GenerationSettings | None = None, **overrides: Any
    ) -> GenerationPlan:
        """Validates a request before any model work starts, so a bad one leaves nothing half-done. ``settings``
        (built with ``merge_settings``) and/or keyword ``overrides``: the fields of :class:`GenerationSettings`."""
        if overrides or not isinstance(settings, GenerationSettings):
            settings = merge_settings(settings, overrides)
        mode = self.mode if settings.mode is None else self._checked_mode(settings.mode)
        ids = check_prompt_ids(prompt_ids, self.vocab_size)
        if not ids:
            raise PromptError("the prompt is empty", "prompt_ids")
        room = self.context_window - len(ids)
        if room <= 0:
            raise PromptError(
                f"the prompt has {len(ids)} tokens but the context window is {self.context_window} tokens",
                "prompt_ids",
            )
        plan = GenerationPlan(
            prompt_ids=ids,
            settings=settings,
            max_new_tokens=min(settings.max_new_tokens, room),
            cues=self._request_cues(settings.cues),
            speculative=self._draft_limit(settings, self.speculative),
            prompt_lookup=self.prompt_lookup if settings.prompt_lookup is None else settings.prompt_lookup,
            verify=self.verify if settings.verify is None else settings.verify or None,
            mode=mode,
        )
        self.backend.check(plan)
        return plan

    def _request_cues(self, spec: Any) -> CueSet:
        """Per-request cues (e.g. comparing cue sets on one loaded pair); None keeps the engine's own. Resolved
        once per distinct spec: a profile is read from disk only the first time."""
        if spec is None:
            return self.cues
        if isinstance(spec, CueSet):
            return spec
        cached = self._cue_cache.get(spec)
        if cached is None:
            try:
                cached = self._cue_cache[spec] = resolve_cues(
                    spec if isinstance(spec, str) else list(spec), self.pair_name
                )
            except CueConfigError as exc:
                raise GenerationError(str(exc), "cues") from exc
        return cached

    def _checked_mode(self, mode: Mode) -> Mode:
        if mode != "large" and "small" not in self.backend.roles:
            raise GenerationError(f"mode {mode!r} needs a small model, and this engine has none", "mode")
        return mode

    def _draft_limit(self, settings: GenerationSettings, default: int) -> int:
        limit = settings.draft_limit(default)
        if limit and "small" not in self.backend.roles:
            raise GenerationError(
                "speculative decoding needs a small model to draft, and this engine has none", "speculative"
            )
        return limit

    # -- running ------------------------------------------------------------------------------------------------
    def run_plan(
        self, plan: GenerationPlan, cancel: threading.Event | None = None, requester: int | None = None
    ) -> Iterator[StreamEvent]:
        """The stream of one planned request; closing it stops generation. Holds the engine lock while it runs when
        the backend serializes requests: from its first event until it is exhausted, closed or garbage-collected,
        other threads' requests wait, and a request from this thread raises :class:`EngineBusyError` at once. A
        backend that does not serialize (remote endpoints) runs a nested request alongside."""
        if cancel is not None and not callable(getattr(cancel, "is_set", None)):
            raise SettingsError(f"cancel must be a threading.Event, got {shown(cancel)}", "cancel")
        what = f"a {plan.mode} request for {plan.max_new_tokens} tokens"
        with self._lock.hold(what, requester) if self.backend.serialized else contextlib.nullcontext():
            policy = RelayPolicy(plan.cues, self.policy_config, plan.mode)
            transcript = Transcript(
                self.tokenizer, plan.prompt_ids, policy, plan.stop, self.eos_ids, plan.max_new_tokens,
                plan.verify, plan.logprobs,
            )  # fmt: skip
            for event in drive(transcript, self.backend.open(plan, transcript), cancel):
                if isinstance(event, FinalEvent) and self.configuration is not None:
                    event.result.configuration = self.configuration.describe()
                if isinstance(event, FinalEvent) and self.on_usage is not None:
                    self.on_usage(event.result.usage)
                yield event

    def stream_ids(
        self,
        prompt_ids: Sequence[int],
        cancel: threading.Event | None = None,
        settings: GenerationSettings | None = None,
        **overrides: Any,
    ) -> Iterator[StreamEvent]:
        """Raw path: stream from prompt token ids (no chat template)."""
        return self.run_plan(self.plan(prompt_ids, settings, **overrides), cancel)

    def generate_ids(
        self, prompt_ids: Sequence[int], settings: GenerationSettings | None = None, **overrides: Any
    ) -> RelayResult:
        return _final(self.stream_ids(prompt_ids, None, settings, **overrides))

    def stream(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        assistant_prefix: str | None = None,
        raw_markup: bool = False,
        cancel: threading.Event | None = None,
        settings: GenerationSettings | None = None,
        **overrides: Any,
    ) -> Iterator[StreamEvent]:
        """Streams TextEvent / SwitchEvent as text becomes final, then one FinalEvent with the whole result."""
        ids = self.encode_messages(messages, tools, chat_template_kwargs, assistant_prefix, raw_markup=raw_markup)
        return self.run_plan(self.plan(ids, settings, **overrides), cancel)

    def generate(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        assistant_prefix: str | None = None,
        raw_markup: bool = False,
        settings: GenerationSettings | None = None,
        **overrides: Any,
    ) -> RelayResult:
        return _final(
            self.stream(
                messages, tools=tools, chat_template_kwargs=chat_template_kwargs, assistant_prefix=assistant_prefix,
                raw_markup=raw_markup, settings=settings, **overrides,
            )
        )  # fmt: skip

    async def astream_plan(self, plan: GenerationPlan) -> AsyncIterator[StreamEvent]:
        """Runs the plan on a worker thread and hands events back through the event loop, which is never blocked.
        Cancelling the consumer (or closing the iterator) stops generation within one decode step. Called from a
        thread that holds a sync stream of this engine open, it raises :class:`EngineBusyError` at once (its worker
        would wait for that stream); a sync call from this loop's thread while it runs does too."""
        requester = threading.get_ident()
        if self.backend.serialized:
            self._lock.check_async(requester)
        async for event in stream_on_worker(lambda cancel: self.run_plan(plan, cancel, requester=requester)):
            yield event

    async def astream(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        assistant_prefix: str | None = None,
        raw_markup: bool = False,
        settings: GenerationSettings | None = None,
        **overrides: Any,
    ) -> AsyncIterator[StreamEvent]:
        plan = await asyncio.to_thread(
            self._chat_plan, messages, tools, chat_template_kwargs, assistant_prefix, raw_markup, settings, overrides
        )
        async for event in self.astream_plan(plan):
            yield event

    async def agenerate(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        assistant_prefix: str | None = None,
        raw_markup: bool = False,
        settings: GenerationSettings | None = None,
        **overrides: Any,
    ) -> RelayResult:
        plan = await asyncio.to_thread(
            self._chat_plan, messages, tools, chat_template_kwargs, assistant_prefix, raw_markup, settings, overrides
        )
        return await _afinal(self.astream_plan(plan))

    def _chat_plan(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None,
        chat_template_kwargs: Mapping[str, Any] | None,
        assistant_prefix: str | None,
        raw_markup: bool,
        settings: GenerationSettings | None,
        overrides: Mapping[str, Any],
    ) -> GenerationPlan:
        # The async entry points run this on a worker thread: rendering and tokenizing a long chat would stall the
        # event loop (a 20,000-message chat takes about a second to tokenize; the tokenizer releases the GIL).
        ids = self.encode_messages(messages, tools, chat_template_kwargs, assistant_prefix, raw_markup=raw_markup)
        return self.plan(ids, settings, **overrides)

    async def agenerate_ids(
        self, prompt_ids: Sequence[int], settings: GenerationSettings | None = None, **overrides: Any
    ) -> RelayResult:
        return await _afinal(self.astream_plan(self.plan(prompt_ids, settings, **overrides)))


def _final(events: Iterator[StreamEvent]) -> RelayResult:
    for event in events:
        if isinstance(event, FinalEvent):
            return event.result
    raise RuntimeError("generation ended without a result")


async def _afinal(events: AsyncIterator[StreamEvent]) -> RelayResult:
    # Read to the end, which comes only once the worker has let go of the engine: a blocking call may follow at once.
    results = [event.result async for event in events if isinstance(event, FinalEvent)]
    if not results:
        raise RuntimeError("generation ended without a result")
    return results[0]
