"""Remote backend: the relay over two OpenAI-compatible completion servers (tested: vLLM,
llama-cpp-python's server, ``relaygen serve --single``), created with ``RelayEngine.from_endpoints``
(HTTP details: ``endpoint.py``).

Design. The same :class:`RelayPolicy` decides token by token as in the local engine, and the same loop
(``generate.drive``) runs; only the source of the tokens changes (:class:`RemoteSession`). Each segment is one streamed
``POST {base}/completions`` request to the writer's server, and every token it streams goes through the same
:class:`Transcript` as local tokens (exact text, policy, stop sequences, spans), so a remote run with the same models
gives the local engine's text and spans.

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
* What a server refuses is learnt once per endpoint from its refusal, and the request goes again in a form it takes:
  a cap on stop strings (vLLM's ``VLLM_MAX_STOP_STRINGS``, 4 by default) trims the list, the caller's stops and the
  reasoning end first; a server that takes only text prompts (llama-cpp-python's) gets the sequence as text, unless
  that text spells a special token the ids hold as text (a user's literal "<|im_start|>"), which is refused instead.

Verified relay: at the end of a small run the large server scores the sequence (``prompt_logprobs``, one request)
and the transcript is cut at the first rejected token; the large server's next request writes from there. A server
that does not score prompts is found out by a probe when the plan is checked, and ``verify`` is refused there.

Reliability: the requests go through the ``openai`` SDK (``endpoint.py``), which retries connection errors,
timeouts, 408, 409, 429 and 5xx with exponential backoff; any other 4xx, retries used up, or a stream that breaks off
raise :class:`EndpointError` naming the URL. A read waits at most ``timeout`` seconds for the next chunk, so nothing
hangs. The cancel flag is checked after every streamed chunk. Requests are not serialized (no engine lock):
concurrent generations have their own streams, and the servers batch them.

Usage: prefill / catch-up / reused-prefix tokens are counted as a server's prefix cache sees them within one
generation: a request re-sends the whole sequence, of which the part that endpoint already processed earlier is
``reused_prefix_tokens``, the rest is prompt (prefill) or the other model's tokens (catch-up). ``requests`` counts
round trips.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import httpx
from openai import Stream
from openai.types import Completion
from transformers import GenerationConfig, PreTrainedTokenizerBase

from ..core.backend import BackendCapabilityError, Step
from ..core.cues import CueSet, cue_core
from ..core.pairs import load_tokenizer, resolve_reference
from ..core.policy import RelayPolicy
from ..core.settings import SEED_LIMIT, GenerationPlan
from ..core.spans import FinishReason, ModelRole
from ..core.transcript import BackendUsage, Fed, Transcript
from .endpoint import CompletionStream, Endpoint, EndpointError, refused_stop_limit, refuses_token_prompts

if TYPE_CHECKING:
    from transformers import PreTrainedModel

__all__ = ["EndpointError", "RemoteBackend", "RemoteSession", "cue_stop_strings", "send_completion", "text_prompt"]

DEFAULT_TIMEOUT = 60.0
DEFAULT_RETRIES = 2
SENTENCE_END_STOPS = (". ", ".\n", "! ", "!\n", "? ", "?\n", "\n\n")
_FALLBACK_CONTEXT_WINDOW = 32768


def cue_stop_strings(cues: CueSet) -> tuple[str, ...]:
    """Stop strings for the large endpoint: each cue after a space or a newline (so "Also " never stops the server
    for "so "), a punctuated cue as is ("So,"), a bare cue word followed by " " or "," (its look-ahead). In the cue
    set's order, so that a server taking only a few stop strings gets the first cues' (``send_completion``)."""
    forms: list[str] = []
    for cue in cues.cues:
        forms += [cue + " ", cue + ","] if cue == cue_core(cue) else [cue]
    return tuple(dict.fromkeys(left + form for form in forms for left in (" ", "\n")))


def request_stops(policy: RelayPolicy, user_stops: Sequence[str], cue_stops: Sequence[str]) -> list[str]:
    """The stop strings of the next request, most useful first (a server may take only the first few): the
    caller's, the reasoning end, then the policy's for its current state."""
    stops = list(user_stops)
    if policy.mode == "relay" and policy.state != "answer":
        stops += [m for m in (policy.config.reasoning_end, policy.config.answer_marker) if m]
        stops += cue_stops if policy.state == "large" else SENTENCE_END_STOPS
    return list(dict.fromkeys(stops))


def text_prompt(tokenizer: PreTrainedTokenizerBase, ids: Sequence[int], url: str) -> str:
    """The sequence so far as text, for a server that takes only text prompts and tokenizes them itself with
    special tokens parsed (llama-cpp-python's server). Sent only if that gives back the same special tokens: text a
    user wrote that spells one ("<|im_start|>") is text in ``ids``, and must not become a special token there."""
    text = tokenizer.decode(list(ids), skip_special_tokens=False)
    specials = frozenset(tokenizer.all_special_ids)
    retokenized = tokenizer.encode(text, add_special_tokens=False)
    if [i for i in retokenized if i in specials] != [i for i in ids if i in specials]:
        raise EndpointError(
            url,
            "takes only text prompts, and this prompt's text spells a special token (such as <|im_start|>) that the "
            "server would parse as one, so it was not sent; use a server that takes token-id prompts (vLLM and "
            "relaygen serve --single are tested)",
        )
    return text


def send_completion(
    endpoint: Endpoint, body: dict[str, Any], stops: list[str], as_text: Callable[[], str]
) -> tuple[Stream[Completion], list[str]]:
    """Sends a streamed completion request. A server that refuses token-id prompts, or that many stop strings, is
    learnt about once (on the endpoint) and the request goes again in the form it takes; returns the stops sent."""
    while True:
        try:
            return endpoint.stream(body), stops
        except EndpointError as error:
            # Judged on this request's own prompt: a concurrent request may have taught the endpoint meanwhile.
            if isinstance(body["prompt"], list) and refuses_token_prompts(error):
                endpoint.takes_token_prompts = False
                body["prompt"] = as_text()
                continue
            limit = refused_stop_limit(error) if stops else None
            if limit is None or limit >= len(stops):
                raise
            endpoint.max_stop_strings = limit  # later requests are trimmed before they are sent
            stops = stops[:limit]
            body.pop("stop")
            if stops:
                body["stop"] = stops


_NO_SCORES = (
    "it needs the large model's probability of every token of a small segment, and the large server does not score "
    "prompts (no prompt_logprobs in its answer; vLLM's completions have them) - use such a server, or local models"
)


class RemoteSession:
    """One generation's requests: a streamed completion request per segment, its chunks handed to the loop as they
    arrive; a request is closed (the server aborts it) as soon as the writer changes."""

    def __init__(
        self,
        endpoints: dict[ModelRole, Endpoint],
        tokenizer: PreTrainedTokenizerBase,
        plan: GenerationPlan,
        transcript: Transcript,
        server_stops: bool,
    ) -> None:
        self.endpoints = endpoints
        self.tokenizer = tokenizer
        self.plan = plan
        self.transcript = transcript
        self.policy: RelayPolicy = transcript.policy
        self.server_stops = server_stops
        self.end_ids = transcript.eos_ids | frozenset(tokenizer.all_special_ids)
        self.cue_stops = cue_stop_strings(plan.cues)
        # Leading ids of the sequence each endpoint processed in an earlier request (what its prefix cache holds).
        self.known: dict[ModelRole, int] = dict.fromkeys(endpoints, 0)
        self.reused = 0
        self.requests = 0
        self.idle_requests = 0
        self.stream: CompletionStream | None = None
        self.batches: Any = None
        self.writer: ModelRole | None = None
        self.received = 0
        # What the servers re-read for the requests sent since the last step (model, sequence [start, end)).
        self.passes: list[tuple[ModelRole, int, int]] = []

    def next_tokens(self, writer: ModelRole) -> Step:
        if self.stream is None:
            self._open(writer)
        batch = next(self.batches, None)
        passes, self.passes = self.passes, []
        if batch is None:
            return Step(passes=passes, end=self._request_ended())
        return Step(batch, passes)

    def after_feed(self, fed: Fed) -> None:
        self.received += fed.pushed
        if fed.decision.action != "continue" and self.stream is not None:
            self._close_request()  # the rest of this request was written for the previous writer

    def verify(self) -> Step:
        """Verified relay over endpoints: the large server scores the sequence up to the end of the small run
        (``prompt_logprobs``, one request), and the rule finds the first small token it rejects. The large model's
        own token there is what its next request writes first (sampled by the server)."""
        transcript = self.transcript
        rule = transcript.verify
        assert rule is not None
        if self.stream is not None:
            self._close_request()
        start, end = transcript.pending_run()
        scored = transcript.ids[: transcript.prompt_len + end]
        endpoint = self.endpoints["large"]
        scores = endpoint.score(scored, transcript.prompt_len + start)
        if scores is None:
            raise BackendCapabilityError("remote", "verify the small model's tokens", _NO_SCORES)
        self.requests += 1
        self.known["large"] = len(scored)
        rejected = rule.first_rejected_scores(scores)
        if rejected is not None:
            kept = transcript.prompt_len + start + rejected
            for role, known in self.known.items():  # what each server cached beyond the cut is no longer the sequence
                self.known[role] = min(known, kept)
        # vLLM reads no prefix cache for a request with prompt_logprobs: it re-reads the whole sequence.
        passes, self.passes = [*self.passes, ("large", 0, len(scored))], []
        return Step(passes=passes, rejected=rejected)

    def close(self, failed: bool) -> None:
        if self.stream is not None:
            self._close_request()

    def usage(self) -> BackendUsage:
        return BackendUsage(reused_prefix_tokens=self.reused, requests=self.requests)

    def _open(self, writer: ModelRole) -> None:
        transcript, policy, sampling = self.transcript, self.policy, self.plan.sampling
        endpoint = self.endpoints[writer]
        max_tokens = self.plan.max_new_tokens - transcript.completion_tokens
        if policy.mode == "relay" and policy.state == "small_sentence":
            max_tokens = min(max_tokens, policy.config.max_small_tokens - policy.segment_tokens)
        # Stops go only to a server known to stream token ids. One that streams only text (or not yet known to
        # stream ids: its first request) gets none: a stop would drop text and hold back the text of tokens that
        # might match, so chunks would no longer be whole tokens and the ids re-tokenized from them could drift.
        # The client finds every stop itself and closes the stream, which is exact.
        with_stops = self.server_stops and endpoint.streams_token_ids
        stops = request_stops(policy, self.plan.stop, self.cue_stops) if with_stops else []
        # Stops are only a hint (the client finds every stop itself), so a server's cap on them just trims the list.
        stops = stops[: endpoint.max_stop_strings]
        body: dict[str, Any] = {
            "model": endpoint.model_name(),
            "prompt": transcript.ids,
            "max_tokens": max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "return_token_ids": True,
        }
        if sampling.top_k is not None:
            body["top_k"] = sampling.top_k
        if sampling.seed is not None:
            # Reproducible, and no two segments draw the same numbers; kept within the 64-bit range servers take.
            seed = sampling.seed + self.requests
            body["seed"] = seed if seed < SEED_LIMIT else seed - 2 * SEED_LIMIT
        if stops:
            body["stop"] = stops
        # The server re-reads the whole sequence; what it processed in an earlier request its prefix cache reuses.
        reused = min(self.known[writer], len(transcript.ids))
        self.reused += reused
        self.passes.append((writer, reused, len(transcript.ids)))

        def as_text() -> str:
            return text_prompt(self.tokenizer, transcript.ids, endpoint.completions_url)

        if not endpoint.takes_token_prompts:
            body["prompt"] = as_text()
        events, stops = send_completion(endpoint, body, stops, as_text)
        self.stream = CompletionStream(endpoint, events, self.tokenizer, self.end_ids, stops, self.plan.stop)
        self.batches = self.stream.batches()
        self.writer = writer
        self.requests += 1
        self.received = 0

    def _close_request(self) -> None:
        assert self.stream is not None and self.writer is not None
        self.known[self.writer] = len(self.transcript.ids)
        self.stream.close()
        self.stream = self.batches = None

    def _request_ended(self) -> FinishReason | None:
        """The server finished a request the policy did not end: why decides whether the generation goes on (None)
        or ends, and how."""
        stream = self.stream
        assert stream is not None
        model_ended, stream_finish, received = stream.model_ended, stream.finish_reason, self.received
        self._close_request()
        if model_ended:
            return "stop"
        if received == 0 and stream_finish is None:
            raise EndpointError(stream.endpoint.completions_url, "ended the stream without a token or a finish_reason")
        if received == 0:
            # Nothing written: after a stop whose restored text was only whitespace the model writes it again;
            # anything else (e.g. a full context on the server), or twice in a row, ends at "length".
            self.idle_requests += 1
            return "length" if stream_finish != "stop" or self.idle_requests > 1 else None
        self.idle_requests = 0
        # Otherwise a server-side stop the policy did not act on, or a look-ahead still missing: the same model
        # continues with a new request from the ids so far.
        return None


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


class RemoteBackend:
    """Two OpenAI-compatible completion servers as the engine's backend; see the module docstring for the design.
    Requests are not serialized (no engine lock): concurrent generations have their own streams, and the servers
    batch them. Construct it through ``RelayEngine.from_endpoints``."""

    kind = "remote"
    serialized = False
    grammars = False  # the relay reads sampled tokens; masking needs the logits in this process
    grammar_tokenizer = None

    def __init__(
        self,
        large: str,
        small: str | None,
        tokenizer: str | PreTrainedTokenizerBase,
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
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValueError(f"retries must be a non-negative integer, got {retries!r}")
        if context_window is not None and (not isinstance(context_window, int) or context_window <= 0):
            raise ValueError(f"context_window must be a positive integer, got {context_window!r}")
        reference: str | None = None
        if isinstance(tokenizer, str):
            reference, _pair = resolve_reference(tokenizer, "large")
            tokenizer = load_tokenizer(reference, trust_remote_code)
        self.tokenizer = tokenizer
        self.vocab_size = len(tokenizer)  # the servers' tokenizer: the same ids, whatever their embedding padding
        self.large_name, self.small_name = large_model or large, small_model or small or "none"
        self.server_stops = server_stops
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # ``timeout`` bounds connecting and every wait for the next chunk; a generation may take longer in total. The
        # endpoints' SDK clients share this client (one connection pool) and send its headers (the key).
        self.http = httpx.Client(headers=headers, timeout=httpx.Timeout(timeout, connect=min(timeout, 10.0)))
        self.endpoints: dict[ModelRole, Endpoint] = {"large": Endpoint("large", large, self.http, large_model, retries)}
        if small is not None:
            self.endpoints["small"] = Endpoint("small", small, self.http, small_model, retries)
        self.eos_ids = endpoint_eos_ids(tokenizer, reference)
        window = getattr(tokenizer, "model_max_length", None)
        if context_window is None:
            # Tokenizers without a limit report a huge sentinel; the server rejects what does not fit anyway.
            context_window = (
                window if isinstance(window, int) and 0 < window <= 10_000_000 else _FALLBACK_CONTEXT_WINDOW
            )
        self.context_window = context_window

    @property
    def roles(self) -> frozenset[ModelRole]:
        return frozenset(self.endpoints)

    def check(self, plan: GenerationPlan) -> None:
        if plan.reprefill_segments:
            raise BackendCapabilityError(
                self.kind,
                "emulate serving without prefix caching (reprefill_segments)",
                "over endpoints every segment already is a fresh request (turn the server's prefix cache off to "
                "measure that)",
            )
        if plan.speculative or plan.prompt_lookup:
            raise BackendCapabilityError(
                self.kind, "run speculative decoding", "it needs both models' logits in one process",
                "prompt_lookup" if plan.prompt_lookup and not plan.speculative else "speculative",
            )  # fmt: skip
        if plan.logprobs is not None:
            raise BackendCapabilityError(
                self.kind, "report log probabilities (logprobs)", "the relay reads sampled tokens from the servers, "
                "not their distributions; load the models locally for logprobs", "logprobs",
            )  # fmt: skip
        if plan.settings.grammar is not None:
            raise BackendCapabilityError(
                self.kind, "constrain tokens by a grammar", "a mask applies to the logits, and the servers hand out "
                "sampled tokens; load the models locally, or send the chat with constrain=False", "grammar",
            )  # fmt: skip
        if plan.verify is not None and plan.mode == "relay":
            large = self.endpoints["large"]
            if large.scores_prompts is None:  # asked once per endpoint, with a two-token prompt
                large.score(self.tokenizer.encode("1 2", add_special_tokens=False)[:2], 1)
            if not large.scores_prompts:
                raise BackendCapabilityError(self.kind, "verify the small model's tokens (verify=...)", _NO_SCORES)

    def open(self, plan: GenerationPlan, transcript: Transcript) -> RemoteSession:
        return RemoteSession(self.endpoints, self.tokenizer, plan, transcript, self.server_stops)

    def token_margins(self, role: ModelRole, prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> list[float]:
        raise BackendCapabilityError(
            self.kind, "score tokens for cue calibration", "completion servers return sampled tokens, not logits; "
            "calibrate with the models loaded locally (relaygen calibrate --large DIR --small DIR)"
        )  # fmt: skip

    def local_model(self, role: ModelRole) -> PreTrainedModel:
        raise BackendCapabilityError(self.kind, f"hand out the {role} model", "its weights live on a server")

    def close(self) -> None:
        """Closes the HTTP connections (the engine cannot be used afterwards)."""
        self.http.close()
