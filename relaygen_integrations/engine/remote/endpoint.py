"""One OpenAI-compatible completion server, seen from the remote backend.

The requests go through the ``openai`` SDK's typed ``completions`` and ``models`` resources, over the backend's own
``httpx`` client (its connection pool, timeout and API key): the SDK retries connection errors, timeouts, 408, 409,
429 and 5xx with exponential backoff (honouring the server's ``Retry-After``), parses the server-sent events and
types the server's errors. Here those errors become :class:`EndpointError` naming the URL and the way out, and a
streamed completion becomes token-id batches (restoring the text a server-side stop dropped). vLLM's and llama.cpp's
own fields (``return_token_ids``, ``prompt_logprobs``, ``top_k``; ``token_ids``, ``stop_reason`` in the answer) ride
in the SDK's ``extra_body`` and in its models' extra fields.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol, TypeVar

import httpx
import openai
from openai.types import Completion
from pydantic import BaseModel
from transformers import PreTrainedTokenizerBase

from ..core.spans import ModelRole
from ..core.verify import TokenScore

_T = TypeVar("_T")
_NOT_REPORTED = object()
# The body fields the SDK's ``completions.create`` takes by name; every other one (vLLM's ``return_token_ids``,
# ``prompt_logprobs``, ``top_k``) goes in ``extra_body``, which the SDK merges into the JSON it sends.
_TYPED_FIELDS = frozenset({"model", "prompt", "max_tokens", "temperature", "top_p", "seed", "stop"})
_OMIT = openai.Omit()
# The SDK's own headers are meant for api.openai.com: its key as Authorization, OpenAI-Organization / -Project from
# OPENAI_ORG_ID / OPENAI_PROJECT_ID. None of them may reach a self-hosted server: the caller's key, if any, is a
# default header of the backend's httpx client, which the SDK's requests carry.
_CLIENT_HEADERS: dict[str, Any] = {"Authorization": _OMIT, "OpenAI-Organization": _OMIT, "OpenAI-Project": _OMIT}
# Per request as well: the SDK refuses to send a request without credentials unless Authorization is omitted there.
_REQUEST_HEADERS: dict[str, Any] = {"Authorization": _OMIT}
_UNUSED_KEY = "unused"  # the SDK wants a key at construction; with Authorization omitted it is never sent


class EndpointError(RuntimeError):
    """A completion server could not be reached or answered with an error. ``url`` names the server; ``status`` is
    the HTTP status of its answer (None when there was none)."""

    def __init__(self, url: str, message: str, status: int | None = None) -> None:
        super().__init__(f"{url}: {message}")
        self.url = url
        self.status = status


class _ErrorResponse(Protocol):
    """What an error answer gives (``httpx.Response``; the SDK hands it over in ``APIStatusError.response``)."""

    reason_phrase: str

    @property
    def text(self) -> str: ...

    def json(self) -> Any: ...


def _error_message(error: Any) -> str:
    if isinstance(error, Mapping):
        return str(error.get("message") or error.get("detail") or json.dumps(dict(error))[:500])
    return str(error)[:500]


def _error_detail(response: _ErrorResponse) -> str:
    """The server's own explanation of an error response (OpenAI's {"error": {"message": ...}}, FastAPI's
    {"detail": ...}, or the raw text); the SDK has read the body before raising."""
    try:
        data = response.json()
    except ValueError:
        return response.text.strip()[:500] or response.reason_phrase
    if isinstance(data, Mapping):
        return _error_message(data.get("error") or data.get("detail") or data)
    return str(data)[:500]


def _way_out(status: int, attempts: int) -> str:
    """What to do about an HTTP error, appended to the server's message. Nothing for 400 / 422: the server's message
    names the field, and ``refused_stop_limit`` / ``refuses_token_prompts`` read it (no words of ours in between)."""
    if status in (401, 403):
        return " (check api_key: it is sent as 'Authorization: Bearer KEY')"
    if status == 404:
        return " (check the base URL, which ends in /v1 for vLLM and relaygen serve, and large_model / small_model)"
    if status in (408, 409, 429) or status >= 500:
        return f" (after {attempts} attempt(s); raise retries=, or lighten the server's load)"
    return ""


def _reason(error: BaseException) -> str:
    """The transport error behind an SDK error (``ConnectError: ...``): the SDK's own text says only 'Connection
    error.'; newer SDKs wrap the httpx error mid-stream too, older ones let it through."""
    cause = error.__cause__ if isinstance(error, openai.APIConnectionError) and error.__cause__ else error
    return f"{type(cause).__name__}: {cause}" if str(cause) else type(cause).__name__


