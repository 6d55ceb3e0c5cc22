"""Verified calibration: score each candidate cue by what verified relay will do with it on this pair and machine.

The margin test (``calibrate.py``) asks whether the small model is *confident* after a cue. Under verified relay
what matters is whether the large model *keeps* what the small model writes there, and whether keeping it is cheaper
than the pair's speculative baseline writing the same tokens. So, per candidate cue:

1. In every large-model trace, at every occurrence of the cue (word boundaries as in the policy), the small model
   writes the sentence greedily from the trace prefix, up to the sentence end (``calibrate.sentence_end``) or
   ``max_sentence_tokens`` - exactly what relay would have it write there.
2. The large model scores that sentence in one pass (``ModelRunner.score``, the pass verified relay runs) and the
   pair's rule (``VerifyRule.first_rejected``) decides how many tokens it keeps: ``kept`` of ``written``.
3. The time that occurrence saves, at the measured costs (:class:`PairCosts`): the baseline would write the kept
   tokens and the large model's next token (``kept + 1``) at its all-in cost per token; relay spends ``written``
   small-model tokens and one verification pass over ``written + 1`` positions, and gets the same ``kept + 1``
   tokens (the row after the last kept token is the large model's own next token, as in speculation)::

       saved_ms = (kept + 1) * baseline_token_ms - (written * small_token_ms + verify_pass_ms(written + 1))

4. A cue is selected when its occurrences save time in total (and it occurs often enough, in enough traces): a cue
   whose sentences the large model rejects costs small-model tokens and buys nothing, however confident the small
   model was. Possibly no cue pays; then relay should not switch on this pair.

Occurrences at the same token position (``Therefore`` and ``Therefore,`` in one trace) are run once. The runners'
caches are reused along a trace (``ModelRunner.sync_to`` crops back to the shared prefix), so each trace is
prefilled once per model and each occurrence costs its sentence's decode steps and one scoring pass.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from transformers import PreTrainedTokenizerBase

from ..engine.core.verify import VerifyRule
from ..engine.local.runner import ModelRunner
from .margins import CalibrationResult, Trace, cue_occurrences, sentence_end, token_char_ends

# Sentences longer than this are cut in the trial as relay's policy cuts a small segment (its default cap).
DEFAULT_MAX_SENTENCE_TOKENS = 64


@dataclass(frozen=True)
class PairCosts:
    """Measured costs (milliseconds) that decide whether a small sentence pays: one small-model token, one large-model
    token under the pair's speculative baseline (``large-spec``: all its seconds over all its tokens), and the large
    model's pass over ``n`` positions (``benchmarks/pass_cost.py``: piecewise linear between measured ``k``)."""

    small_token_ms: float
    baseline_token_ms: float
    pass_ms: dict[int, float]  # positions -> ms per pass

    def verify_pass_ms(self, positions: int) -> float:
        ks = sorted(self.pass_ms)
        if positions <= ks[0]:
            return self.pass_ms[ks[0]]
        if positions >= ks[-1]:  # past the table: the last segment's slope (passes grow about linearly there)
            a, b = ks[-2], ks[-1]
        else:
            index = bisect.bisect_left(ks, positions)
            a, b = ks[index - 1], ks[index]
        slope = (self.pass_ms[b] - self.pass_ms[a]) / (b - a)
        return self.pass_ms[a] + slope * (positions - a)

    def saved_ms(self, written: int, kept: int) -> float:
        return (kept + 1) * self.baseline_token_ms - (written * self.small_token_ms + self.verify_pass_ms(written + 1))


@dataclass(frozen=True)
class SentenceTrial:
    """The small model's sentence at one position of one trace, and what the large model kept of it."""

    written: int
    kept: int


@dataclass
class VerifiedCueStats:
    cue: str
    occurrences: int = 0
    traces: int = 0
    written: int = 0  # small-model tokens written over all occurrences
    kept: int = 0  # of which the large model kept
    saved_ms: float = 0.0  # total over occurrences, against the speculative baseline
    mean_margin: float | None = None  # the margin test's column, when it ran
    delta: float | None = None
    selected: bool = False

    @property
    def rejected_share(self) -> float:
        return 1 - self.kept / self.written if self.written else 0.0

    @property
    def saved_ms_per_occurrence(self) -> float:
        return self.saved_ms / self.occurrences if self.occurrences else 0.0


@dataclass
class VerifiedCalibration:
    rule: str
    costs: PairCosts
    table: list[VerifiedCueStats] = field(default_factory=list)

    @property
    def selected(self) -> list[str]:
        return [row.cue for row in self.table if row.selected]


