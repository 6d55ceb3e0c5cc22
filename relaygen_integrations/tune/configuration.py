"""The configuration an engine over a known pair runs: tuned for this machine where it can be, else the profile's.

``configure_pair`` is what ``RelayEngine.from_pretrained`` asks (``engine/core/configuration.py`` has the object and
its three sources). Tuning runs only for a known pair whose profile has a ``"tuning"`` entry, with tuning on
(``RELAYGEN_TUNE`` not ``off``) and every setting left at ``"auto"``; the first time on a machine it measures (at
most a minute, cached), later it reads the cache. A failure to tune falls back to the profile, with a warning.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch

from ..engine.core.configuration import PairConfiguration, explicit_settings
from ..engine.core.shipped import shipped_profile
from .candidates import LOOKUP_SUFFIX, Candidate, split_mode
from .observed import CostRecorder

logger = logging.getLogger(__name__)


def configuration_for(candidate: Candidate, speedup: float, machine: str) -> PairConfiguration:
    """The engine settings that run ``candidate`` (a benchmark mode name, ``relay-spec+verify@prob:0.2#bf16``)."""
    base, large, small = split_mode(candidate.name)
    compiled = large.endswith("+compile") or small.endswith("+compile")
    large, small = large.removesuffix("+compile"), small.removesuffix("+compile")
    head, _, rule = base.partition("@")
    lookup = LOOKUP_SUFFIX in head
    head = head.replace(LOOKUP_SUFFIX, "")
    speculative = "-spec" in head
    return PairConfiguration(
        mode=head.split("+")[0].removesuffix("-spec"),
        speculative=speculative,
        verify=rule if "+verify" in head else None,
        dtype=large if large == small else f"{large}/{small}",
        draft_vocab=candidate.draft_vocab if speculative else None,
        prompt_lookup=lookup,
        compile=compiled,
        source="tuned",
        candidate=candidate.name,
        machine=machine,
        predicted_speedup=round(speedup, 3),
    )


def cost_recorder(pair_name: str | None, configuration: PairConfiguration) -> CostRecorder | None:
    """What records an engine's pass costs for the next choice (``observed.py``): only for a configuration tuned on
    this machine, whose cache file the observations join; None otherwise (nothing to correct)."""
    from .tuner import cache_path, tuning_enabled

    if pair_name is None or configuration.source != "tuned" or not configuration.machine or not tuning_enabled():
        return None
    path = cache_path(pair_name, configuration.machine)
    if configuration.candidate is None or not path.exists():
        return None
    _, large, small = split_mode(configuration.candidate)
    return CostRecorder(path, {"large": large, "small": small})


def configure_pair(
    pair_name: str | None, device: torch.device, explicit: Mapping[str, Any], *, show_progress: bool = True
) -> PairConfiguration:
    """The configuration an engine over ``pair_name`` runs (module docstring)."""
    from .tuner import tune_pair, tuning_enabled

    shipped = PairConfiguration.shipped(pair_name, device.type)
    if pair_name is None or shipped.source != "profile" or explicit_settings(explicit) or not tuning_enabled():
        return shipped.override(explicit)
    profile = shipped_profile(pair_name)
    if profile is None or profile.tuning is None:
        return shipped
    try:
        tuned = tune_pair(pair_name, profile.data, device, show_progress=show_progress)
    except (ValueError, OSError, RuntimeError) as exc:
        logger.warning("tuning %s on this machine failed (%s); running the profile's configuration", pair_name, exc)
        return shipped
    winner = tuned.choice.winner
    return configuration_for(winner.candidate, winner.speedup, tuned.machine.key())