def _fields(item: object) -> dict[str, Any] | None:
    """An SDK object as the JSON the server sent: the fields it set, vLLM's extra ones included, and not the ones the
    SDK's model declares but the server left out (whether ``stop_reason`` was sent at all matters); None if the
    server sent something other than an object."""
    if isinstance(item, BaseModel):
        return item.model_dump(exclude_unset=True, warnings=False)
    return dict(item) if isinstance(item, Mapping) else None


def refuses_token_prompts(error: EndpointError) -> bool:
    """Whether a server refused a request because its prompt is a list of token ids (llama-cpp-python's server
    validates ``prompt`` as a string and answers HTTP 500: "('body', 'prompt', 'str') ... valid string")."""
    return error.status in (400, 422, 500) and bool(
        re.search(r"'prompt'[^\n]*(valid string|string_type)|prompt[^\n]*must be a string", str(error))
    )


def refused_stop_limit(error: EndpointError) -> int | None:
    """How many stop strings a server takes, read off its refusal of a request with too many (vLLM caps them at
    ``VLLM_MAX_STOP_STRINGS``, 4 by default: "List should have at most 4 items" at ``body.stop``); ``None`` when
    the refusal is about something else. A refusal naming ``stop`` without a number means none."""
    message = str(error)
    if error.status != 400 or not re.search(r"\bstop\b", message):
        return None
    found = re.search(r"at most (\d+) item|'max_length': (\d+)", message)
    return int(next(g for g in found.groups() if g)) if found else 0