def cue_token_positions(text: str, ends: Sequence[int], cue: str) -> list[int]:
    """Token indices where the small model would start after ``cue``: the first token that begins at or after each
    occurrence's end (the policy switches once the cue's text is complete)."""
    starts = [0, *ends[:-1]]
    positions = []
    for cue_end in cue_occurrences(text, cue):
        index = bisect.bisect_left(starts, cue_end)
        if index < len(starts) and sentence_end(text, cue_end) > cue_end:
            positions.append(index)
    return positions


def write_sentence(
    small: ModelRunner,
    tokenizer: PreTrainedTokenizerBase,
    ids: list[int],
    prefix_text: str,
    eos_ids: frozenset[int],
    max_tokens: int,
) -> list[int]:
    """The small model's greedy sentence after ``ids`` (whose completion text is ``prefix_text``): up to and
    including the token that ends the sentence, an end-of-sequence token excluded, at most ``max_tokens``."""
    small.sync_to(ids)
    sentence: list[int] = []
    while len(sentence) < max_tokens:
        token = int(small.logits_for(ids + sentence).argmax())
        if token in eos_ids:
            break
        sentence.append(token)
        text = prefix_text + tokenizer.decode(sentence)
        if sentence_end(text, len(prefix_text)) < len(text):  # the sentence ended inside this token
            break
    return sentence


def run_trials(
    traces: Sequence[Trace],
    positions: dict[int, set[int]],
    small: ModelRunner,
    large: ModelRunner,
    tokenizer: PreTrainedTokenizerBase,
    rule: VerifyRule,
    eos_ids: frozenset[int],
    max_sentence_tokens: int = DEFAULT_MAX_SENTENCE_TOKENS,
    progress: Callable[[int], None] | None = None,
) -> dict[tuple[int, int], SentenceTrial]:
    """One trial per (trace, token position) asked for: the small model writes, the large model scores."""
    trials: dict[tuple[int, int], SentenceTrial] = {}
    for index, trace in enumerate(traces):
        wanted = sorted(positions.get(index, ()))
        if not wanted:
            continue
        for runner in (small, large):
            runner.begin_request(list(trace.prompt_ids), reuse_prefix=False)
        text, ends = token_char_ends(tokenizer, trace.completion_ids)
        for position in wanted:
            ids = list(trace.prompt_ids) + list(trace.completion_ids[:position])
            prefix_text = text[: ends[position - 1]] if position else ""
            sentence = write_sentence(small, tokenizer, ids, prefix_text, eos_ids, max_sentence_tokens)
            kept = 0
            if sentence:
                rows = large.score(ids + sentence, len(ids))
                rejected = rule.first_rejected(rows[: len(sentence)], sentence)
                kept = len(sentence) if rejected is None else rejected
            trials[(index, position)] = SentenceTrial(len(sentence), kept)
            if progress is not None:
                progress(1)
    return trials


def verified_calibrate(
    traces: Sequence[Trace],
    tokenizer: PreTrainedTokenizerBase,
    candidates: Sequence[str],
    run: Callable[[dict[int, set[int]]], dict[tuple[int, int], SentenceTrial]],
    costs: PairCosts,
    rule: VerifyRule,
    margins: CalibrationResult | None = None,
    min_occurrences: int = 3,
    min_traces: int = 3,
) -> VerifiedCalibration:
    """The verified table: ``run`` performs the trials (``run_trials`` bound to a pair) for the positions every
    candidate needs; a candidate seen fewer than ``min_occurrences`` times or in fewer than ``min_traces`` traces is
    listed but never run nor selected. ``margins``: the margin test's result, kept as a column."""
    found: dict[str, list[tuple[int, int]]] = {}
    for index, trace in enumerate(traces):
        text, ends = token_char_ends(tokenizer, trace.completion_ids)
        for cue in candidates:
            found.setdefault(cue, []).extend((index, p) for p in cue_token_positions(text, ends, cue))
    eligible = {
        cue for cue, where in found.items()
        if len(where) >= min_occurrences and len({t for t, _ in where}) >= min_traces
    }  # fmt: skip
    needed: dict[int, set[int]] = {}
    for cue in eligible:
        for trace_index, position in found[cue]:
            needed.setdefault(trace_index, set()).add(position)
    trials = run(needed) if needed else {}
    by_margin = {row.cue: row for row in margins.table} if margins is not None else {}
    result = VerifiedCalibration(rule.spec, costs)
    for cue in candidates:
        where = found.get(cue, [])
        row = VerifiedCueStats(cue, len(where), len({t for t, _ in where}))
        if cue in by_margin:
            row.mean_margin, row.delta = by_margin[cue].mean_margin, by_margin[cue].delta
        if cue in eligible:
            for key in where:
                trial = trials[key]
                row.written += trial.written
                row.kept += trial.kept
                row.saved_ms += costs.saved_ms(trial.written, trial.kept)
            row.selected = row.saved_ms > 0
        result.table.append(row)
    result.table.sort(key=lambda r: (-r.selected, -r.saved_ms_per_occurrence, -r.occurrences))
    return result


