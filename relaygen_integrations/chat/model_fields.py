"""The fields both framework adapters expose, declared once: which pair to load and the default generation settings.

``RelayChatModel`` (LangChain) and ``RelayLLM`` (LlamaIndex) inherit :class:`RelayModelFields` next to their
framework's base class. The engine loads lazily through ``RelayEngine.shared``, keyed by the weights alone (pair,
device, dtype), so adapters that differ only in cues, sampling or speculation share one copy of the weights; those
settings travel with each request as the layer :meth:`RelayModelFields.settings_layer` gives to ``merge_settings``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import AliasChoices, BaseModel, Field, PrivateAttr, field_validator

from ..engine.core.spans import Mode

if TYPE_CHECKING:
    from ..engine.engine import RelayEngine


class RelayModelFields(BaseModel):
    """Pair, device and generation defaults shared by both adapters (each call's keyword arguments override them)."""

    large: str = Field(
        default="demo", description="Large model: a known pair name ('demo'), a local directory or a hub id."
    )
    small: str = Field(default="demo", description="Small model (same tokenizer as the large one).")
    cues: str | list[str] | None = Field(
        default=None,
        description="Switch cues: a preset, a profile path or a list; None = the engine's (the calibrated profile of a "
        "known pair, else the generic preset).",
    )
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
    temperature: float = Field(default=0.0, ge=0.0, description="0 = greedy.")
    max_tokens: int = Field(
        default=256,
        gt=0,
        validation_alias=AliasChoices("max_tokens", "max_new_tokens"),
        description="Most new tokens per call.",
    )
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, gt=0)
    seed: int | None = Field(default=None, description="Seed for sampling (temperature > 0).")
    stop: list[str] | None = Field(
        default=None,
        validation_alias=AliasChoices("stop", "stop_sequences"),
        description="Stop strings (they hold across a switch too).",
    )
    mode: Mode = Field(default="relay", description="'relay', or one model alone through the same loop (baselines).")
    speculative: bool | int | None = Field(
        default=None,
        description="The small model drafts for the large model's tokens (same greedy output); an int bounds the "
        "adaptive draft length; None = the engine's default (for the demo pair, what its profile ships).",
    )
    draft_vocab: int | None = Field(
        default=None,
        ge=0,
        description="Speculation: drafts score only the N most frequent tokens (+ special and prompt tokens) - cheaper "
        "drafts, same output; 0 = the whole vocabulary; None = the engine's default.",
    )

    raw_markup: bool = Field(
        default=False,
        description="Whether control-token strings in messages (e.g. '<|im_end|>') become real tokens. By default they "
        "are text, so a message cannot open a turn of its own; True only for messages that really hold chat markup.",
    )
    verify: str | None = Field(
        default=None,
        description="Verified relay: the large model checks the small model's tokens in its catch-up pass and rewrites "
        "from the first it rejects - 'greedy', 'prob:TAU', 'ratio:TAU' ('+answer' also checks the answer), or "
        "'off'. None = the engine's default: for the demo pair, the rule its profile ships.",
    )

    _engine: RelayEngine | None = PrivateAttr(default=None)

    @field_validator("stop", mode="before")
    @classmethod
    def _one_stop_string(cls, value: Any) -> Any:
        # A single string is one stop sequence, never its characters (as everywhere in the engine).
        return [value] if isinstance(value, str) else value

    def settings_layer(self) -> dict[str, Any]:
        """The configured generation settings, as the layer below a call's keyword arguments."""
        layer: dict[str, Any] = {
            "max_new_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "seed": self.seed,
            "stop": self.stop,
            "mode": self.mode,
        }
        if self.speculative is not None:
            layer["speculative"] = self.speculative
        if self.cues is not None:
            layer["cues"] = self.cues
        if self.verify is not None:
            layer["verify"] = self.verify
        if self.draft_vocab is not None:
            layer["draft_vocab"] = self.draft_vocab
        return layer

    def load_engine(self) -> RelayEngine:
        """The engine handed to the constructor, or the shared one for this pair (loaded on first use)."""
        if self._engine is None:
            from ..engine.engine import RelayEngine

            self._engine = RelayEngine.shared(
                self.large, self.small, device=self.device, dtype=self.dtype, compile=self.compile
            )
        return self._engine
