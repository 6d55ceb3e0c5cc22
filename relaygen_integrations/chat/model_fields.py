"""The fields both framework adapters expose: which pair to load and the default generation settings.

The generation settings are not declared here: they are GenerationSettings' own fields (``setting_fields.py``), with
the few differences an adapter needs named in one mapping below, so a new setting is a field of both adapters at once.

``RelayChatModel`` (LangChain) and ``RelayLLM`` (LlamaIndex) inherit :class:`RelayModelFields` next to their
framework's base class. The engine loads lazily through ``RelayEngine.shared``, keyed by the weights alone (pair,
device, dtype), so adapters that differ only in cues, sampling or speculation share one copy of the weights; those
settings travel with each request as the layer :meth:`RelayModelFields.settings_layer` gives to ``merge_settings``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import AliasChoices, Field, PrivateAttr, field_validator

from ..engine.core.configuration import PairConfiguration
from ..engine.core.pairs import known_pair
from ..engine.core.settings import GenerationSettings
from ..engine.core.spans import Mode
from .setting_fields import settings_model

if TYPE_CHECKING:
    from ..engine.engine import RelayEngine

# Where the adapters' setting fields differ from GenerationSettings, and why; every other setting is a field of its
# own name, type, default, bounds and description (``setting_fields.settings_model``).
NOT_FIELDS = frozenset({"reprefill_segments"})  # a benchmark baseline (``relaygen bench`` sets it), not a model option
FIELD_NAMES = {"max_new_tokens": "max_tokens"}  # the name LangChain and LlamaIndex models use; both are accepted
_DIFFER: dict[str, dict[str, Any]] = {
    "max_new_tokens": {"validation_alias": AliasChoices("max_tokens", "max_new_tokens")},
    # A list in the model's configuration, None for none (a single string becomes one stop sequence, below).
    "stop": {
        "annotation": list[str] | None,
        "default": None,
        "validation_alias": AliasChoices("stop", "stop_sequences"),
    },
    # What a caller writes - a preset, a profile path or a list of cues; a rule's spec string - which the engine
    # resolves per request (into a CueSet, a VerifyRule), where the engine's own types would need an object here.
    "cues": {"annotation": str | list[str] | None},
    "verify": {"annotation": str | None},
}
# Each setting the adapters configure, by the name of its field.
ADAPTER_SETTINGS = {
    FIELD_NAMES.get(name, name): name for name in GenerationSettings.model_fields if name not in NOT_FIELDS
}

SettingFields = settings_model("SettingFields", exclude=NOT_FIELDS, rename=FIELD_NAMES, differ=_DIFFER)


class RelayModelFields(SettingFields):  # type: ignore[misc,valid-type]
    """Pair, device and generation defaults shared by both adapters (each call's keyword arguments override them).

    The generation settings (``temperature``, ``max_tokens``, ``stop``, ``speculative``, ...) are inherited from
    :data:`SettingFields`, built from GenerationSettings."""

    large: str = Field(
        default="demo", description="Large model: a known pair name ('demo'), a local directory or a hub id."
    )
    small: str = Field(default="demo", description="Small model (same tokenizer as the large one).")
    device: str = Field(default="auto", description="'auto', 'cpu', 'cuda', 'cuda:1', ...")
    dtype: str = Field(
        default="auto",
        description="'auto' (the pair's shipped formats, else bf16), 'fast' (int8 on a CPU, bf16 on CUDA), 'bf16', "
        "'fp16', 'fp32' or 'int8' (CPU only); 'LARGE/SMALL' gives each model its own (e.g. 'bf16/int8').",
    )
    compile: bool = Field(
        default=False,
        description="Compile each model's one-token decode step over a static KV cache (CUDA graphs on a GPU).",
    )
    raw_markup: bool = Field(
        default=False,
        description="Whether control-token strings in messages (e.g. '<|im_end|>') become real tokens. By default they "
        "are text, so a message cannot open a turn of its own; True only for messages that really hold chat markup.",
    )

    # Not a generation setting: it changes the rendered prompt, which only the chat layer renders (the engine's own
    # generate takes chat_template_kwargs), so it lives beside the chat fields, as ChatOllama's ``reasoning`` does.
    reasoning: bool | None = Field(
        default=None,
        description="Thinking on (True) or off (False) through the chat template's switch (enable_thinking); None = "
        "the pair's default. On a template without a switch, a request the pair cannot honour is a SettingsError.",
    )

    _engine: RelayEngine | None = PrivateAttr(default=None)

    @field_validator("stop", mode="before")
    @classmethod
    def _one_stop_string(cls, value: Any) -> Any:
        # A single string is one stop sequence, never its characters (as everywhere in the engine).
        return [value] if isinstance(value, str) else value

    def settings_layer(self) -> dict[str, Any]:
        """The configured generation settings, as the layer below a call's keyword arguments (a None is the
        setting's "unset": the engine's default, as merge_settings reads it too)."""
        return {setting: getattr(self, field) for field, setting in ADAPTER_SETTINGS.items()}

    def writing_mode(self) -> Mode:
        """Who writes when a call names no mode: the field, else the loaded engine's default, else - without loading
        anything - the mode a known pair's profile ships (``relay`` for any other pair)."""
        if self.mode is not None:
            return self.mode  # type: ignore[no-any-return]
        if self._engine is not None:
            return self._engine.mode
        return PairConfiguration.shipped(known_pair(self.large, self.small)).mode  # type: ignore[return-value]

    def load_engine(self) -> RelayEngine:
        """The engine handed to the constructor, or the shared one for this pair (loaded on first use)."""
        if self._engine is None:
            from ..engine.engine import RelayEngine

            self._engine = RelayEngine.shared(
                self.large, self.small, device=self.device, dtype=self.dtype, compile=self.compile
            )
        return self._engine
