"""What a known pair ships: its profile, read once and asked everything.

A known pair (``demo``) ships ``relaygen_integrations/profiles/<pair>.json``, written offline: calibration writes its
cues (``selected_cues``, ``candidates``, the margin table), ``relaygen tune --profile-from`` its ``tuning`` entry,
and each default setting's entry (``mode``, ``speculative``, ``verify``, ``dtype``, ``draft_vocab``) names the
benchmark run that chose it. Every reader - the pair's configuration (``configuration.py``), its cues (``cues.py``),
the tuner, the benchmark's predictions, ``relaygen tune`` - asks :func:`shipped_profile`; the file is parsed once per
process and handed out read-only, so no reader can change what another reads.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any

TUNING_KEY = "tuning"  # the tuner's entry: the pair's benchmarked modes (``tune/profile.py`` writes it)


@dataclass(frozen=True)
class ShippedProfile:
    """A pair's profile: ``data`` is the parsed file, read-only."""

    path: Path
    data: Mapping[str, Any]

    @classmethod
    def read(cls, path: str | Path) -> ShippedProfile:
        """Parses a profile file (a shipped one, or ``relaygen tune --profile``'s)."""
        path = Path(path)
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict):
            raise ValueError(f"profile {path} is not a JSON object")
        return cls(path, _read_only(data))

    def setting(self, key: str, field: str) -> Any:
        """A default setting's value: ``field`` of the entry ``key`` (``{"mode": {"mode": "large", "benchmark":
        ...}}``), or the entry itself where it is a bare value; None where the profile has none."""
        entry = self.data.get(key)
        return entry.get(field) if isinstance(entry, Mapping) else entry

    @property
    def tuning(self) -> Mapping[str, Any] | None:
        """The tuner's entry, if the pair has been profiled for it."""
        entry = self.data.get(TUNING_KEY)
        return entry if isinstance(entry, Mapping) else None


def shipped_profile_path(pair_name: str | None) -> Path | None:
    """Where a known pair's profile lies in the installed package, if it ships one."""
    if not pair_name:
        return None
    candidate = resources.files("relaygen_integrations") / "profiles" / f"{pair_name}.json"
    return Path(str(candidate)) if candidate.is_file() else None


@functools.cache
def shipped_profile(pair_name: str | None) -> ShippedProfile | None:
    """The profile a known pair ships (parsed once per process), or None for a pair without one."""
    path = shipped_profile_path(pair_name)
    return ShippedProfile.read(path) if path is not None else None


def _read_only(value: Any) -> Any:
    if isinstance(value, dict):
        return MappingProxyType({key: _read_only(item) for key, item in value.items()})
    if isinstance(value, list):
        return tuple(_read_only(item) for item in value)
    return value
