"""OpenAI-compatible HTTP servers (FastAPI): ``relaygen serve`` and ``relaygen serve --single``.

* :func:`create_app` serves a relay engine (local or remote) as ``POST /v1/chat/completions`` (JSON or SSE streaming)
  and ``GET /v1/models``. Responses carry the usual ``usage`` (plus ``large_tokens``/``small_tokens``) and a
  ``relaygen`` field with the spans and per-model counts (``RelayResult.relay_metadata()``); streamed chunks name the
  model that wrote them.
* :func:`create_single_app` serves ONE model as a plain completion server, ``POST /v1/completions`` with a text or
  token-id prompt, the way vLLM does: stop strings are dropped from the text and reported as ``stop_reason``, and
  ``"return_token_ids": true`` returns every generated id (the tokens of a matched stop string and the eos included).
  It is the counterpart ``RelayEngine.from_endpoints`` talks to, and it keeps a prefix cache like vLLM's: a request
  that extends the previous one forward-passes only the new tokens.

Both accept an optional API key (``Authorization: Bearer KEY``; anything else gets 401). Import this module only to
serve: it needs the ``serve`` extra (``pip install 'relaygen-integrations[serve]'``).
"""

from __future__ import annotations

import json
import secrets
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from fastapi import Depends, FastAPI, Header, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from .chat.relay_chat import ChatDelta, astream_chat, prepare_chat
from .chat.tool_calls import ToolCall
from .engine.detokenize import IncrementalDetokenizer
from .engine.engine import RelayEngine
from .engine.models import context_window, eos_token_ids
from .engine.remote import EndpointError
from .engine.runner import ModelRunner
from .engine.sampling import Sampler, SamplingParams
from .engine.spans import ModelRole, RelayResult
from .engine.transcript import find_stop, stop_holdback

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
_FINISH_REASONS = {"stop": "stop", "stop_sequence": "stop", "length": "length", "cancelled": "stop"}


# -- shared: errors, auth, SSE --------------------------------------------------------------------------------------
def _error_response(status: int, message: str, kind: str) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status, headers=headers)


def _error_kind(exc: BaseException) -> tuple[int, str]:
    """Bad input (ValueError: settings, messages, tools) is the caller's; a remote endpoint failing is a bad gateway."""
    if isinstance(exc, ValueError):
        return 400, "invalid_request_error"
    if isinstance(exc, EndpointError):
        return 502, "upstream_error"
    return 500, "server_error"


def _new_app(title: str, api_key: str | None) -> FastAPI:
    dependencies = [Depends(_require_key(api_key))] if api_key else []
    app = FastAPI(title=title, dependencies=dependencies)

    @app.exception_handler(HTTPException)
    async def http_error(_request: Request, exc: HTTPException) -> JSONResponse:
        kind = "authentication_error" if exc.status_code == 401 else "invalid_request_error"
        return _error_response(exc.status_code, str(exc.detail), kind)

    @app.exception_handler(RequestValidationError)
    async def invalid_body(_request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'][1:]) or 'body'}: {e['msg']}" for e in exc.errors())
        return _error_response(400, problems, "invalid_request_error")

    return app


def _require_key(api_key: str) -> Callable[[str | None], None]:
    expected = f"Bearer {api_key}".encode()

    def check(authorization: str | None = Header(default=None)) -> None:
        # compare_digest: the time taken does not tell how much of a guessed key was right.
        if authorization is None or not secrets.compare_digest(authorization.encode(), expected):
            raise HTTPException(401, "missing or wrong API key: send the header 'Authorization: Bearer <key>'")

    return check


def _sse(data: Mapping[str, Any]) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


_SSE_DONE = "data: [DONE]\n\n"


def _models_response(name: str, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    card = {"id": name, "object": "model", "created": int(time.time()), "owned_by": "relaygen", **(extra or {})}
    return {"object": "list", "data": [card]}


# -- relay chat completions -------------------------------------------------------------------------------------------
class ChatCompletionRequest(BaseModel):
    """The OpenAI chat-completions fields the relay understands; other OpenAI fields are accepted and ignored."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    messages: list[dict[str, Any]]
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    n: int = 1
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    mode: Literal["relay", "large", "small"] = "relay"


def _chat_settings(body: ChatCompletionRequest) -> dict[str, Any]:
    """Engine settings: only what the request gives, so the engine's defaults (greedy, 256 tokens) apply otherwise."""
    if body.n != 1:
        raise ValueError("n must be 1: one relay generation per request")
    settings: dict[str, Any] = {"mode": body.mode}
    max_tokens = body.max_completion_tokens or body.max_tokens
    given = {"max_new_tokens": max_tokens, "temperature": body.temperature, "top_p": body.top_p, "seed": body.seed}
    settings.update({key: value for key, value in given.items() if value is not None})
    if body.top_k is not None and body.top_k > 0:  # vLLM's "-1 = off" convention
        settings["top_k"] = body.top_k
    if body.stop:
        settings["stop"] = [body.stop] if isinstance(body.stop, str) else body.stop
    return settings


def _tool_call_json(call: ToolCall, index: int | None = None) -> dict[str, Any]:
    data: dict[str, Any] = {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False)},
    }
    return data if index is None else {"index": index, **data}