def costs_from_runs(
    bench_results: dict[str, Any], pass_cost: dict[str, Any], large_format: str, mode: str | None = None
) -> PairCosts:
    """:class:`PairCosts` from what was measured on this machine: a saved ``relaygen bench`` run and
    ``benchmarks/pass_cost.py``'s table for the large model in ``large_format``.

    The baseline is ``mode`` (default: the run's first ``large-spec`` mode): the fastest way the large model writes
    alone in those formats - speculation where it pays, plain ``large`` where drafting costs more than it saves (int8
    under int8 on AVX-512 CPUs). Its all-in seconds per token is the baseline's cost. The small model's cost per token
    is the baseline's own (speculative: drafted and written tokens) or, for a plain baseline, the run's first relay
    mode's sentence time per small token written."""
    summary = bench_results["summary"]
    if mode is None:
        mode = next((m for m in summary if m.split("#", 1)[0].split("@", 1)[0] == "large-spec"), None)
    if mode is None or mode not in summary:
        raise ValueError(f"the bench run has no baseline mode {mode or 'large-spec'!r}: modes {list(summary)}")
    entry = summary[mode]
    small_ms = None
    for other in summary.values():  # what a sentence token costs: measured where the small model wrote sentences
        split, written = other.get("time_split_s", {}), other.get("kept_small_per_problem", 0.0)
        written += other.get("rejected_per_problem", 0.0)
        if split.get("small.decode") and written:
            small_ms = 1000 * split["small.decode"] / written
            break
    small_ms = entry.get("ms_per_small_token") if small_ms is None else small_ms  # else a drafted token's
    if small_ms is None:
        raise ValueError(f"the bench run recorded no small-model cost per token (mode {mode!r} does not draft and no"
                         " verified relay mode has a time split)")  # fmt: skip
    try:
        table = pass_cost["seconds"]["large"][large_format]
    except KeyError:
        raise ValueError(f"the pass-cost table has no large-model row for {large_format!r}") from None
    return PairCosts(
        small_token_ms=float(small_ms),
        baseline_token_ms=1000 * float(entry["s_per_token"]),
        pass_ms={int(k): 1000 * float(v) for k, v in table.items()},
    )


def verified_profile_entry(result: VerifiedCalibration, sources: dict[str, str]) -> dict[str, Any]:
    """The profile's ``"verified"`` section: the rule, the costs and where they were measured, the table."""
    rows = []
    for row in result.table:
        data = asdict(row) | {
            "rejected_share": row.rejected_share,
            "saved_ms_per_occurrence": row.saved_ms_per_occurrence,
        }
        rows.append(data)
    return {"rule": result.rule, "costs": asdict(result.costs), "sources": sources, "table": rows,
            "selected_cues": result.selected}  # fmt: skip


def plot_verified(path: Path, result: VerifiedCalibration, limit: int = 40) -> None:
    """Time saved per occurrence against the speculative baseline (selected cues coloured), with each cue's share
    of rejected small tokens above its bar."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in result.table if r.written][:limit]
    fig, ax = plt.subplots(figsize=(max(6, len(rows) * 0.35), 4))
    values = [r.saved_ms_per_occurrence for r in rows]
    ax.bar(range(len(rows)), values, color=["#c026d3" if r.selected else "#9ca3af" for r in rows])
    for i, r in enumerate(rows):
        ax.annotate(f"{r.rejected_share:.0%}", (i, values[i]), ha="center", fontsize=6,
                    xytext=(0, 2 if values[i] >= 0 else -8), textcoords="offset points")  # fmt: skip
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xticks(range(len(rows)), [repr(r.cue)[1:-1] for r in rows], rotation=70, fontsize=8)
    ax.set_ylabel("ms saved per occurrence vs speculation")
    ax.set_title(f"verified calibration ({result.rule}): labels = small tokens rejected")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
