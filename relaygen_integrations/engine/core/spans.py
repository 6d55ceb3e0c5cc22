"""Result and stream-event types of a relay generation.

Everything here is plain data (dataclasses) so a backend, the CLI and both framework adapters can build on it without
importing torch or a framework.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

ModelRole = Literal["large", "small"]
Mode = Literal["relay", "large", "small"]  # who writes: both models, or one alone (the baselines)
MODES: tuple[Mode, ...] = ("relay", "large", "small")
FinishReason = Literal["stop", "length", "stop_sequence", "cancelled"]


@dataclass
class Span:
    """A run of consecutive completion tokens written by one model.

    ``start``/``end`` are character offsets into ``RelayResult.text``; ``trigger`` says why this span began:
    ``"start"``, ``"cue:<cue>"``, ``"sentence_end"``, ``"reasoning_end"``, ``"cap"``, or ``"rejected"`` (verified
    relay: the large model rejected a small-model token and writes from there).
    """

    model: ModelRole
    trigger: str
    start: int
    end: int = 0
    text: str = ""
    token_count: int = 0
    duration: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Usage:
    """Token accounting for one generation.

    ``*_prefill_tokens`` are prompt tokens a model forward-passed; ``*_catchup_tokens`` are completion tokens written
    by the *other* model that a model forward-passed at a switch. Each model sees every token at most once, so
    ``large_prefill + large_catchup + large_tokens`` bounds its total forward work.
    """

    prompt_tokens: int = 0
    completion_tokens: int = 0
    large_tokens: int = 0
    small_tokens: int = 0
    switches: int = 0
    large_prefill_tokens: int = 0
    small_prefill_tokens: int = 0
    large_catchup_tokens: int = 0
    small_catchup_tokens: int = 0
    reused_prefix_tokens: int = 0
    rolled_back_tokens: int = 0
    # Verified relay (0 when off): small-model tokens the large model checked and kept, and those it dropped (each
    # rejected token and everything after it in its segment, rewritten by the large model). Checked = the sum.
    verified_tokens: int = 0
    rejected_tokens: int = 0
    # Self-speculative decoding of the large model's segments (0 when off): verify passes, tokens the small model
    # proposed, and how many of them the large model accepted.
    speculative_rounds: int = 0
    draft_tokens: int = 0
    accepted_draft_tokens: int = 0
    # Of those, tokens copied from the context (prompt lookup, ``prompt_lookup=True``) and how many were kept.
    lookup_draft_tokens: int = 0
    lookup_accepted_tokens: int = 0
    # Remote backend (``RelayEngine.from_endpoints``): completion requests sent to the servers, one per segment plus
    # one per continuation after a server-side stop the policy did not act on; 0 for local models.
    requests: int = 0
    # Wall time spent inside each model's forward passes (local models; 0 for remote ones). The rest of ``elapsed``
    # is sampling, detokenizing, the policy and Python: the split shows where a request's time went.
    large_forward_seconds: float = 0.0
    small_forward_seconds: float = 0.0
    # The forward seconds by model and by what each pass was for ("large.decode", "large.catchup",
    # "large.verify_drafts", "large.verify_sentences", "small.decode" (its sentences and answers), "small.draft", ...;
    # kinds: ``runner.PASS_KINDS``): where an answer's time went, so the next lever shows in every report.
    time_split: dict[str, float] = field(default_factory=dict)
    # Forward passes by model and by how many new positions each read (``{"large": {1: 212, 4: 31}}``; local models
    # only): the machine-independent shape of the work, which ``relaygen tune`` prices with a machine's pass costs.
    passes: dict[str, dict[int, int]] = field(default_factory=dict)
    # Their wall time by model and positions read (local models only): what this machine charged for each size of
    # pass, which an engine on a tuned configuration records to correct its cost table (``tune/observed.py``).
    pass_seconds: dict[str, dict[int, float]] = field(default_factory=dict)

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def small_share(self) -> float:
        """Fraction of completion tokens written by the small model (the paper's f)."""
        return self.small_tokens / self.completion_tokens if self.completion_tokens else 0.0

    @property
    def acceptance_rate(self) -> float:
        """Share of drafted tokens the large model accepted (speculation only)."""
        return self.accepted_draft_tokens / self.draft_tokens if self.draft_tokens else 0.0

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["total_tokens"] = self.total_tokens
        return data


@dataclass(frozen=True)
class TokenLogprob:
    """The log probability of one emitted token under the model whose token was kept (``model``), and the ``top``
    most likely tokens at that position with theirs (``top_logprobs``; the kept token among them only if it is one
    of them). From that model's own logits (float32 log-softmax), before temperature, top-k and top-p: the model's
    distribution, as OpenAI reports it. Under speculation a kept token is the large model's (its checking pass's
    row); under verified relay a kept small-model token is the small model's, the large model's replacement the
    large model's."""

    token_id: int
    token: str
    logprob: float
    model: ModelRole
    top: tuple[tuple[int, str, float], ...] = ()

    def to_openai(self) -> dict[str, Any]:
        """OpenAI's ``logprobs.content[i]`` shape, plus ``model`` (the writing model)."""
        return {
            "token": self.token,
            "logprob": self.logprob,
            "bytes": token_bytes(self.token),
            "top_logprobs": [
                {"token": text, "logprob": value, "bytes": token_bytes(text)} for _id, text, value in self.top
            ],
            "model": self.model,
        }


def token_bytes(text: str) -> list[int]:
    """A token's text as the UTF-8 bytes OpenAI reports (a lone surrogate kept, not an error)."""
    return list(text.encode("utf-8", "surrogatepass"))


@dataclass
class RelayResult:
    """The outcome of one generation: text, who wrote what, and what it cost."""

    text: str
    spans: list[Span]
    usage: Usage
    finish_reason: FinishReason
    completion_ids: list[int] = field(default_factory=list)
    elapsed: float = 0.0
    # The character offset in ``text`` after each completion token (a token cut by a stop sequence: past the end).
    token_ends: list[int] = field(default_factory=list)
    # One entry per completion token when the request asked for ``logprobs``; None when it did not.
    logprobs: list[TokenLogprob] | None = None
    # The engine's configuration that ran it (``tune/configuration.py``: tuned for this machine, or the profile's);
    # None for an engine built over the caller's own models.
    configuration: dict[str, Any] | None = None

    def relay_metadata(self) -> dict[str, Any]:
        """The per-model summary adapters attach to messages (JSON-safe)."""
        configuration = {"configuration": self.configuration} if self.configuration is not None else {}
        return configuration | {
            "spans": [span.to_dict() for span in self.spans],
            "large_tokens": self.usage.large_tokens,
            "small_tokens": self.usage.small_tokens,
            "small_share": round(self.usage.small_share, 4),
            "switches": self.usage.switches,
            # Self-speculation (zeros when off): tokens the small model drafted and the large model accepted.
            "speculation": {
                "rounds": self.usage.speculative_rounds,
                "drafted": self.usage.draft_tokens,
                "accepted": self.usage.accepted_draft_tokens,
                "acceptance_rate": round(self.usage.acceptance_rate, 4),
                "copied": self.usage.lookup_draft_tokens,
                "copied_accepted": self.usage.lookup_accepted_tokens,
            },
            # Verified relay (zeros when off): small-model tokens the large model checked, kept and rejected.
            "verification": {
                "checked": self.usage.verified_tokens + self.usage.rejected_tokens,
                "kept": self.usage.verified_tokens,
                "rejected": self.usage.rejected_tokens,
            },
            "usage": self.usage.to_dict(),
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "spans": [span.to_dict() for span in self.spans],
            "usage": self.usage.to_dict(),
            "finish_reason": self.finish_reason,
            "elapsed": self.elapsed,
            **({"logprobs": [entry.to_openai() for entry in self.logprobs]} if self.logprobs is not None else {}),
        }


@dataclass(frozen=True)
class TextEvent:
    """A piece of newly final text written by ``model`` (part of span ``span_index``). With ``logprobs`` asked for,
    ``logprobs`` holds the entries of the tokens whose text this piece completes (a token whose text ends inside a
    later piece comes with that one; the stream's last event may be an empty text carrying the last entries), so
    the stream's entries are, in order, exactly ``RelayResult.logprobs``."""

    text: str
    model: ModelRole
    span_index: int
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True)
class SwitchEvent:
    """The writer changes from ``from_model`` to ``to_model`` at character ``char_offset`` of the final text."""

    from_model: ModelRole
    to_model: ModelRole
    trigger: str
    char_offset: int
    span_index: int

    @property
    def text(self) -> str:
        return ""

    @property
    def model(self) -> ModelRole:
        return self.to_model


@dataclass(frozen=True)
class FinalEvent:
    """Always the last event of a stream; carries the complete result."""

    result: RelayResult

    @property
    def text(self) -> str:
        return ""

    @property
    def model(self) -> ModelRole:
        return self.result.spans[-1].model if self.result.spans else "large"

    @property
    def span_index(self) -> int:
        return len(self.result.spans) - 1


StreamEvent = TextEvent | SwitchEvent | FinalEvent