def _chat_usage(result: RelayResult) -> dict[str, Any]:
    usage = result.usage
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "large_tokens": usage.large_tokens,
        "small_tokens": usage.small_tokens,
    }


def _finish_reason(delta: ChatDelta) -> str:
    assert delta.result is not None and delta.parsed is not None
    return "tool_calls" if delta.parsed.tool_calls else _FINISH_REASONS[delta.result.finish_reason]


def create_app(engine: RelayEngine, served_model_name: str = "relaygen", api_key: str | None = None) -> FastAPI:
    """An OpenAI-compatible chat server over ``engine`` (local or ``RelayEngine.from_endpoints``)."""
    app = _new_app("relaygen", api_key)

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        return _models_response(
            served_model_name, {"relaygen": {"large": engine.large_name, "small": engine.small_name}}
        )

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(body: ChatCompletionRequest) -> JSONResponse | StreamingResponse:
        try:
            request = prepare_chat(
                body.messages,
                tools=body.tools,
                tool_choice=body.tool_choice,
                chat_template_kwargs=body.chat_template_kwargs,
                response_format=body.response_format,
                **_chat_settings(body),
            )
            deltas = astream_chat(engine, request)
            # The first delta arrives once the request is validated and the first token is written: an error up to
            # here is still a proper HTTP status, not an error inside a 200 stream.
            first = await deltas.__anext__()
        except Exception as exc:
            status, kind = _error_kind(exc)
            return _error_response(status, str(exc), kind)
        completion_id = f"chatcmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        if body.stream:
            return StreamingResponse(
                _chat_sse(first, deltas, completion_id, created, served_model_name), media_type="text/event-stream"
            )
        final = first
        async for delta in deltas:
            final = delta
        assert final.result is not None and final.parsed is not None
        parsed, result = final.parsed, final.result
        message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
        if parsed.tool_calls:
            message["tool_calls"] = [_tool_call_json(call) for call in parsed.tool_calls]
            message["content"] = parsed.content or None
        return JSONResponse(
            {
                "id": completion_id,
                "object": "chat.completion",
                "created": created,
                "model": served_model_name,
                "choices": [{"index": 0, "message": message, "finish_reason": _finish_reason(final)}],
                "usage": _chat_usage(result),
                "relaygen": result.relay_metadata(),
            }
        )

    return app


async def _chat_sse(
    first: ChatDelta, deltas: AsyncIterator[ChatDelta], completion_id: str, created: int, model: str
) -> AsyncIterator[str]:
    def chunk(delta: Mapping[str, Any], finish: str | None = None, **extra: Any) -> str:
        choice = {"index": 0, "delta": dict(delta), "finish_reason": finish}
        base = {"id": completion_id, "object": "chat.completion.chunk", "created": created, "model": model}
        return _sse({**base, "choices": [choice], **extra})

    async def all_deltas() -> AsyncIterator[ChatDelta]:
        yield first
        async for delta in deltas:
            yield delta

    yield chunk({"role": "assistant", "content": ""})
    tool_index = 0
    try:
        async for delta in all_deltas():
            where = {"model": delta.model, "span_index": delta.span_index}
            if delta.result is not None:
                extra = {"usage": _chat_usage(delta.result), "relaygen": delta.result.relay_metadata()}
                yield chunk({}, _finish_reason(delta), **extra)
            elif delta.switch is not None:
                switch = delta.switch
                event = {"from": switch.from_model, "to": switch.to_model, "trigger": switch.trigger}
                yield chunk({}, relaygen={**where, "switch": {**event, "char_offset": switch.char_offset}})
            elif isinstance(delta.tool_call, ToolCall):
                yield chunk({"tool_calls": [_tool_call_json(delta.tool_call, tool_index)]}, relaygen=where)
                tool_index += 1
            elif delta.text:
                yield chunk({"content": delta.text}, relaygen=where)
    except Exception as exc:  # the 200 status is sent already: report in the stream, as vLLM does
        status, kind = _error_kind(exc)
        yield _sse({"error": {"message": str(exc), "type": kind, "code": status}})
    yield _SSE_DONE


