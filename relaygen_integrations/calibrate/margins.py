"""Cue calibration (RelayGen's probability-margin test), framework-free.

1. The large model writes traces on calibration problems (greedy, ``mode="large"``).
2. Each trace is teacher-forced through the *small* model in one forward pass; per completion token we take the
   small model's probability margin top-1 − top-2 at the position that predicts it.
3. For each candidate cue, the margins of the tokens that follow each occurrence (word boundaries as in the policy)
   up to the sentence end are pooled.
4. Per cue: occurrences, mean margin, delta = mean − overall mean. Cues with delta > threshold and enough
   occurrences are selected: after them the small model is more confident than usual, so it can write the sentence.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from transformers import PreTrainedTokenizerBase

from ..engine.core.cues import has_left_boundary, is_word_char
from ..engine.core.detokenize import IncrementalDetokenizer
from ..engine.core.policy import is_sentence_end_period


@dataclass
class Trace:
    """One large-model answer: its prompt ids and completion ids (text is derived, kept for reading)."""

    prompt_ids: list[int]
    completion_ids: list[int]
    text: str = ""


@dataclass
class CueStats:
    cue: str
    occurrences: int = 0
    traces: int = 0  # distinct traces it occurs in: a cue seen in one problem only is that problem's vocabulary
    tokens: int = 0
    mean_margin: float = 0.0
    delta: float = 0.0
    source: str = "candidates"
    selected: bool = False


@dataclass
class CalibrationResult:
    overall_mean_margin: float
    total_tokens: int
    table: list[CueStats] = field(default_factory=list)

    @property
    def selected(self) -> list[str]:
        return [row.cue for row in self.table if row.selected]


def token_char_ends(tokenizer: PreTrainedTokenizerBase, completion_ids: Sequence[int]) -> tuple[str, list[int]]:
    """The text and, per token, the character offset where its text ends (same detokenizer as the engine)."""
    detok = IncrementalDetokenizer(tokenizer)
    ends = []
    for token in completion_ids:
        detok.push(token)
        ends.append(len(detok.text))
    detok.flush()
    return detok.text, ends


def sentence_end(text: str, start: int) -> int:
    """Offset just after the end of the sentence that starts at ``start`` (policy rules), or len(text)."""
    paragraph = text.find("\n\n", start)
    limit = len(text) if paragraph < 0 else paragraph + 2
    for index in range(start, min(limit, len(text) - 1)):
        if text[index] in ".!?" and text[index + 1].isspace() and is_sentence_end_period(text, index):
            return index + 1
    return limit


def cue_occurrences(text: str, cue: str) -> Iterable[int]:
    """End offsets of ``cue`` in ``text`` at word boundaries on both sides (policy semantics)."""
    for match in re.finditer(re.escape(cue), text):
        start, end = match.start(), match.end()
        if not has_left_boundary(text, start):
            continue
        if is_word_char(cue[-1]) and end < len(text) and is_word_char(text[end]):
            continue
        yield end


def calibrate(
    traces: Sequence[Trace],
    margins: Sequence[Sequence[float]],
    tokenizer: PreTrainedTokenizerBase,
    candidates: Sequence[str],
    extra_candidates: Sequence[str] = (),
    threshold: float = 0.0,
    min_occurrences: int = 3,
    min_traces: int = 3,
) -> CalibrationResult:
    """Scores every candidate cue by the small model's mean margin on the sentence that follows it.

    Selected: delta > ``threshold``, at least ``min_occurrences`` occurrences, in at least ``min_traces`` distinct
    traces (without the last rule a name repeated in one problem's answer, e.g. "Bella", passes as a cue).
    """
    pooled: dict[str, list[float]] = {cue: [] for cue in [*candidates, *extra_candidates]}
    counts: Counter[str] = Counter()
    trace_counts: Counter[str] = Counter()
    all_margins: list[float] = []
    for trace, trace_margins in zip(traces, margins, strict=True):
        text, ends = token_char_ends(tokenizer, trace.completion_ids)
        all_margins.extend(trace_margins)
        starts = [0, *ends[:-1]]
        for cue in pooled:
            seen_in_trace = False
            for cue_end in cue_occurrences(text, cue):
                stop = sentence_end(text, cue_end)
                # Tokens that begin at or after the cue's end and before the sentence end: what the small model
                # would write after this cue.
                segment = [m for m, s in zip(trace_margins, starts, strict=True) if cue_end <= s < stop]
                if segment:
                    counts[cue] += 1
                    pooled[cue].extend(segment)
                    seen_in_trace = True
            trace_counts[cue] += seen_in_trace
    overall = sum(all_margins) / len(all_margins) if all_margins else 0.0
    result = CalibrationResult(overall_mean_margin=overall, total_tokens=len(all_margins))
    extra = set(extra_candidates) - set(candidates)
    for cue, values in pooled.items():
        mean = sum(values) / len(values) if values else 0.0
        row = CueStats(cue, counts[cue], trace_counts[cue], len(values), mean, mean - overall if values else 0.0)
        row.source = "traces" if cue in extra else "candidates"
        row.selected = (
            bool(values) and row.delta > threshold and row.occurrences >= min_occurrences and row.traces >= min_traces
        )
        result.table.append(row)
    result.table.sort(key=lambda r: (-r.selected, -r.delta))
    return result


# Line-initial list markers ("1.", "2."); "Step N:" headers are caught as the sentence-initial word "Step".
_STRUCTURAL = re.compile(r"(?:^|\n)[ \t]*(\d{1,2}\.)(?= )")


def trace_candidates(texts: Iterable[str], top: int = 30, min_count: int = 3) -> list[str]:
    """Candidates found in the traces themselves: frequent sentence-initial words (with their comma when they
    usually carry one) and structural openers ("Step 1:", list markers) — to be scored by the same margin test.

    Counted once per trace (a word must open sentences in ``min_count`` different traces), so the names and nouns
    of a single problem are not proposed."""
    words: Counter[str] = Counter()
    structural: Counter[str] = Counter()
    for text in texts:
        words.update({m.group(1) for m in re.finditer(r"(?:^|[.!?]\s+|\n\s*)([A-Z][a-z]+,?)", text)})
        structural.update({m.group(1) for m in _STRUCTURAL.finditer(text)})
    found = [w for w, c in words.most_common(top) if c >= min_count]
    found += [s for s, c in structural.most_common(10) if c >= min_count]
    return list(dict.fromkeys(found))


def tokenizer_hash(tokenizer: PreTrainedTokenizerBase) -> str:
    """Identity of a vocabulary (profiles are only valid for the tokenizer they were measured with)."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    return hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()[:16]


def write_profile(
    path: Path,
    result: CalibrationResult,
    pair: dict[str, Any],
    settings: dict[str, Any],
    verified: dict[str, Any] | None = None,
    selected_cues: list[str] | None = None,
) -> dict[str, Any]:
    """The profile: the margin test's table, and with ``verified`` (``calibrate_verified.verified_profile_entry``)
    the verified table whose selection (``selected_cues``) is then the one the engine uses."""
    profile = {
        "format": 1,
        "pair": pair,
        "settings": settings,
        "overall_mean_margin": result.overall_mean_margin,
        "total_tokens": result.total_tokens,
        "table": [asdict(row) for row in result.table],
        "selected_cues": result.selected if selected_cues is None else selected_cues,
        "candidates": [row.cue for row in result.table],
    }
    if verified is not None:
        profile["verified"] = verified
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(profile, indent=2, ensure_ascii=False))
    return profile


def plot_margins(path: Path, result: CalibrationResult, limit: int = 40) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in result.table if r.occurrences][:limit]
    fig, ax = plt.subplots(figsize=(max(6, len(rows) * 0.3), 4))
    colours = ["#c026d3" if r.selected else "#9ca3af" for r in rows]
    ax.bar(range(len(rows)), [r.mean_margin for r in rows], color=colours)
    ax.axhline(result.overall_mean_margin, color="#1f6feb", linestyle="--", label="overall mean margin")
    ax.set_xticks(range(len(rows)), [repr(r.cue)[1:-1] for r in rows], rotation=70, fontsize=8)
    ax.set_ylabel("small-model mean margin after cue")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
