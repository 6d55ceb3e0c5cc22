"""Switch cues: presets, calibrated profiles, and word-boundary matching.

A cue is a discourse word (optionally followed by punctuation or a space) after which the small model writes the rest
of the sentence. Matching is done on text, never on token ids, so it is tokenizer-independent: "Now" must not match
inside "Know" (left boundary) nor "Nowhere" (right boundary, which is only known once the *next* token arrives).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .shipped import shipped_profile

# RelayGen's candidate list (paper's calibration candidates; jiwonsong-dev/RelayGen utils/utils.py DEFAULT_CUE_TOKENS).
PAPER_CANDIDATES: tuple[str, ...] = (
    "Therefore", "Therefore,", "Thus", "Thus,", "So,", "So ", "Similarly", "Similarly,",
    "Also", "Also,", "Alternatively", "Alternatively,", "Wait", "Wait,", "Hmm", "Hmm,",
    "But", "But,", "However", "However,", "Hence", "Hence,", "Another", "Another,",
    "Oh", "Oh,", "Maybe", "Maybe,", "Other", "Other,", "Again", "Again,", "Now", "Now,",
    "Ah", "Ah,", "Any", "Any,", "Specifically", "Specifically,",
    "therefore", "therefore,", "thus", "thus,", "so,", "so ", "similarly", "similarly,",
    "also", "also,", "alternatively", "alternatively,", "wait", "wait,", "hmm", "hmm,",
    "but", "but,", "however", "however,", "hence", "hence,", "another", "another,",
    "oh", "oh,", "maybe", "maybe,", "other", "other,", "again", "again,", "now", "now,",
    "ah", "ah,", "any", "any,", "specifically", "specifically,",
    "check", "double-check", "verify",
    "then", "then,", "Then", "Then,",
    "next", "next,", "Next", "Next,",
)  # fmt: skip

# Calibrated by the paper for Qwen3-1.7B -> Qwen3-32B (AMC 2023).
QWEN3_CUES: tuple[str, ...] = (
    "Oh,", "another,", "Thus", "Now", "Alternatively", "alternatively,", "Thus,", "Therefore", "similarly",
    "similarly,", "now", "Again", "specifically,", "Again,", "Similarly,", "Now,", "Specifically,", "Hence",
    "Similarly", "Other", "now,", "hence", "Specifically", "So ", "Therefore,", "Wait,", "Also", "So,",
)  # fmt: skip

# Calibrated by the paper for DeepSeek-R1-Distill-Qwen-1.5B -> 32B (AMC 2023).
R1_CUES: tuple[str, ...] = (
    "Wait", "Thus", "thus", "similarly", "Again,", "Now", "Therefore", "hence", "Hence,", "Now,", "Thus,", "Oh,",
    "Similarly,", "Any", "Therefore,", "Alternatively,", "now,", "So,", "now", "verify", "Specifically,",
    "Alternatively", "Ah,", "wait", "So ",
)  # fmt: skip

# Conclusion-type openers for non-thinking instruct models, which rarely say "Wait" or "Hmm".
GENERIC_CUES: tuple[str, ...] = (
    "Therefore", "Therefore,", "Thus", "Thus,", "So,", "So ", "Hence", "Hence,", "Now,", "Similarly,", "Since",
)  # fmt: skip

PRESETS: dict[str, tuple[str, ...]] = {
    "qwen3": QWEN3_CUES,
    "r1": R1_CUES,
    "generic": GENERIC_CUES,
    "paper-candidates": PAPER_CANDIDATES,
    "none": (),
}


class CueConfigError(ValueError):
    """A cue preset, list or profile could not be used."""


def is_word_char(char: str) -> bool:
    return char.isalnum() or char == "_"


def has_left_boundary(text: str, start: int) -> bool:
    """True when a match starting at ``start`` does not continue a word ("So" must not match inside "Also")."""
    if start <= 0:
        return True
    return not (is_word_char(text[start - 1]) and is_word_char(text[start]))


def cue_core(cue: str) -> str:
    """The word part of a cue: "So," -> "So", "So " -> "So", "double-check" -> "double-check"."""
    end = len(cue)
    while end > 0 and not is_word_char(cue[end - 1]):
        end -= 1
    return cue[:end]


@dataclass(frozen=True)
class CueSet:
    """An immutable set of cues with the derived lookup tables the policy needs on every token."""

    cues: tuple[str, ...]
    source: str = "custom"

    def __post_init__(self) -> None:
        for cue in self.cues:
            if not isinstance(cue, str) or not cue.strip():
                raise CueConfigError(f"cue {cue!r} is empty or not a string")
            if not is_word_char(cue_core(cue)[:1] or " "):
                raise CueConfigError(f"cue {cue!r} must start with a word character")

    @property
    def cores(self) -> tuple[str, ...]:
        """Distinct word parts, longest first, so "Therefore" is tried before "The"."""
        return tuple(sorted({cue_core(c) for c in self.cues}, key=len, reverse=True))

    @property
    def punctuated(self) -> tuple[str, ...]:
        """Cues that end in a non-word character ("So,"): complete as soon as the text ends with them."""
        return tuple(sorted((c for c in self.cues if c != cue_core(c)), key=len, reverse=True))

    def __len__(self) -> int:
        return len(self.cues)

    def __bool__(self) -> bool:
        return bool(self.cues)


def load_profile(path: str | Path, key: str = "selected_cues") -> CueSet:
    """Reads a calibration profile (``{"selected_cues": [...]}``; ``"cues"`` is accepted too).

    ``key="candidates"`` reads every cue the calibration scored instead of the selected ones.
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise CueConfigError(f"cue profile {path} does not exist") from exc
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CueConfigError(f"cue profile {path} is unreadable or not JSON: {exc}") from exc
    return cues_in(data, key, path)


