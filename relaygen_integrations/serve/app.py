"""OpenAI-compatible HTTP servers (FastAPI): ``relaygen serve`` (here) and ``relaygen serve --single``
(``serve/single.py``).

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

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ConfigDict, Field, ValidationError

from ..chat.relay_chat import ChatDelta, ChatRequest, PreparedTurn, astream_chat, prepare_chat, prepare_turn
from ..chat.setting_fields import settings_model
from ..chat.tool_calls import ToolCall
from ..engine.core.settings import GenerationSettings, SettingsError, merge_settings
from ..engine.core.spans import RelayResult, TokenLogprob
from ..engine.engine import RelayEngine
from .http import (
    CLIENT_CLOSED_REQUEST,
    LOOPBACK_HOSTS,
    SSE_DONE,
    ClientDisconnected,
    InvalidBody,
    body_problems,
    error_kind,
    error_response,
    models_response,
    new_app,
    run_server,
    sse,
    unless_disconnected,
)
from .single import create_single_app

__all__ = ["LOOPBACK_HOSTS", "create_app", "create_single_app", "run_server"]

_FINISH_REASONS = {"stop": "stop", "stop_sequence": "stop", "length": "length", "cancelled": "stop"}
# The most tokens one request may ask for unless the server is started with another cap (--max-tokens-cap): without
# a cap, a max_tokens of 10**30 runs to the end of the context window.
DEFAULT_MAX_TOKENS_CAP = 4096  # the CLI's --max-tokens-cap default repeats it (cli/serve.py)


# -- relay chat completions -------------------------------------------------------------------------------------------
# Where the request's setting fields differ from GenerationSettings, and why; every other setting is a request field
# of its own name and type, default None (the engine's default applies), its value checked by merge_settings alone so
# a bad one is the engine's SettingsError naming the setting (a 400).
OPENAI_NAMED = frozenset({"max_new_tokens"})  # OpenAI's max_tokens / max_completion_tokens, capped: fields below
NOT_OVER_HTTP = frozenset(
    {
        "cues",  # a profile path would make the server read files of its own disk for any client
        "reprefill_segments",  # a benchmark baseline (relaygen bench), not a way to serve
    }
)
_JSON_TYPES: dict[str, dict[str, Any]] = {
    "stop": {"annotation": str | list[str] | None},  # OpenAI's: one string or a list
    "verify": {"annotation": str | None},  # the rule's spec string ("greedy", "prob:0.05"); the engine parses it
}
RequestSettings = settings_model(
    "RequestSettings", exclude=OPENAI_NAMED | NOT_OVER_HTTP, differ=_JSON_TYPES, bounds=False, default=None
)


class ChatCompletionRequest(RequestSettings):  # type: ignore[misc,valid-type]
    """The OpenAI chat-completions fields the relay understands; other OpenAI fields are accepted and ignored. The
    generation settings (``temperature``, ``top_p``, ``stop``, ``mode``, ``speculative``, relaygen's ``verify``, ...)
    are inherited from :data:`RequestSettings`, built from GenerationSettings."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    messages: list[Any]  # each message is checked by the engine (validate_messages), which names what is wrong
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    stream: bool = False
    n: int = 1
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None  # under a grammar: one call an answer unless true (small models repeat one)
    chat_template_kwargs: dict[str, Any] | None = None


def _chat_settings(body: ChatCompletionRequest, max_tokens_cap: int) -> GenerationSettings:
    """Engine settings: only what the request gives, so the engine's defaults (greedy, 256 tokens) apply otherwise;
    ``max_tokens`` above the server's cap is refused, naming both."""
    if body.n != 1:
        raise SettingsError(f"n must be 1: one relay generation per request, got n={body.n}", "n")
    max_tokens = body.max_completion_tokens or body.max_tokens
    if max_tokens is not None and max_tokens > max_tokens_cap:
        field = "max_completion_tokens" if body.max_completion_tokens else "max_tokens"
        raise SettingsError(
            f"{field}={max_tokens} is more than this server's cap of {max_tokens_cap} tokens per request "
            "(relaygen serve --max-tokens-cap)",
            field,
        )
    if max_tokens is None and GenerationSettings().max_new_tokens > max_tokens_cap:
        max_tokens = max_tokens_cap
    given = {name: getattr(body, name) for name in RequestSettings.model_fields}
    if given.get("top_k") is not None and given["top_k"] <= 0:  # vLLM's "-1 = off" convention
        given["top_k"] = None
    given["stop"] = given.get("stop") or None  # OpenAI clients send "" or [] for none
    settings = {key: value for key, value in given.items() if value is not None}
    return merge_settings(settings, {"max_new_tokens": max_tokens} if max_tokens is not None else None)


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


def _logprobs_json(entries: Sequence[TokenLogprob] | None) -> dict[str, Any] | None:
    """OpenAI's ``choices[0].logprobs``: ``{"content": [...]}`` (each entry also names the model that wrote the
    token), or null when the request did not ask for them."""
    return None if entries is None else {"content": [entry.to_openai() for entry in entries]}


def _reasoning_fields(reasoning: str) -> dict[str, str]:
    """A reasoning model's thinking under both names clients read: ``reasoning`` (vLLM >= 0.17, OpenRouter) and
    ``reasoning_content`` (DeepSeek, vLLM before 0.17, LangChain's ChatOpenAI-compatible readers)."""
    return {"reasoning_content": reasoning, "reasoning": reasoning}


def _finish_reason(delta: ChatDelta) -> str:
    assert delta.result is not None and delta.parsed is not None
    return "tool_calls" if delta.parsed.tool_calls else _FINISH_REASONS[delta.result.finish_reason]


# OpenAI chat-completions fields this server cannot honour: refused with a 400 naming the field unless the request
# gives the value that asks for nothing (docs/reliability.md lists every field and what the server does with it).
_NEUTRAL: dict[str, tuple[tuple[Any, ...], str]] = {
    "frequency_penalty": ((None, 0, 0.0), "the relay samples without repetition penalties"),
    "presence_penalty": ((None, 0, 0.0), "the relay samples without repetition penalties"),
    "logit_bias": ((None, {}), "the relay does not bias logits"),
    "modalities": ((None, ["text"]), "this model pair writes text only"),
    "audio": ((None,), "this model pair writes text only"),
    "prediction": ((None,), "predicted outputs are not supported"),
    "web_search_options": ((None,), "this server has no web search"),
    "functions": ((None,), "the deprecated functions API is not supported: send tools"),
    "function_call": ((None,), "the deprecated functions API is not supported: send tool_choice"),
    "store": ((None, False), "this server stores nothing"),
    "reasoning_effort": ((None,), "the pair's reasoning length is not configurable; use max_tokens"),
    "verbosity": ((None,), "not configurable on this model pair"),
}


def refuse_unhonoured(fields: Mapping[str, Any]) -> None:
    """A 400 for the first OpenAI field in ``fields`` that asks for something this server does not do."""
    for name, (neutral, why) in _NEUTRAL.items():
        value = fields.get(name)
        if not any((value == n and type(value) is type(n)) or value is n for n in neutral):
            raise SettingsError(f"{name}={json.dumps(value)[:80]} is not supported: {why}", name)


def parse_request(
    engine: RelayEngine, raw: bytes, max_tokens_cap: int
) -> tuple[ChatCompletionRequest, ChatRequest, PreparedTurn]:
    """A request body parsed, validated, rendered, tokenized and planned: everything before model work, and all of it
    CPU work, which ``create_app`` runs off the event loop (a 20,000-message body takes a second)."""
    try:
        # Python's json, as FastAPI parses bodies: it keeps a lone surrogate ("\ud83d"), which the message checks
        # then name where it is, where pydantic's own JSON parser would refuse the whole body.
        fields = json.loads(raw)
        body = ChatCompletionRequest.model_validate(fields)
    except json.JSONDecodeError as exc:
        raise InvalidBody(f"the body is not JSON: {exc}") from None
    except ValidationError as exc:
        raise InvalidBody(body_problems(exc.errors())) from None
    refuse_unhonoured(fields)
    request = prepare_chat(
        body.messages,
        _chat_settings(body, max_tokens_cap),
        tools=body.tools,
        tool_choice=body.tool_choice,
        chat_template_kwargs=body.chat_template_kwargs,
        response_format=body.response_format,
        parallel_tool_calls=bool(body.parallel_tool_calls),
    )
    return body, request, prepare_turn(engine, request)


def create_app(
    engine: RelayEngine,
    served_model_name: str = "relaygen",
    api_key: str | None = None,
    max_tokens_cap: int = DEFAULT_MAX_TOKENS_CAP,
) -> FastAPI:
    """An OpenAI-compatible chat server over ``engine`` (local or ``RelayEngine.from_endpoints``). A request may ask
    for at most ``max_tokens_cap`` new tokens; a client that disconnects stops its generation within one step."""
    if isinstance(max_tokens_cap, bool) or not isinstance(max_tokens_cap, int) or max_tokens_cap < 1:
        raise ValueError(f"max_tokens_cap must be a positive number of tokens, got {max_tokens_cap!r}")
    app = new_app("relaygen", api_key)
    # One thread prepares requests, one after another: a request's parsing holds the GIL in stretches of ~30 ms at
    # most (pydantic on a 1 MB body), so the event loop answers polls between them; more threads would take turns
    # with it and lengthen its waits. The engine runs one generation at a time anyway.
    preparing = ThreadPoolExecutor(max_workers=1, thread_name_prefix="relaygen-prepare")
    app.router.on_shutdown.append(lambda: preparing.shutdown(wait=False, cancel_futures=True))

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        return models_response(
            served_model_name, {"relaygen": {"large": engine.large_name, "small": engine.small_name}}
        )

    # The body is read raw and parsed by ``parse_request`` on the preparing thread (FastAPI would parse it on the
    # event loop); its schema is still the documented one.
    schema = {"requestBody": {"content": {"application/json": {"schema": ChatCompletionRequest.model_json_schema()}}}}

    @app.post("/v1/chat/completions", response_model=None, openapi_extra=schema)
    async def chat_completions(http: Request) -> Response:
        try:
            raw = await http.body()
            body, request, turn = await asyncio.get_running_loop().run_in_executor(
                preparing, parse_request, engine, raw, max_tokens_cap
            )
            deltas = astream_chat(engine, request, turn)
            # The first delta arrives once the request is validated and the first token is written: an error up to
            # here is still a proper HTTP status, not an error inside a 200 stream.
            first = await unless_disconnected(deltas.__anext__(), http)
            if not body.stream:
                # Nothing is sent until the end, so only the connection tells whether anyone still waits: a client
                # that left cancels the generation (it stops within one step) instead of keeping the engine busy.
                final = await unless_disconnected(_last_delta(first, deltas), http)
        except ClientDisconnected:
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        except Exception as exc:
            status, kind = error_kind(exc)
            return error_response(status, str(exc), kind)
        completion_id = f"chatcmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        if body.stream:
            # A streaming client that leaves is noticed by the response itself, which cancels the generator.
            return StreamingResponse(
                _chatsse(first, deltas, completion_id, created, served_model_name), media_type="text/event-stream"
            )
        assert final.result is not None and final.parsed is not None
        parsed, result = final.parsed, final.result
        message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
        if parsed.reasoning is not None:
            message.update(_reasoning_fields(parsed.reasoning))
        if parsed.tool_calls:
            message["tool_calls"] = [_tool_call_json(call) for call in parsed.tool_calls]
            message["content"] = parsed.content or None
        return JSONResponse(
            {
                "id": completion_id,
                "object": "chat.completion",
                "created": created,
                "model": served_model_name,
                "choices": [
                    {
                        "index": 0,
                        "message": message,
                        "logprobs": _logprobs_json(result.logprobs),
                        "finish_reason": _finish_reason(final),
                    }
                ],
                "usage": _chat_usage(result),
                "relaygen": result.relay_metadata(),
            }
        )

    return app


async def _last_delta(first: ChatDelta, deltas: AsyncIterator[ChatDelta]) -> ChatDelta:
    final = first
    async for delta in deltas:
        final = delta
    return final


async def _chatsse(
    first: ChatDelta, deltas: AsyncIterator[ChatDelta], completion_id: str, created: int, model: str
) -> AsyncIterator[str]:
    def chunk(
        delta: Mapping[str, Any], finish: str | None = None, logprobs: Sequence[TokenLogprob] = (), **extra: Any
    ) -> str:
        choice = {
            "index": 0,
            "delta": dict(delta),
            "logprobs": _logprobs_json(logprobs or None),
            "finish_reason": finish,
        }
        base = {"id": completion_id, "object": "chat.completion.chunk", "created": created, "model": model}
        return sse({**base, "choices": [choice], **extra})

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
                call = [_tool_call_json(delta.tool_call, tool_index)]
                yield chunk({"tool_calls": call}, logprobs=delta.logprobs, relaygen=where)
                tool_index += 1
            elif delta.reasoning:
                yield chunk(_reasoning_fields(delta.reasoning), logprobs=delta.logprobs, relaygen=where)
            elif delta.text or delta.logprobs:
                yield chunk({"content": delta.text} if delta.text else {}, logprobs=delta.logprobs, relaygen=where)
    except Exception as exc:  # the 200 status is sent already: report in the stream, as vLLM does
        status, kind = error_kind(exc)
        yield sse({"error": {"message": str(exc), "type": kind, "code": status}})
    yield SSE_DONE


# -- one model: plain completions -----------------------------------------------------------------------------------
