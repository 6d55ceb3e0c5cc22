"""The settings of one generation, validated once at the boundary and passed down as one frozen object.

Every entry point (the engine's own methods, both framework adapters, the CLI, the HTTP server, the benchmark) builds
a :class:`GenerationSettings` through :func:`merge_settings` - defaults, then the caller's configured fields, then the
call's keyword arguments - so an unknown key or a bad value gets the same typed error, naming the field, wherever it
comes from, and before any model work starts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from .cues import CueSet
from .spans import Mode
from .verify import VerifyRule, VerifySetting, parse_verify

MAX_DRAFT_LIMIT = 64
# Self-speculation's maximum draft length for ``speculative=True``: a guess from short exploratory runs that are not
# kept (no kept evidence; docs/benchmarks.md says so), like ``DEFAULT_DRAFT_CONFIDENCE`` in ``local/speculative.py``.
DEFAULT_MAX_DRAFT = 6
# The other names callers use for a setting: OpenAI's and LangChain's ``max_tokens``, LangChain's ``stop_sequences``.
ALIASES = {"max_tokens": "max_new_tokens", "stop_sequences": "stop"}
MAX_TOP_LOGPROBS = 20  # OpenAI's limit for top_logprobs
# torch seeds its generator from a 64-bit integer; a larger seed would fail deep inside torch.
SEED_LIMIT = 2**63
# The chat-template families whose tool calls the chat layer parses and constrains (``chat/tool_formats``).
ToolFormatName = Literal["hermes", "llama3_json", "mistral", "mistral_v11"]


_SHOWN_CHARS = 80  # how much of a bad value an error message quotes


def shown(value: Any) -> str:
    """A bad value as an error message quotes it: its repr, cut short (a 10 MB string must not become the message)."""
    text = repr(value)
    return text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 3] + "..."


class GenerationError(ValueError):
    """A generation request is invalid (bad settings, messages or prompt ids, prompt too long for the context
    window, ...). ``field`` names the input at fault where there is one (``"messages[2].content"``, ``"top_p"``)."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class SettingsError(GenerationError, TypeError):
    """A setting is unknown or has a bad value; ``field`` names it. A ``TypeError`` too, as Python raises for an
    unexpected keyword argument."""


class PromptError(GenerationError):
    """Prompt token ids that no model of the pair can read (not integers, outside the vocabulary); ``field`` names
    the first bad position (``"prompt_ids[3]"``)."""