def cues_in(data: object, key: str, path: Path) -> CueSet:
    """The cues a parsed profile holds under ``key`` (``"selected_cues"``: also its older name, ``"cues"``)."""
    fallback = data.get("cues") if isinstance(data, Mapping) and key == "selected_cues" else None
    cues = data.get(key, fallback) if isinstance(data, Mapping) else None
    if not isinstance(cues, (list, tuple)) or not all(isinstance(c, str) for c in cues):
        raise CueConfigError(f"cue profile {path} has no list of strings under {key!r}")
    return CueSet(tuple(cues), source=str(path) if key == "selected_cues" else f"{path}:{key}")


def resolve_cues(spec: str | list[str] | tuple[str, ...] | CueSet | None, pair_name: str | None = None) -> CueSet:
    """Turns the user's ``cues=`` argument into a CueSet.

    ``"auto"`` uses the calibrated profile shipped for the pair when there is one, else the generic list;
    ``"all-candidates"`` uses every cue that profile's calibration scored (else the paper's candidate list) — the
    uncalibrated upper bound on switching, for comparisons.
    """
    if spec is None:
        return CueSet((), source="none")
    if isinstance(spec, CueSet):
        return spec
    if isinstance(spec, (list, tuple)):
        return CueSet(tuple(spec), source="list")
    if not isinstance(spec, str):
        raise CueConfigError(f"cues must be a preset name, a list of strings or a profile path, not {type(spec)}")
    if spec == "auto":
        profile = shipped_profile(pair_name)
        return (
            cues_in(profile.data, "selected_cues", profile.path) if profile else CueSet(GENERIC_CUES, source="generic")
        )
    if spec == "all-candidates":
        profile = shipped_profile(pair_name)
        if profile:
            return cues_in(profile.data, "candidates", profile.path)
        return CueSet(PAPER_CANDIDATES, source="paper-candidates")
    if spec in PRESETS:
        return CueSet(PRESETS[spec], source=spec)
    if spec.endswith(".json") or Path(spec).is_file():
        return load_profile(spec)
    known = sorted([*PRESETS, "auto", "all-candidates"])
    raise CueConfigError(f"unknown cue preset {spec!r}: use one of {known}, a list of cues, or a profile .json")
