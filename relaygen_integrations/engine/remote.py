"""Remote backend: the relay over two OpenAI-compatible completion servers (vLLM, SGLang, llama.cpp, or
``relaygen serve --single``), created with ``RelayEngine.from_endpoints``.

Design. The same :class:`RelayPolicy` decides token by token as in the local engine; only the source of the tokens
changes. Each segment is one streamed ``POST {base}/completions`` request to the writer's server, and every token it
streams goes through the same :class:`Transcript` as the local loop (exact text, policy, stop sequences, spans), so a
remote run with the same models gives the local engine's text and spans.

* Prompts are token ids (``"prompt": [ids...]``): the chat template is rendered here with the tokenizer, and the text
  so far is never re-tokenized. ``"return_token_ids": true`` asks the server for the ids it generates (vLLM >= 0.10.2,
  ``relaygen serve``); a server that sends only text gets each chunk's text tokenized on its own (servers stream one
  token per chunk, so this is nearly always the id the model wrote).
* When the policy says switch, the stream is closed (the server aborts that request) and the other endpoint gets a
  request whose prompt is the prompt plus everything written so far. Rollback: the look-ahead token is dropped before
  that request is built - exactly what the local engine does, with nothing to undo on a server.
* Server-side stops let a server end a segment at once instead of running ahead until the closed connection reaches
  it: the large endpoint gets the cues (after a space or newline; a bare cue word with the " " or "," that follows
  it, so the look-ahead token arrives in the same request), the small endpoint the sentence ends (". ", ".\\n", ...),
  both the reasoning-end marker. A server-side stop cannot check word boundaries ("So" in "Some") and drops the
  matched text, so it is only a hint: the matched text is put back (vLLM and ``relaygen serve`` return its ids
  anyway; otherwise the reported ``stop_reason`` / ``matched_stop`` string is re-appended without its trailing
  whitespace, which belongs to the model's next token), the policy decides on it, and if the policy did not act (a
  false match, or a look-ahead still missing) the same model continues with a new request. Correctness never depends
  on a server stop firing. Stops (the caller's too) go only to servers known to stream token ids - from an endpoint's
  second request on: with text alone, a stop's held-back and dropped text would break the one-chunk-one-token
  alignment the fallback relies on, and the client finds every stop itself anyway. ``server_stops=False``: none.
* The small endpoint's ``max_tokens`` is what is left of the policy's ``max_small_tokens`` cap, so that server stops
  exactly where the policy would hand back.

Reliability: connection errors, timeouts, 5xx and 429 are retried with exponential backoff; a 4xx, or retries used
up, raise :class:`EndpointError` naming the URL. A read waits at most ``timeout`` seconds for the next chunk, so
nothing hangs. The cancel flag is checked after every streamed chunk. Requests are not serialized (no engine lock):
concurrent generations have their own streams, and the servers batch them.

Usage: prefill / catch-up / reused-prefix tokens are counted as a server's prefix cache sees them within one
generation: a request re-sends the whole sequence, of which the part that endpoint already processed earlier is
``reused_prefix_tokens``, the rest is prompt (prefill) or the other model's tokens (catch-up). ``requests`` counts
round trips.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
from transformers import GenerationConfig, PreTrainedTokenizerBase

from .cues import CueSet, cue_core, resolve_cues
from .engine import GenerationError, GenerationPlan, RelayEngine
from .models import load_tokenizer, pick_dtype, reasoning_end_marker, resolve_reference
from .policy import PolicyConfig, RelayPolicy
from .spans import FinishReason, ModelRole, StreamEvent
from .transcript import Transcript

DEFAULT_TIMEOUT = 60.0
DEFAULT_RETRIES = 2
BACKOFF_SECONDS = 0.25  # first retry after 0.25 s, then 0.5 s, 1 s, ...
SENTENCE_END_STOPS = (". ", ".\n", "! ", "!\n", "? ", "?\n", "\n\n")
_FALLBACK_CONTEXT_WINDOW = 32768
_NOT_REPORTED = object()


class EndpointError(RuntimeError):
    """A completion server could not be reached or answered with an error. ``url`` names the server."""

    def __init__(self, url: str, message: str, status: int | None = None) -> None:
        super().__init__(f"{url}: {message}")
        self.url = url
        self.status = status


def cue_stop_strings(cues: CueSet) -> tuple[str, ...]:
    """Stop strings for the large endpoint: each cue after a space or a newline (so "Also " never stops the server
    for "so "), a punctuated cue as is ("So,"), a bare cue word followed by " " or "," (its look-ahead)."""
    forms: set[str] = set()
    for cue in cues.cues:
        forms.update((cue + " ", cue + ",") if cue == cue_core(cue) else (cue,))
    return tuple(sorted(left + form for form in forms for left in (" ", "\n")))


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


@dataclass
class _Traffic:
    """What one endpoint was sent during a generation, counted as its prefix cache sees it."""

    known: int = 0  # leading ids of the sequence this endpoint processed in an earlier request
    prefill: int = 0
    catchup: int = 0
    reused: int = 0

    def before_request(self, role: ModelRole, transcript: Transcript) -> None:
        reused = min(self.known, len(transcript.ids))
        self.reused += reused
        self.prefill += max(0, transcript.prompt_len - reused)
        start = max(0, reused - transcript.prompt_len)
        self.catchup += sum(1 for owner in transcript.owners[start:] if owner != role)

    def after_request(self, transcript: Transcript) -> None:
        self.known = len(transcript.ids)


def request_stops(policy: RelayPolicy, user_stops: Sequence[str], cue_stops: Sequence[str]) -> list[str]:
    """The stop strings of the next request: the caller's, plus the policy's for its current state."""
    stops = list(user_stops)
    if policy.mode == "relay" and policy.state != "answer":
        stops += cue_stops if policy.state == "large" else SENTENCE_END_STOPS
        stops += [m for m in (policy.config.reasoning_end, policy.config.answer_marker) if m]
    return list(dict.fromkeys(stops))


def remote_relay_stream(
    endpoints: Mapping[ModelRole, Endpoint],
    tokenizer: PreTrainedTokenizerBase,
    plan: GenerationPlan,
    policy: RelayPolicy,
    eos_ids: frozenset[int],
    cancel: threading.Event | None = None,
    server_stops: bool = True,
) -> Iterator[StreamEvent]:
    """The relay loop over endpoints: one streamed request per segment, each token fed to the policy as it arrives.
    Yields TextEvent/SwitchEvent as text becomes final, then one FinalEvent; closing it closes the open request."""
    transcript = Transcript(tokenizer, plan.prompt_ids, policy, plan.stop)
    traffic = {role: _Traffic() for role in endpoints}
    end_ids = eos_ids | frozenset(tokenizer.all_special_ids)
    cue_stops = cue_stop_strings(policy.cues)
    sampling = plan.sampling
    finish: FinishReason = "length"
    requests = idle_requests = 0
    stream: CompletionStream | None = None
    try:
        while finish == "length" and transcript.completion_tokens < plan.max_new_tokens:
            if cancel is not None and cancel.is_set():
                finish = "cancelled"
                break
            writer = policy.writer
            endpoint = endpoints[writer]
            max_tokens = plan.max_new_tokens - transcript.completion_tokens
            if policy.mode == "relay" and policy.state == "small_sentence":
                max_tokens = min(max_tokens, policy.config.max_small_tokens - policy.segment_tokens)
            # Stops go only to a server known to stream token ids. One that streams only text (or not yet known to
            # stream ids: its first request) gets none: a stop would drop text and hold back the text of tokens that
            # might match, so chunks would no longer be whole tokens and the ids re-tokenized from them could drift.
            # The client finds every stop itself and closes the stream, which is exact.
            with_stops = server_stops and endpoint.streams_token_ids
            stops = request_stops(policy, plan.stop, cue_stops) if with_stops else []
            body: dict[str, Any] = {
                "model": endpoint.model_name(),
                "prompt": transcript.ids,
                "max_tokens": max_tokens,
                "temperature": sampling.temperature,
                "top_p": sampling.top_p,
                "stream": True,
                "return_token_ids": True,
            }
            if sampling.top_k is not None:
                body["top_k"] = sampling.top_k
            if sampling.seed is not None:
                body["seed"] = sampling.seed + requests  # reproducible, and no two segments draw the same numbers
            if stops:
                body["stop"] = stops
            traffic[writer].before_request(writer, transcript)
            response = endpoint.send("POST", endpoint.completions_url, body, stream=True)
            stream = CompletionStream(endpoint, response, tokenizer, end_ids, stops, plan.stop)
            requests += 1
            received = 0
            decided = False
            for batch in stream.batches():
                for token in batch:
                    if transcript.completion_tokens >= plan.max_new_tokens:
                        break
                    if token in eos_ids:
                        finish = "stop"
                        break
                    received += 1
                    decision = transcript.push(token, writer)
                    if transcript.stop_at is not None:
                        finish = "stop_sequence"
                        break
                    yield from transcript.release()
                    if decision.action != "continue":
                        decided = True  # the rest of this request was written for the previous writer
                        break
                if decided or finish != "length" or transcript.completion_tokens >= plan.max_new_tokens:
                    break
                if cancel is not None and cancel.is_set():
                    finish = "cancelled"
                    break
            model_ended, stream_finish = stream.model_ended, stream.finish_reason
            traffic[writer].after_request(transcript)
            stream.close()
            stream = None
            if decided or finish != "length":
                continue
            if model_ended:
                finish = "stop"
            elif received == 0 and stream_finish is None:
                raise EndpointError(endpoint.completions_url, "ended the stream without a token or a finish_reason")
            elif received == 0:
                # Nothing written: after a stop whose restored text was only whitespace the model writes it again;
                # anything else (e.g. a full context on the server), or twice in a row, ends at "length".
                idle_requests += 1
                if stream_finish != "stop" or idle_requests > 1:
                    break
            else:
                idle_requests = 0
            # Otherwise a server-side stop the policy did not act on, or a look-ahead still missing: the same model
            # continues with a new request from the ids so far.
    finally:
        if stream is not None:
            stream.close()
    yield from transcript.finish(
        finish,
        large_prefill_tokens=traffic["large"].prefill if "large" in traffic else 0,
        small_prefill_tokens=traffic["small"].prefill if "small" in traffic else 0,
        large_catchup_tokens=traffic["large"].catchup if "large" in traffic else 0,
        small_catchup_tokens=traffic["small"].catchup if "small" in traffic else 0,
        reused_prefix_tokens=sum(t.reused for t in traffic.values()),
        requests=requests,
    )


def endpoint_eos_ids(tokenizer: PreTrainedTokenizerBase, reference: str | None) -> frozenset[int]:
    """The ids that end a generation: the tokenizer's eos, plus the generation config's (chat models list
    ``<|im_end|>`` there) when the tokenizer came from a directory or hub id that has one."""
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    if reference is not None:
        try:
            configured = GenerationConfig.from_pretrained(reference).eos_token_id
        except (OSError, ValueError):
            configured = None  # no generation_config.json next to the tokenizer: the tokenizer's eos is all we know
        if isinstance(configured, int):
            ids.add(configured)
        elif configured:
            ids.update(int(i) for i in configured)
    return frozenset(ids)


class RemoteRelayEngine(RelayEngine):
    """:class:`RelayEngine`'s interface (plan / run_plan / stream / generate / astream / agenerate / *_ids /
    encode_messages) over two OpenAI-compatible completion servers; see the module docstring for the design.

    Construct it with ``RelayEngine.from_endpoints``. ``runners`` maps each role to its :class:`Endpoint`.
    """

    runners: dict[ModelRole, Endpoint]  # type: ignore[assignment]  # the per-role backends, as plan() expects

    def __init__(
        self,
        large: str,
        small: str | None,
        tokenizer: str | PreTrainedTokenizerBase,
        cues: CueSet | str | list[str] = "auto",
        policy: PolicyConfig | Mapping[str, Any] | None = None,
        *,
        api_key: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        retries: int = DEFAULT_RETRIES,
        large_model: str | None = None,
        small_model: str | None = None,
        context_window: int | None = None,
        server_stops: bool = True,
        trust_remote_code: bool = False,
    ) -> None:
        # The base class's __init__ wants models; everything its methods read is set here instead.
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValueError(f"retries must be a non-negative integer, got {retries!r}")
        if context_window is not None and (not isinstance(context_window, int) or context_window <= 0):
            raise ValueError(f"context_window must be a positive integer, got {context_window!r}")
        reference: str | None = None
        if isinstance(tokenizer, str):
            reference, _pair = resolve_reference(tokenizer, "large", pick_dtype("auto"))
            tokenizer = load_tokenizer(reference, trust_remote_code)
        self.tokenizer = tokenizer
        self.large_name, self.small_name = large_model or large, small_model or small or "none"
        self.pair_name = None
        self.cues = cues if isinstance(cues, CueSet) else resolve_cues(cues)
        config = policy if isinstance(policy, PolicyConfig) else PolicyConfig(**dict(policy or {}))
        if config.reasoning_end is None:
            config = config.model_copy(update={"reasoning_end": reasoning_end_marker(tokenizer)})
        self.policy_config = config
        self.reuse_prefix = True  # what a request can reuse is up to the servers' prefix caches
        self.speculative = 0
        self.server_stops = server_stops
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # ``timeout`` bounds connecting and every wait for the next chunk; a generation may take longer in total.
        self.http = httpx.Client(headers=headers, timeout=httpx.Timeout(timeout, connect=min(timeout, 10.0)))
        self.runners = {"large": Endpoint("large", large, self.http, large_model, retries)}
        if small is not None:
            self.runners["small"] = Endpoint("small", small, self.http, small_model, retries)
        self.eos_ids = endpoint_eos_ids(tokenizer, reference)
        window = getattr(tokenizer, "model_max_length", None)
        if context_window is None:
            # Tokenizers without a limit report a huge sentinel; the server rejects what does not fit anyway.
            context_window = (
                window if isinstance(window, int) and 0 < window <= 10_000_000 else _FALLBACK_CONTEXT_WINDOW
            )
        self.context_window = context_window

    @property
    def endpoints(self) -> dict[ModelRole, Endpoint]:
        return self.runners

    def close(self) -> None:
        """Closes the HTTP connections (the engine cannot be used afterwards)."""
        self.http.close()

    def __enter__(self) -> RemoteRelayEngine:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def plan(self, prompt_ids: Sequence[int], *args: Any, **settings: Any) -> GenerationPlan:
        plan = super().plan(prompt_ids, *args, **settings)
        if plan.reprefill_segments:
            raise GenerationError(
                "reprefill_segments emulates serving without prefix caching; over endpoints every segment already is "
                "a fresh request (turn the server's prefix cache off to measure that)"
            )
        return plan

    def _draft_limit(self, speculative: bool | int) -> int:
        if speculative is False or speculative == 0:
            return 0
        raise GenerationError("speculative decoding needs both models' logits in one process: not over endpoints")

    def run_plan(self, plan: GenerationPlan, cancel: threading.Event | None = None) -> Iterator[StreamEvent]:
        """The stream of one planned request; closing it closes the open HTTP request."""
        policy = RelayPolicy(plan.cues, self.policy_config, plan.mode)
        return remote_relay_stream(self.runners, self.tokenizer, plan, policy, self.eos_ids, cancel, self.server_stops)
