"""One configuration per engine: who writes, speculation, verification, weight formats, draft vocabulary.

A known pair's defaults used to be looked up entry by entry (mode, speculation, rule, formats, draft vocabulary, each
in its own file); :class:`PairConfiguration` reads the profile once and is the one object every layer asks. It comes
from exactly one of three places (``source``):

- **tuned** - chosen for this machine by the tuner (``relaygen_integrations/tune/``): a known pair whose profile has
  a ``"tuning"`` entry, tuning on, every setting left at ``"auto"``;
- **profile** - the pair's shipped profile entries (``mode``, ``speculative``, ``verify``, ``dtype`` per device type,
  ``draft_vocab``: each chosen from a benchmark run the entry names), with the caller's explicit settings in place;
- **generic** - a pair without a profile: relay, no speculation or verification, bf16, the whole vocabulary.

``describe()`` is what ``response_metadata["relaygen"]["configuration"]`` (LangChain), ``raw["configuration"]``
(LlamaIndex) and ``relaygen tune`` show. No torch here: devices are named by their type (``"cpu"``, ``"cuda"``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

from .shipped import shipped_profile
from .spans import MODES

SETTINGS = ("mode", "speculative", "verify", "dtype", "draft_vocab", "prompt_lookup")


class PairConfiguration(BaseModel):
    """The settings an engine runs by default, and where they came from."""

    model_config = ConfigDict(frozen=True)

    mode: str = "relay"
    speculative: bool | int = False
    verify: str | None = None
    dtype: str = "auto"  # per-model formats, "LARGE/SMALL" (``engine/local/weights.pick_pair_weights``)
    draft_vocab: int | None = None
    prompt_lookup: bool = False  # drafts copied from the context first (``engine/local/prompt_lookup.py``)
    compile: bool = False  # compiled one-token steps (a format named ``+compile`` in a tuner's cost table)
    source: str = "generic"  # "tuned", "profile" or "generic"
    candidate: str | None = None  # the benchmark mode it runs (``large-spec#bf16/int8``), when tuned
    machine: str | None = None  # the tuned machine's key (``tune/machine.py``)
    predicted_speedup: float | None = None  # over the large model alone in bf16, on that machine

    def describe(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)

    @classmethod
    def shipped(cls, pair_name: str | None, device_type: str = "cpu") -> PairConfiguration:
        """The pair's profile entries, read once (module docstring); generic defaults without a profile. An entry
        that names nothing valid is ignored (its setting keeps the generic default), not passed on."""
        profile = shipped_profile(pair_name)
        if profile is None:
            return cls()
        value = profile.setting
        mode, speculative, verify = value("mode", "mode"), value("speculative", "draft"), value("verify", "rule")
        dtype, draft_vocab = value("dtype", device_type), value("draft_vocab", "size")
        return cls(
            mode=mode if mode in MODES else "relay",
            speculative=speculative if isinstance(speculative, (bool, int)) else False,
            verify=verify if isinstance(verify, str) else None,
            dtype=dtype if isinstance(dtype, str) else "auto",
            draft_vocab=draft_vocab if isinstance(draft_vocab, int) and not isinstance(draft_vocab, bool) else None,
            source="profile",
        )

    def override(self, explicit: Mapping[str, Any]) -> PairConfiguration:
        """This configuration with the caller's explicit settings (anything but ``"auto"``) in place."""
        given = {k: v for k, v in explicit.items() if k in SETTINGS and not _is_auto(v)}
        if not given:
            return self
        if given.get("verify") is not None and not isinstance(given["verify"], str):
            given["verify"] = str(given["verify"])
        if "dtype" in given and not isinstance(given["dtype"], str):
            given["dtype"] = _dtype_name(given["dtype"])
        return self.model_copy(update=given | {"candidate": None, "predicted_speedup": None})


def explicit_settings(explicit: Mapping[str, Any]) -> bool:
    """Whether the caller gave any of the configuration's settings (anything but ``"auto"``)."""
    return any(not _is_auto(explicit[k]) for k in SETTINGS if k in explicit)


def pair_formats(pair_name: str | None, device_type: str, dtype: Any) -> Any:
    """``dtype`` as given, or for ``"auto"`` the formats the pair's shipped configuration names on this device type
    (``"auto"`` again - bf16 - for a pair without one)."""
    return PairConfiguration.shipped(pair_name, device_type).dtype if _is_auto(dtype) else dtype


def _is_auto(value: Any) -> bool:
    return isinstance(value, str) and value == "auto"


def _dtype_name(dtype: Any) -> str:
    if isinstance(dtype, Mapping):
        large = dtype.get("large", dtype.get("small"))
        small = dtype.get("small", large)
        return f"{_dtype_name(large)}/{_dtype_name(small)}"
    return str(dtype).removeprefix("torch.")