class Endpoint:
    """One OpenAI-compatible server (base URL such as ``http://127.0.0.1:8000/v1``) writing for one role.

    ``client`` is the backend's ``httpx`` client, shared by both endpoints (one connection pool): its timeout bounds
    connecting and every wait for the next chunk, and its headers carry the API key. ``retries`` is how many times
    the SDK retries a request that found no server, timed out, or got a 408, 409, 429 or 5xx answer."""

    def __init__(self, role: ModelRole, base_url: str, client: httpx.Client, model: str | None, retries: int) -> None:
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ValueError(
                f"the {role} endpoint must be an http(s) URL such as http://127.0.0.1:8000/v1, not {base_url!r}"
            )
        self.role = role
        self.base_url = base_url.rstrip("/")
        self.client = client
        self.retries = retries
        # The base URL and key are given, so the SDK reads neither OPENAI_BASE_URL nor OPENAI_API_KEY.
        self.api = openai.OpenAI(
            base_url=self.base_url,
            api_key=_UNUSED_KEY,
            http_client=client,
            max_retries=retries,
            timeout=client.timeout,  # else the SDK's own 10-minute default would replace the client's
            default_headers=_CLIENT_HEADERS,
        )
        self._model = model
        self._model_lock = threading.Lock()
        # Whether the server streams the generated ids (vLLM's return_token_ids); None until its first answer.
        self.streams_token_ids: bool | None = None
        # How many stop strings the server takes (None: no cap seen); learnt from a refusal (``backend.py``).
        self.max_stop_strings: int | None = None
        # Whether the server takes token-id prompts; learnt from a refusal (``backend.py``).
        self.takes_token_prompts = True
        # Whether the server scores prompts (vLLM's prompt_logprobs, for verified relay); None until asked.
        self.scores_prompts: bool | None = None

    @property
    def completions_url(self) -> str:
        return f"{self.base_url}/completions"

    def model_name(self) -> str:
        """The ``model`` every request names: given, or the first model the server's ``GET /models`` lists."""
        with self._model_lock:
            if self._model is None:
                url = f"{self.base_url}/models"
                page = self._call(url, lambda: self.api.models.list(extra_headers=_REQUEST_HEADERS))
                try:
                    self._model = str(page.data[0].id)
                except (AttributeError, IndexError, TypeError) as exc:
                    raise EndpointError(url, f"lists no model ({exc!r}); pass the model name explicitly") from exc
            return self._model

    def complete(self, body: Mapping[str, Any]) -> Completion:
        """One completion request, answered whole."""
        return self._call(self.completions_url, lambda: self.api.completions.create(**_params(body), stream=False))

    def stream(self, body: Mapping[str, Any]) -> openai.Stream[Completion]:
        """One streamed completion request: returned once the server has answered with a success status (the SDK's
        retries are over by then); its chunks are read by :class:`CompletionStream`."""
        return self._call(self.completions_url, lambda: self.api.completions.create(**_params(body), stream=True))

    def score(self, ids: Sequence[int], first: int) -> list[TokenScore] | None:
        """The model's score of every token of ``ids`` from ``first`` on, from one request that asks for vLLM's
        ``prompt_logprobs`` (the top token's and the prompt token's own); None if the server does not return them."""
        body = {"model": self.model_name(), "prompt": list(ids), "max_tokens": 1, "temperature": 0.0,
                "prompt_logprobs": 1}  # fmt: skip
        try:
            answer = self.complete(body)
        except EndpointError as error:
            if not refuses_token_prompts(error):
                raise
            # Scores must be of these very ids: a server that re-tokenizes a text prompt cannot give them.
            self.takes_token_prompts = self.scores_prompts = False
            return None
        try:
            choice = _fields(answer.choices[0])
            entries = choice.get("prompt_logprobs") if choice is not None else None
        except (AttributeError, IndexError, TypeError) as exc:
            raise EndpointError(self.completions_url, f"sent an answer that is not a completion ({exc!r})") from exc
        self.scores_prompts = isinstance(entries, list) and len(entries) == len(ids)
        if not self.scores_prompts:
            return None
        assert isinstance(entries, list)
        scores = []
        for position in range(first, len(ids)):
            entry = entries[position]
            try:
                own = entry[str(ids[position])]
                top = max(entry.values(), key=lambda item: item["logprob"])
                scores.append(TokenScore(float(own["logprob"]), float(top["logprob"]), int(own["rank"]) == 1))
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                raise EndpointError(
                    self.completions_url, f"sent prompt_logprobs without token {ids[position]}'s score ({exc!r})"
                ) from exc
        return scores

    def _call(self, url: str, request: Callable[[], _T]) -> _T:
        """Runs one SDK request, its retries included, and turns what it raises into an :class:`EndpointError`
        naming ``url``: a 4xx other than 408, 409 and 429 is the request's own fault (key, model name, prompt
        length), which the SDK raises at once."""
        try:
            return request()
        except openai.APIStatusError as exc:
            status = exc.status_code
            message = f"HTTP {status}: {_error_detail(exc.response)}{_way_out(status, self.retries + 1)}"
            raise EndpointError(url, message, status) from exc
        except openai.APIConnectionError as exc:  # APITimeoutError too
            raise EndpointError(
                url, f"no answer after {self.retries + 1} attempt(s) ({_reason(exc)}); is the server up?"
            ) from exc
        except openai.OpenAIError as exc:  # e.g. an answer the SDK could not read
            raise EndpointError(url, f"{type(exc).__name__}: {exc}") from exc


def _params(body: Mapping[str, Any]) -> dict[str, Any]:
    """``completions.create``'s arguments for a request body: the OpenAI fields by name, the others in
    ``extra_body``; ``stream`` is the caller's choice of method, not a body field."""
    params = {key: value for key, value in body.items() if key in _TYPED_FIELDS}
    extra = {key: value for key, value in body.items() if key not in _TYPED_FIELDS and key != "stream"}
    return {**params, "extra_body": extra or None, "extra_headers": _REQUEST_HEADERS}


