"""``relaygen serve --single``: ONE model as a plain OpenAI-style completion server (``POST /v1/completions``).

It answers the way vLLM does: a text or token-id prompt, stop strings dropped from the text and reported as
``stop_reason``, and with ``"return_token_ids": true`` every generated id (the tokens of a matched stop string and the
eos included). It is the counterpart ``RelayEngine.from_endpoints`` talks to, and it keeps a prefix cache like vLLM's:
a request that extends the previous one forward-passes only the new tokens. It is a session of the local backend run by
the engine's one loop (``drive``): text, stop sequences and the budget are the same ``Transcript`` every relay
backend feeds.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..engine.core.backend import Step
from ..engine.core.cues import CueSet
from ..engine.core.loop import drive
from ..engine.core.policy import RelayPolicy
from ..engine.core.prompt import check_text
from ..engine.core.settings import GenerationPlan, GenerationSettings, SamplingParams
from ..engine.core.spans import FinalEvent, ModelRole, TextEvent
from ..engine.core.transcript import BackendUsage, Fed, Transcript
from ..engine.local.backend import LocalBackend
from ..engine.local.kv import CacheOptions
from ..engine.local.runner import ModelRunner
from ..engine.local.session import LocalSession
from .http import (
    CLIENT_CLOSED_REQUEST,
    SSE_DONE,
    ClientDisconnected,
    error_response,
    models_response,
    new_app,
    sse,
    unless_disconnected,
)

_NO_CUES = CueSet(())


class CompletionRequest(BaseModel):
    """OpenAI completions fields (plus vLLM's ``top_k`` and ``return_token_ids``); other fields are ignored."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    prompt: str | list[int]
    max_tokens: int = Field(16, ge=1)
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    n: int = 1
    return_token_ids: bool = False
    prompt_logprobs: int | None = Field(None, ge=0)  # vLLM's: each prompt token's logprob and rank, and the top k


@dataclass
class CompletionPiece:
    """What one step of a completion adds: the token (none at a ``length`` end), the text that became final, and at
    the end why it ended."""

    token_ids: list[int]
    text: str
    finish_reason: Literal["stop", "length"] | None = None
    stop_reason: str | None = None


@dataclass
class SingleModel:
    """One model behind a completion endpoint: the local backend over that model alone, its prefix cache shared by
    all requests, each request a :class:`LocalSession` run by the engine's one loop (``core/loop.drive``).

    The model is locked per decode step, not per request, and every step first crops the cache to what it shares with
    the request's sequence: concurrent or abandoned requests can never leave the cache holding the wrong tokens.
    """

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    backend: LocalBackend = field(init=False)
    lock: threading.Lock = field(default_factory=threading.Lock)
    cache: CacheOptions = field(default_factory=CacheOptions)  # static / compiled decode steps (``engine/local/kv.py``)

    def __post_init__(self) -> None:
        self.backend = LocalBackend(self.model, None, self.tokenizer, cache=self.cache)

    @property
    def runner(self) -> ModelRunner:
        return self.backend.runners["large"]

    @property
    def eos_ids(self) -> frozenset[int]:
        return self.backend.eos_ids

    @property
    def context_window(self) -> int:
        return self.backend.context_window

    def prompt_ids(self, prompt: str | list[int]) -> list[int]:
        """A text prompt is raw text for the model, markup included (as a completion server takes it), so only its
        well-formedness is checked; token ids must be in the vocabulary."""
        if isinstance(prompt, str):
            check_text(prompt, "prompt")
        ids = list(self.tokenizer.encode(prompt)) if isinstance(prompt, str) else list(prompt)
        if not ids:
            raise ValueError("the prompt is empty")
        vocab = self.model.config.vocab_size
        bad = next((i for i in ids if not 0 <= i < vocab), None)
        if bad is not None:
            raise ValueError(f"prompt token id {bad} is outside this model's vocabulary [0, {vocab})")
        return ids

    def prompt_logprobs(self, prompt_ids: list[int], top: int) -> list[dict[str, dict[str, Any]] | None]:
        """vLLM's ``prompt_logprobs``: for every prompt token after the first, its log-probability and rank (1 =
        the most likely) given the tokens before it, and the ``top`` most likely tokens'; None for the first."""
        with self.lock:
            try:
                rows = self.runner.score(prompt_ids, 1).float().log_softmax(dim=-1)
            except BaseException:
                self.runner.reset()
                raise
        entries: list[dict[str, dict[str, Any]] | None] = [None]
        for position, row in enumerate(rows[:-1], start=1):
            token = prompt_ids[position]
            entry = {str(token): _logprob(row, token, self.tokenizer)}
            for candidate in row.topk(top).indices.tolist() if top else []:
                entry.setdefault(str(candidate), _logprob(row, candidate, self.tokenizer))
            entries.append(entry)
        return entries

    def complete(
        self,
        prompt_ids: list[int],
        max_tokens: int,
        sampling: SamplingParams,
        stop: tuple[str, ...],
        cancel: threading.Event | None = None,
    ) -> Iterator[CompletionPiece]:
        """One piece per generated token (vLLM's semantics: a matched stop string ends the text before it and is
        reported as ``stop_reason``; the ids of every generated token are reported, eos included). ``cancel`` set
        (the client left) stops before the next decode step."""
        if len(prompt_ids) + max_tokens > self.context_window:
            raise ValueError(
                f"this model's context window is {self.context_window} tokens; the prompt has {len(prompt_ids)} and "
                f"max_tokens asks for {max_tokens} more"
            )
        settings = GenerationSettings(mode="large", max_new_tokens=max_tokens, stop=stop, **sampling.model_dump())
        plan = GenerationPlan(prompt_ids, settings, max_tokens, _NO_CUES, mode="large")
        # One writer, no cues: the transcript does text, stops and the budget exactly as in a relay generation.
        transcript = Transcript(self.tokenizer, prompt_ids, RelayPolicy(_NO_CUES, mode="large"), stop, self.eos_ids,
                                max_tokens)  # fmt: skip
        session = _TokenLog(self.backend.open(plan, transcript, step_lock=self.lock))
        events = drive(transcript, session, cancel)
        try:
            for event in events:
                if isinstance(event, TextEvent):
                    yield CompletionPiece(session.take(), event.text)
                elif isinstance(event, FinalEvent) and event.result.finish_reason != "cancelled":
                    # The end: the eos token (kept out of the text) and a stop string's tokens are reported too.
                    finish = "length" if event.result.finish_reason == "length" else "stop"
                    yield CompletionPiece(session.take(), "", finish, transcript.matched_stop)
        finally:
            events.close()


class _TokenLog:
    """A session that remembers the tokens it hands out: every generated id, the eos included, which the transcript
    keeps out of its own ids."""

    def __init__(self, session: LocalSession) -> None:
        self.session = session
        self.pending: list[int] = []

    def take(self) -> list[int]:
        taken, self.pending = self.pending, []
        return taken

    def next_tokens(self, writer: ModelRole) -> Step:
        step = self.session.next_tokens(writer)
        self.pending += step.tokens
        return step

    def verify(self) -> Step:
        return self.session.verify()

    def after_feed(self, fed: Fed) -> None:
        self.session.after_feed(fed)

    def close(self, failed: bool) -> None:
        self.session.close(failed)

    def usage(self) -> BackendUsage:
        return self.session.usage()


def _logprob(row: Any, token: int, tokenizer: PreTrainedTokenizerBase) -> dict[str, Any]:
    value = row[token]
    rank = int((row > value).sum()) + 1
    return {"logprob": float(value), "rank": rank, "decoded_token": tokenizer.decode([token])}


def create_single_app(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    served_model_name: str = "model",
    api_key: str | None = None,
    report_token_ids: bool = True,
    cache: CacheOptions | None = None,
    report_prompt_logprobs: bool = True,
) -> FastAPI:
    """A plain completion server for one model. ``report_token_ids=False`` ignores ``return_token_ids``, like a
    server that can only stream text (the remote backend then tokenizes each chunk); ``report_prompt_logprobs=False``
    ignores ``prompt_logprobs``, like a server that cannot score a prompt (no verified relay over it)."""
    single = SingleModel(model, tokenizer, cache=cache or CacheOptions())
    app = new_app(f"relaygen single: {served_model_name}", api_key)

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        return models_response(served_model_name, {"max_model_len": single.context_window})

    @app.post("/v1/completions", response_model=None)
    async def completions(body: CompletionRequest, http: Request) -> Response:
        cancel = threading.Event()  # set when the client leaves: the model stops before its next step
        try:
            if body.n != 1:
                raise ValueError("n must be 1")
            prompt_ids = single.prompt_ids(body.prompt)
            top_k = body.top_k if body.top_k is not None and body.top_k > 0 else None  # vLLM: -1 = off
            sampling = SamplingParams(temperature=body.temperature, top_p=body.top_p, top_k=top_k, seed=body.seed)
            stops = tuple(s for s in ([body.stop] if isinstance(body.stop, str) else body.stop or ()) if s)
            scored = body.prompt_logprobs is not None and report_prompt_logprobs
            prompt_logprobs = (
                await asyncio.to_thread(single.prompt_logprobs, prompt_ids, body.prompt_logprobs or 0)
                if scored
                else None
            )
            pieces = single.complete(prompt_ids, body.max_tokens, sampling, stops, cancel)
            # Validation and the first token happen here (on a worker thread), so errors still get a status code.
            first = await unless_disconnected(asyncio.to_thread(next, pieces), http, cancel.set)
            if not body.stream:
                rest = await unless_disconnected(asyncio.to_thread(list, pieces), http, cancel.set)
        except ClientDisconnected:
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        except (ValueError, ValidationError) as exc:
            return error_response(400, str(exc), "invalid_request_error")
        completion_id = f"cmpl-{uuid.uuid4().hex}"
        base = {"id": completion_id, "object": "text_completion", "created": int(time.time())}
        base["model"] = served_model_name
        with_ids = body.return_token_ids and report_token_ids

        def choice(piece: CompletionPiece, token_ids: list[int], first_chunk: bool = True) -> dict[str, Any]:
            data: dict[str, Any] = {"index": 0, "text": piece.text, "logprobs": None}
            data.update(finish_reason=piece.finish_reason, stop_reason=piece.stop_reason)
            if with_ids:
                data["token_ids"] = token_ids
            if scored and first_chunk:  # streamed: in the first chunk, as vLLM sends it
                data["prompt_logprobs"] = prompt_logprobs
            return data

        def all_pieces() -> Iterator[CompletionPiece]:
            yield first
            yield from pieces

        if body.stream:

            def events() -> Iterator[str]:
                for index, piece in enumerate(all_pieces()):
                    yield sse({**base, "choices": [choice(piece, piece.token_ids, index == 0)]})
                yield SSE_DONE

            return StreamingResponse(events(), media_type="text/event-stream")
        collected = [first, *rest]
        last = collected[-1]
        whole = CompletionPiece([], "".join(p.text for p in collected), last.finish_reason, last.stop_reason)
        token_ids = [t for p in collected for t in p.token_ids]
        usage = {"prompt_tokens": len(prompt_ids), "completion_tokens": len(token_ids)}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        return JSONResponse({**base, "choices": [choice(whole, token_ids)], "usage": usage})

    return app