# -- one model: plain completions -----------------------------------------------------------------------------------
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
    """One model behind a completion endpoint, with a prefix cache shared by all requests.

    The model is locked per decode step, not per request, and every step first crops the cache to what it shares with
    the request's sequence: concurrent or abandoned requests can never leave the cache holding the wrong tokens.
    """

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    runner: ModelRunner = field(init=False)
    eos_ids: frozenset[int] = field(init=False)
    context_window: int = field(init=False)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.runner = ModelRunner("large", self.model)
        self.eos_ids = eos_token_ids(self.model, self.tokenizer)
        self.context_window = context_window(self.model)

    def prompt_ids(self, prompt: str | list[int]) -> list[int]:
        ids = list(self.tokenizer.encode(prompt)) if isinstance(prompt, str) else list(prompt)
        if not ids:
            raise ValueError("the prompt is empty")
        vocab = self.model.config.vocab_size
        bad = next((i for i in ids if not 0 <= i < vocab), None)
        if bad is not None:
            raise ValueError(f"prompt token id {bad} is outside this model's vocabulary [0, {vocab})")
        return ids

    def complete(
        self, prompt_ids: list[int], max_tokens: int, sampling: SamplingParams, stop: tuple[str, ...]
    ) -> Iterator[CompletionPiece]:
        """One piece per generated token (vLLM's semantics: a matched stop string ends the text before it and is
        reported as ``stop_reason``; the ids of every generated token are reported, eos included)."""
        if len(prompt_ids) + max_tokens > self.context_window:
            raise ValueError(
                f"this model's context window is {self.context_window} tokens; the prompt has {len(prompt_ids)} and "
                f"max_tokens asks for {max_tokens} more"
            )
        sampler = Sampler(sampling)
        ids = list(prompt_ids)
        owners: list[ModelRole] = []
        detok = IncrementalDetokenizer(self.tokenizer)
        sent = 0  # characters of the text already sent
        for _ in range(max_tokens):
            with self.lock:
                try:
                    self.runner.sync_to(ids)
                    logits = self.runner.logits_for(ids, len(prompt_ids), owners)
                except BaseException:
                    self.runner.reset()  # a failed forward pass may leave the cache half-written
                    raise
            token = sampler(logits, ids)
            if token in self.eos_ids:
                detok.flush()
                yield CompletionPiece([token], detok.text[sent:], "stop")
                return
            delta = detok.push(token)
            ids.append(token)
            owners.append("large")
            text = detok.text
            hit = find_stop(text, len(text) - len(delta), stop) if stop else None
            if hit is not None:
                matched = next(s for s in stop if text.startswith(s, hit))
                yield CompletionPiece([token], text[sent:hit], "stop", matched)
                return
            release = max(sent, len(text) - (stop_holdback(text, stop) if stop else 0))
            yield CompletionPiece([token], text[sent:release])
            sent = release
        detok.flush()
        yield CompletionPiece([], detok.text[sent:], "length")


def create_single_app(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    served_model_name: str = "model",
    api_key: str | None = None,
    report_token_ids: bool = True,
) -> FastAPI:
    """A plain completion server for one model. ``report_token_ids=False`` ignores ``return_token_ids``, like a
    server that can only stream text (the remote backend then tokenizes each chunk)."""
    single = SingleModel(model, tokenizer)
    app = _new_app(f"relaygen single: {served_model_name}", api_key)

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        return _models_response(served_model_name, {"max_model_len": single.context_window})

    @app.post("/v1/completions", response_model=None)
    def completions(body: CompletionRequest) -> JSONResponse | StreamingResponse:
        try:
            if body.n != 1:
                raise ValueError("n must be 1")
            prompt_ids = single.prompt_ids(body.prompt)
            top_k = body.top_k if body.top_k is not None and body.top_k > 0 else None  # vLLM: -1 = off
            sampling = SamplingParams(temperature=body.temperature, top_p=body.top_p, top_k=top_k, seed=body.seed)
            stops = tuple(s for s in ([body.stop] if isinstance(body.stop, str) else body.stop or ()) if s)
            pieces = single.complete(prompt_ids, body.max_tokens, sampling, stops)
            first = next(pieces)  # validation and the first token happen here, so errors still get a status code
        except (ValueError, ValidationError) as exc:
            return _error_response(400, str(exc), "invalid_request_error")
        completion_id = f"cmpl-{uuid.uuid4().hex}"
        base = {"id": completion_id, "object": "text_completion", "created": int(time.time())}
        base["model"] = served_model_name
        with_ids = body.return_token_ids and report_token_ids

        def choice(piece: CompletionPiece, token_ids: list[int]) -> dict[str, Any]:
            data: dict[str, Any] = {"index": 0, "text": piece.text, "logprobs": None}
            data.update(finish_reason=piece.finish_reason, stop_reason=piece.stop_reason)
            if with_ids:
                data["token_ids"] = token_ids
            return data

        def all_pieces() -> Iterator[CompletionPiece]:
            yield first
            yield from pieces

        if body.stream:

            def events() -> Iterator[str]:
                for piece in all_pieces():
                    yield _sse({**base, "choices": [choice(piece, piece.token_ids)]})
                yield _SSE_DONE

            return StreamingResponse(events(), media_type="text/event-stream")
        collected = list(all_pieces())
        last = collected[-1]
        whole = CompletionPiece([], "".join(p.text for p in collected), last.finish_reason, last.stop_reason)
        token_ids = [t for p in collected for t in p.token_ids]
        usage = {"prompt_tokens": len(prompt_ids), "completion_tokens": len(token_ids)}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        return JSONResponse({**base, "choices": [choice(whole, token_ids)], "usage": usage})

    return app


def run_server(app: FastAPI, host: str = "127.0.0.1", port: int = 8000) -> None:
    """Serves ``app`` until interrupted."""
    import uvicorn

    uvicorn.run(app, host=host, port=port, log_level="info")