class CompletionStream:
    """One streamed completion request; :meth:`batches` yields the generated token ids chunk by chunk.

    After the stream is exhausted, ``model_ended`` tells an end of the model's own (eos) from a stop string or
    ``max_tokens``.
    """

    def __init__(
        self,
        endpoint: Endpoint,
        events: openai.Stream[Completion],
        tokenizer: PreTrainedTokenizerBase,
        end_ids: frozenset[int],
        stops: Sequence[str],
        user_stops: Sequence[str],
    ) -> None:
        self.endpoint = endpoint
        self.events = events
        self.tokenizer = tokenizer
        self.end_ids = end_ids
        self.stops = tuple(stops)
        self.user_stops = tuple(user_stops)
        self.server_text = ""  # the text the server sent (without a matched stop string)
        self.ids: list[int] = []  # the ids yielded so far
        self.finish_reason: str | None = None
        self.model_ended = False

    def close(self) -> None:
        """Closes the HTTP response: the server sees the client leave and aborts the request."""
        self.events.close()

    def batches(self) -> Iterator[list[int]]:
        url = self.endpoint.completions_url
        try:
            for chunk in self.events:  # the SDK ends the iteration at "data: [DONE]"
                data = _fields(chunk)
                if data is None:
                    raise EndpointError(url, f"sent a stream chunk that is not an object: {str(chunk)[:200]!r}")
                choices = data.get("choices") or []
                if not choices:
                    continue  # e.g. a usage-only chunk
                batch = self._batch(choices[0])
                self.ids.extend(batch)
                if batch:
                    yield batch
        except json.JSONDecodeError as exc:
            raise EndpointError(url, f"sent a stream chunk that is not JSON: {exc.doc[:200]!r}") from exc
        except (openai.APITimeoutError, httpx.TimeoutException) as exc:
            timeout = self.endpoint.client.timeout.read
            raise EndpointError(
                url, f"sent nothing for {timeout} s ({_reason(exc)}); the request was abandoned (raise timeout= for "
                "a slower server)",
            ) from exc  # fmt: skip
        except (openai.APIConnectionError, httpx.TransportError) as exc:
            # Not retried: the tokens already streamed went through the policy, and a new request from the sequence
            # so far is the engine's to make (a new generation), not a silent replay here.
            raise EndpointError(url, f"the stream broke off ({_reason(exc)})") from exc
        except openai.APIError as exc:
            # The SDK raises this for a chunk that carries {"error": ...}: how vLLM fails in the middle of a stream.
            detail = exc.body if exc.body is not None else exc.message
            raise EndpointError(url, f"failed during generation: {_error_message(detail)}") from exc

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False)) if text else []

    def _batch(self, choice: Mapping[str, Any]) -> list[int]:
        text = choice.get("text") or ""
        token_ids = choice.get("token_ids")
        batch = [int(t) for t in token_ids] if token_ids is not None else self._encode(text)
        if token_ids or text:
            self.endpoint.streams_token_ids = token_ids is not None
        self.server_text += text
        finish = choice.get("finish_reason")
        if finish is None:
            return batch
        self.finish_reason = str(finish)
        if finish != "stop":
            return batch
        matched = next((choice[key] for key in ("stop_reason", "matched_stop") if key in choice), _NOT_REPORTED)
        if isinstance(matched, str):
            # A stop string ended the request and the server dropped its text: put it back for the policy to judge.
            # With ids the server usually sent its tokens anyway (vLLM does); only what is missing is re-appended.
            decoded = self.tokenizer.decode(self.ids + batch, skip_special_tokens=False)
            if token_ids is None or not decoded[len(self.server_text) :].startswith(matched):
                # Tokenized here, a policy stop leaves out its trailing whitespace: that belongs to the model's next
                # token (" So" + " the"), which the same model then writes itself instead of a stray " " token. A
                # caller's stop ends the generation, so it is restored whole.
                batch += self._encode(matched if matched in self.user_stops else matched.rstrip())
            return batch
        if matched is _NOT_REPORTED and self.stops:
            raise EndpointError(
                self.endpoint.completions_url,
                "ended with finish_reason 'stop' but does not say which stop string matched (no stop_reason or "
                "matched_stop), so the text it dropped cannot be restored; use server_stops=False with this server",
            )
        # The model's own end (eos, or a stop token id): drop the end token if the server included it.
        while batch and batch[-1] in self.end_ids:
            batch.pop()
        self.model_ended = True
        return batch
