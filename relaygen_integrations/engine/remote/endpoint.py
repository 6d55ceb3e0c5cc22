"""One OpenAI-compatible completion server, seen from the remote backend: requests with retries and backoff, and
a streamed completion turned into token-id batches (restoring the text a server-side stop dropped)."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import httpx
from transformers import PreTrainedTokenizerBase

from ..core.spans import ModelRole
from ..core.verify import TokenScore

BACKOFF_SECONDS = 0.25  # first retry after 0.25 s, then 0.5 s, 1 s, ...
_NOT_REPORTED = object()


class EndpointError(RuntimeError):
    """A completion server could not be reached or answered with an error. ``url`` names the server."""

    def __init__(self, url: str, message: str, status: int | None = None) -> None:
        super().__init__(f"{url}: {message}")
        self.url = url
        self.status = status


def _error_message(error: Any) -> str:
    if isinstance(error, Mapping):
        return str(error.get("message") or error.get("detail") or json.dumps(dict(error))[:500])
    return str(error)[:500]


def _error_detail(response: httpx.Response) -> str:
    """The server's own explanation of an error response (OpenAI's {"error": {"message": ...}}, FastAPI's
    {"detail": ...}, or the raw text)."""
    try:
        response.read()
    except httpx.HTTPError:
        return response.reason_phrase
    finally:
        response.close()
    try:
        data = response.json()
    except ValueError:
        return response.text.strip()[:500] or response.reason_phrase
    if isinstance(data, Mapping):
        return _error_message(data.get("error") or data.get("detail") or data)
    return str(data)[:500]


def _sse_data(lines: Iterator[str]) -> Iterator[str]:
    """The data of each server-sent event: its ``data:`` lines joined; comments and other fields are ignored."""
    data: list[str] = []
    for line in lines:
        if not line:
            if data:
                yield "\n".join(data)
                data = []
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
    if data:
        yield "\n".join(data)


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
    """One OpenAI-compatible server (base URL such as ``http://127.0.0.1:8000/v1``) writing for one role."""

    def __init__(self, role: ModelRole, base_url: str, client: httpx.Client, model: str | None, retries: int) -> None:
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ValueError(
                f"the {role} endpoint must be an http(s) URL such as http://127.0.0.1:8000/v1, not {base_url!r}"
            )
        self.role = role
        self.base_url = base_url.rstrip("/")
        self.client = client
        self.retries = retries
        self._model = model
        self._model_lock = threading.Lock()
        # Whether the server streams the generated ids (vLLM's return_token_ids); None until its first answer.
        self.streams_token_ids: bool | None = None
        # How many stop strings the server takes (None: no cap seen); learnt from a refusal (``remote.py``).
        self.max_stop_strings: int | None = None
        # Whether the server takes token-id prompts; learnt from a refusal (``remote.py``).
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
                response = self.send("GET", url)
                try:
                    self._model = str(response.json()["data"][0]["id"])
                except (ValueError, KeyError, IndexError, TypeError) as exc:
                    raise EndpointError(url, f"lists no model ({exc!r}); pass the model name explicitly") from exc
            return self._model

    def score(self, ids: Sequence[int], first: int) -> list[TokenScore] | None:
        """The model's score of every token of ``ids`` from ``first`` on, from one request that asks for vLLM's
        ``prompt_logprobs`` (the top token's and the prompt token's own); None if the server does not return them."""
        body = {"model": self.model_name(), "prompt": list(ids), "max_tokens": 1, "temperature": 0.0,
                "prompt_logprobs": 1}  # fmt: skip
        try:
            response = self.send("POST", self.completions_url, body)
        except EndpointError as error:
            if not refuses_token_prompts(error):
                raise
            # Scores must be of these very ids: a server that re-tokenizes a text prompt cannot give them.
            self.takes_token_prompts = self.scores_prompts = False
            return None
        try:
            entries = response.json()["choices"][0].get("prompt_logprobs")
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            raise EndpointError(self.completions_url, f"sent an answer that is not a completion ({exc!r})") from exc
        self.scores_prompts = isinstance(entries, list) and len(entries) == len(ids)
        if not self.scores_prompts:
            return None
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

    def send(
        self, method: str, url: str, body: Mapping[str, Any] | None = None, stream: bool = False
    ) -> httpx.Response:
        """One request; connection errors, timeouts, 5xx and 429 are retried with exponential backoff."""
        attempts = self.retries + 1
        error = EndpointError(url, "no attempt was made")
        for attempt in range(attempts):
            try:
                response = self.client.send(self.client.build_request(method, url, json=body), stream=stream)
            except httpx.TransportError as exc:
                reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                error = EndpointError(url, f"no answer after {attempt + 1} attempt(s) ({reason}); is the server up?")
            else:
                if response.status_code < 400:
                    return response
                status = response.status_code
                error = EndpointError(url, f"HTTP {status}: {_error_detail(response)}", status)
                if status < 500 and status != 429:
                    raise error  # the request itself is refused (key, model name, prompt length): a retry cannot help
            if attempt + 1 < attempts:
                time.sleep(BACKOFF_SECONDS * 2**attempt)
        raise error


class CompletionStream:
    """One streamed completion request; :meth:`batches` yields the generated token ids chunk by chunk.

    After the stream is exhausted, ``model_ended`` tells an end of the model's own (eos) from a stop string or
    ``max_tokens``.
    """

    def __init__(
        self,
        endpoint: Endpoint,
        response: httpx.Response,
        tokenizer: PreTrainedTokenizerBase,
        end_ids: frozenset[int],
        stops: Sequence[str],
        user_stops: Sequence[str],
    ) -> None:
        self.endpoint = endpoint
        self.response = response
        self.tokenizer = tokenizer
        self.end_ids = end_ids
        self.stops = tuple(stops)
        self.user_stops = tuple(user_stops)
        self.server_text = ""  # the text the server sent (without a matched stop string)
        self.ids: list[int] = []  # the ids yielded so far
        self.finish_reason: str | None = None
        self.model_ended = False

    def close(self) -> None:
        self.response.close()

    def batches(self) -> Iterator[list[int]]:
        url = self.endpoint.completions_url
        try:
            for data in _sse_data(self.response.iter_lines()):
                if data.strip() == "[DONE]":
                    return
                try:
                    chunk = json.loads(data)
                except json.JSONDecodeError as exc:
                    raise EndpointError(url, f"sent a stream chunk that is not JSON: {data[:200]!r}") from exc
                if not isinstance(chunk, dict):
                    raise EndpointError(url, f"sent a stream chunk that is not an object: {data[:200]!r}")
                if chunk.get("error"):
                    raise EndpointError(url, f"failed during generation: {_error_message(chunk['error'])}")
                choices = chunk.get("choices") or []
                if not choices:
                    continue  # e.g. a usage-only chunk
                batch = self._batch(choices[0])
                self.ids.extend(batch)
                if batch:
                    yield batch
        except httpx.TimeoutException as exc:
            raise EndpointError(
                url, f"sent nothing for too long ({type(exc).__name__}); the request was abandoned"
            ) from exc
        except httpx.TransportError as exc:
            raise EndpointError(url, f"the stream broke off ({type(exc).__name__}: {exc})") from exc

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