class SamplingParams(BaseModel):
    """Validated sampling settings; ``temperature=0`` means greedy."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    temperature: float = Field(0.0, ge=0.0, allow_inf_nan=False)
    top_p: float = Field(1.0, gt=0.0, le=1.0, allow_inf_nan=False)
    top_k: int | None = Field(None, ge=1)
    seed: int | None = Field(None, ge=-SEED_LIMIT, lt=SEED_LIMIT)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


class GenerationSettings(BaseModel):
    """What one generation does: length, sampling, stop sequences, who writes, cues and speculation.

    This is the one declaration of each setting: the adapters' fields and the server's request fields are built from
    these fields (``chat/setting_fields.py``), descriptions (the docstrings below) and bounds included, so a field
    added here reaches every entry point; ``tests/test_setting_fields.py`` checks that none is left out.
    """

    # The attribute docstrings become the fields' descriptions, which the adapters' fields show as their own.
    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True, use_attribute_docstrings=True)

    max_new_tokens: Annotated[int, Field(gt=0, strict=True)] = 256
    """Most new tokens per call (clipped to the room the prompt leaves in the context window)."""
    # Infinity and NaN are refused: an infinite temperature would turn every distribution uniform without a word.
    temperature: Annotated[float, Field(ge=0.0, allow_inf_nan=False)] = 0.0
    """0 = greedy."""
    top_p: Annotated[float, Field(gt=0.0, le=1.0, allow_inf_nan=False)] = 1.0
    """Nucleus sampling: sample from the smallest set of tokens whose probabilities add up to top_p."""
    top_k: Annotated[int, Field(ge=1, strict=True)] | None = None
    """Sample from the k most likely tokens only; None = all."""
    seed: Annotated[int, Field(ge=-SEED_LIMIT, lt=SEED_LIMIT, strict=True)] | None = None
    """Seed for sampling (temperature > 0)."""
    stop: tuple[str, ...] = ()
    """Stop strings (they hold across a switch too)."""
    mode: Mode | None = None
    """'relay', or one model alone through the same loop ('large' with ``speculative`` is self-speculative decoding);
    None = the engine's default (for the demo pair: what its profile ships, ``docs/benchmarks.md``)."""
    cues: CueSet | str | tuple[str, ...] | None = None
    """Switch cues: a preset, a profile path or a list; None = the engine's (the calibrated profile of a known pair,
    else the generic preset)."""
    speculative: bool | Annotated[int, Field(ge=0, le=MAX_DRAFT_LIMIT, strict=True)] | None = None
    """Self-speculative decoding: the small model drafts for the large model's tokens (same greedy output); True /
    False, or a maximum (adaptive) draft length; None = the engine's default (for the demo pair, what its profile
    ships)."""
    draft_vocab: Annotated[int, Field(ge=0, strict=True)] | None = None
    """Speculation: drafts score only the N most frequent tokens (+ special and prompt tokens), which makes a draft
    step cheaper and changes no output (``local/draft_head.py``); 0 = the whole vocabulary; None = the engine's."""
    prompt_lookup: bool | None = None
    """Drafts copied from the context: where the last tokens written occur earlier in the prompt or the text, the
    tokens that followed them there are checked by the large model as a draft (no model cost); the small model drafts
    where none matches when ``speculative`` is on. Output as without it (``local/prompt_lookup.py``); None = the
    engine's default."""
    reprefill_segments: bool = False
    """Baseline only: every segment re-reads the whole sequence, as RelayGen's original serving did."""
    reasoning_format: Literal["separate", "inline"] | None = None
    """Chat turns of a pair with a reasoning end (``</think>``) or answer marker: 'separate' hands the reasoning to
    the framework apart from the answer (LangChain reasoning blocks, LlamaIndex ThinkingBlock, the server's
    reasoning_content), 'inline' keeps the whole text as the content; None = 'separate' for thinking pairs, else
    'inline' (``chat/reasoning.py``)."""
    logprobs: bool = False
    """Report each emitted token's log probability under the model whose token was kept (``RelayResult.logprobs``,
    the stream's ``TextEvent.logprobs``)."""
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS, strict=True)] = 0
    """With ``logprobs``: also the N most likely tokens at each position, with their log probabilities."""
    grammar: str | None = None
    """A grammar the completion must match: Lark in llguidance's dialect (``%json {...}`` inlines a JSON schema;
    ``<[id]>`` is a special token). Every token either model writes is chosen under its mask. None = free text
    (chat turns derive one from their tools or response_format unless ``constrain`` is off)."""
    constrain: bool = True
    """Chat turns with tools or a JSON response_format generate under a grammar that keeps tool calls and JSON well
    formed (``chat/constraints.py``); False = free text, parsed afterwards."""
    tool_format: ToolFormatName | None = None
    """How the model writes a tool call: 'hermes' (``<tool_call>{...}</tool_call>``, Qwen), 'llama3_json' (the turn
    is ``{"name": ..., "parameters": {...}}``, Llama 3.x), 'mistral' (``[TOOL_CALLS] [{...}]``) or 'mistral_v11'
    (``[TOOL_CALLS]name[ARGS]{...}``); None = read from the chat template (``chat/tool_formats``)."""
    verify: VerifySetting = None
    """Verified relay: the large model checks the small model's tokens in its catch-up pass (``engine/core/verify.py``);
    a spec string ("greedy", "prob:0.05", "ratio:0.1", "+answer" to check the answer too), "off", or None for the
    engine's default (for the demo pair: the rule its profile ships, see ``docs/benchmarks.md``)."""

    @field_validator("verify", mode="before")
    @classmethod
    def _verify_rule(cls, value: Any) -> VerifySetting:
        return parse_verify(value)

    @field_validator("top_logprobs")
    @classmethod
    def _top_needs_logprobs(cls, value: int, info: ValidationInfo) -> int:
        if value and not info.data.get("logprobs"):
            raise ValueError("top_logprobs needs logprobs=True (as OpenAI's API requires)")
        return value

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_sequences(cls, value: Any) -> tuple[str, ...]:
        # A single string is one stop sequence (never its characters); None means none.
        if value is None:
            return ()
        if isinstance(value, str):
            value = (value,)
        if not isinstance(value, Sequence):
            raise ValueError(f"must be a string or a list of strings, got {type(value).__name__}")
        for stop in value:
            if not isinstance(stop, str) or not stop:
                raise ValueError(f"stop sequences must be non-empty strings, got {stop!r}")
            if "\ufffd" in stop or any(0xD800 <= ord(ch) <= 0xDFFF for ch in stop):
                raise ValueError(f"stop sequence {stop!r} is not valid UTF-8 text")
        return tuple(value)

    @field_validator("cues", mode="before")
    @classmethod
    def _cue_list(cls, value: Any) -> Any:
        # Lists become tuples so settings stay hashable and frozen; what they name is resolved by the engine.
        return tuple(value) if isinstance(value, list) else value

    @property
    def sampling(self) -> SamplingParams:
        return SamplingParams(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, seed=self.seed)

    def draft_limit(self, default: int) -> int:
        """The maximum draft length this request asks for: ``False``/0 -> off, ``True`` -> the library's default
        draft length, an int -> that maximum, None -> ``default`` (the engine's)."""
        if self.speculative is None:
            return default
        if self.speculative is True:
            return DEFAULT_MAX_DRAFT
        return int(self.speculative)


