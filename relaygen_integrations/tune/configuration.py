"""One configuration per engine: who writes, speculation, verification, weight formats, draft vocabulary.

It comes from exactly one of three places, read once when a pair loads (``RelayEngine.from_pretrained``):

- **tuned** - a known pair whose profile has a ``"tuning"`` entry, on a machine where tuning is on and the caller
  left every setting at ``"auto"``: the fastest accuracy-backed candidate on this machine (``tuner.py``);
- **profile** - the pair's shipped profile entries (``mode``, ``speculative``, ``verify``, ``dtype`` per device type,
  ``draft_vocab``: each chosen from a benchmark run the entry names), when tuning is off (``RELAYGEN_TUNE=off``),
  impossible, or the caller set some settings explicitly (those win; the rest come from the profile);
- **generic** - a pair without a profile: relay, no speculation or verification, bf16, the whole vocabulary.

Its ``describe()`` is what ``response_metadata["relaygen"]["configuration"]`` (LangChain), ``raw`` (LlamaIndex) and
``relaygen tune --explain`` show.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict

from ..engine.core.cues import shipped_profile
from ..engine.core.spans import MODES
from .candidates import Candidate, split_mode

logger = logging.getLogger(__name__)

SETTINGS = ("mode", "speculative", "verify", "dtype", "draft_vocab")


class PairConfiguration(BaseModel):
    """The settings an engine runs by default, and where they came from."""

    model_config = ConfigDict(frozen=True)

    mode: str = "relay"
    speculative: bool | int = False
    verify: str | None = None
    dtype: str = "auto"
    draft_vocab: int | None = None
    compile: bool = False  # compiled one-token steps (a format named ``+compile`` in the cost table)
    source: str = "generic"  # "tuned", "profile" or "generic"
    candidate: str | None = None  # the benchmark mode it runs (``large-spec#bf16/int8``), when tuned
    machine: str | None = None  # the tuned machine's key (``machine.py``)
    predicted_speedup: float | None = None  # over the large model alone in bf16, on that machine

    def describe(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)

    @classmethod
    def shipped(cls, pair_name: str | None, device: torch.device) -> PairConfiguration:
        """The pair's profile entries, read once (module docstring); generic defaults without a profile."""
        path = shipped_profile(pair_name)
        if path is None:
            return cls()
        profile = json.loads(path.read_text(encoding="utf-8"))

        def value(key: str, field: str) -> Any:
            entry = profile.get(key)
            return entry.get(field) if isinstance(entry, Mapping) else entry

        mode = value("mode", "mode")
        speculative = value("speculative", "draft")
        verify = value("verify", "rule")
        dtype = value("dtype", device.type)
        draft_vocab = value("draft_vocab", "size")
        return cls(
            mode=mode if mode in MODES else "relay",
            speculative=speculative if isinstance(speculative, (bool, int)) else False,
            verify=verify if isinstance(verify, str) else None,
            dtype=dtype if isinstance(dtype, str) else "auto",
            draft_vocab=int(draft_vocab) if isinstance(draft_vocab, int) else None,
            source="profile",
        )

    @classmethod
    def from_candidate(cls, candidate: Candidate, speedup: float, machine: str) -> PairConfiguration:
        """The engine settings that run ``candidate`` (a benchmark mode name, ``relay-spec+verify@prob:0.2#bf16``)."""
        base, large, small = split_mode(candidate.name)
        compiled = large.endswith("+compile") or small.endswith("+compile")
        large, small = large.removesuffix("+compile"), small.removesuffix("+compile")
        head, _, rule = base.partition("@")
        speculative = "-spec" in head
        mode = head.split("+")[0].removesuffix("-spec")
        return cls(
            mode=mode,
            speculative=speculative,
            verify=rule if "+verify" in head else None,
            dtype=large if large == small else f"{large}/{small}",
            draft_vocab=candidate.draft_vocab if speculative else None,
            compile=compiled,
            source="tuned",
            candidate=candidate.name,
            machine=machine,
            predicted_speedup=round(speedup, 3),
        )

    def override(self, explicit: Mapping[str, Any]) -> PairConfiguration:
        """This configuration with the caller's explicit settings (anything but ``"auto"``) in place."""
        given = {k: v for k, v in explicit.items() if k in SETTINGS and not (isinstance(v, str) and v == "auto")}
        if not given:
            return self
        if "verify" in given and given["verify"] is not None and not isinstance(given["verify"], str):
            given["verify"] = str(given["verify"])
        if "dtype" in given and not isinstance(given["dtype"], str):
            given["dtype"] = _dtype_name(given["dtype"])
        return self.model_copy(update=given | {"candidate": None, "predicted_speedup": None})


def _dtype_name(dtype: Any) -> str:
    if isinstance(dtype, torch.dtype):
        return str(dtype).removeprefix("torch.")
    if isinstance(dtype, Mapping):
        large = dtype.get("large", dtype.get("small"))
        small = dtype.get("small", large)
        return f"{_dtype_name(large)}/{_dtype_name(small)}"
    return str(dtype)


def configure_pair(
    pair_name: str | None, device: torch.device, explicit: Mapping[str, Any], *, show_progress: bool = True
) -> PairConfiguration:
    """The configuration an engine over ``pair_name`` runs (module docstring). Tuning measures this machine at a
    pair's first use here (cached after); a failure to tune falls back to the profile with a warning."""
    from .tuner import tune_pair, tuning_enabled

    shipped = PairConfiguration.shipped(pair_name, device)
    explicit_given = any(not (isinstance(explicit.get(k, "auto"), str) and explicit.get(k) == "auto")
                         for k in SETTINGS if k in explicit)  # fmt: skip
    if pair_name is None or shipped.source != "profile" or explicit_given or not tuning_enabled():
        return shipped.override(explicit)
    path = shipped_profile(pair_name)
    assert path is not None
    profile = json.loads(path.read_text(encoding="utf-8"))
    if "tuning" not in profile:
        return shipped
    try:
        tuned = tune_pair(pair_name, profile, device, show_progress=show_progress)
    except (ValueError, OSError, RuntimeError) as exc:
        logger.warning("tuning %s on this machine failed (%s); running the profile's configuration", pair_name, exc)
        return shipped
    winner = tuned.choice.winner
    return PairConfiguration.from_candidate(winner.candidate, winner.speedup, tuned.machine.key())