FIELDS = frozenset(GenerationSettings.model_fields)
KEYS = FIELDS | frozenset(ALIASES)  # every key merge_settings takes


def merge_settings(*layers: GenerationSettings | Mapping[str, Any] | None) -> GenerationSettings:
    """Defaults <- each layer in turn (an adapter's configured fields, then the call's keyword arguments). Aliases
    (``max_tokens``) are mapped; an unknown key or an invalid value raises :class:`SettingsError` naming it."""
    merged: dict[str, Any] = {}
    unknown: list[str] = []
    for layer in layers:
        if layer is None:
            continue
        # A settings object contributes what was set on it (attributes as they are: no dump of a CueSet to a dict).
        items = (
            {k: getattr(layer, k) for k in layer.model_fields_set} if isinstance(layer, GenerationSettings) else layer
        )
        if not isinstance(items, Mapping):
            raise SettingsError(f"generation settings must be a mapping of names to values, got {type(items).__name__}")
        for key, value in items.items():
            name = ALIASES.get(key, key)
            if name in FIELDS:
                merged[name] = value
            else:
                unknown.append(str(key))
    if unknown:
        raise SettingsError(
            f"unknown generation setting(s) {sorted(unknown)}; the settings are {sorted(KEYS)}",
            unknown[0],
        )
    try:
        return GenerationSettings(**merged)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = str(error["loc"][0]) if error["loc"] else None
        value = merged.get(field) if field else None
        message = str(error["msg"]).replace("Input should", f"{field} should", 1).removeprefix("Value error, ")
        raise SettingsError(f"invalid setting {field}={shown(value)}: {message}", field) from exc


@dataclass(frozen=True)
class GenerationPlan:
    """A validated request, ready to run: the prompt ids, the settings, and what the engine resolved from them."""

    prompt_ids: list[int]
    settings: GenerationSettings
    max_new_tokens: int  # the request's, clipped to the room left in the context window
    cues: CueSet  # the request's own, or the engine's when the request names none
    speculative: int = 0  # maximum draft length of self-speculative decoding; 0 = off
    prompt_lookup: bool = False  # drafts copied from the context (the small model's where none fits, if speculative)
    verify: VerifyRule | None = None  # the request's rule, or the engine's default; None = off
    mode: Mode = "relay"  # the request's, or the engine's default when the request names none
    # A chat turn with tools offered (``tool_choice="auto"``) under its grammar: the first position decides between
    # a call and text by the model's mass on opening a call (``constraints/opening.py``); the tag's id. None: no
    # such decision.
    call_tag: int | None = None

    @property
    def sampling(self) -> SamplingParams:
        return self.settings.sampling

    @property
    def stop(self) -> tuple[str, ...]:
        return self.settings.stop

    @property
    def reprefill_segments(self) -> bool:
        return self.settings.reprefill_segments

    @property
    def logprobs(self) -> int | None:
        """None: no log probabilities; else how many alternatives each token's entry lists (0: none)."""
        return self.settings.top_logprobs if self.settings.logprobs else None
