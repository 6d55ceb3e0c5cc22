"""Benchmark summary: per-mode accuracy, speed, small-model share, ideal vs measured speed-up, where the time goes,
verification (rejected small-model tokens) and a paired view against the large model on the same problems.

Holds :class:`Run` and the relay-mode names too, so that ``bench`` (the run) and ``bench_report`` (the outputs) both
build on this module and neither imports ``bench``.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from ..tune.candidates import LOOKUP_SUFFIX

RELAY_MODES = ("relay", "reprompt", "relay-spec")
VERIFY_MODES = ("relay", "relay-spec")  # the relay modes that take a "+verify@<rule>" suffix
VERIFY_SUFFIX = "+verify"
# Drafts copied from the context (prompt lookup): ``large+lookup`` alone, ``large-spec+lookup`` with the small model.
LOOKUP_MODES = ("large" + LOOKUP_SUFFIX, "large-spec" + LOOKUP_SUFFIX)


FORMAT_SEPARATOR = "#"  # "large#int8": a mode run with other weight formats than the run's (``--dtype``)


def split_format(mode: str) -> tuple[str, str | None]:
    """``"relay-spec+verify@prob:0.2#int8/int8"`` -> (``"relay-spec+verify@prob:0.2"``, ``"int8/int8"``): the mode
    and the per-model weight formats it runs with (None: the run's own)."""
    base, separator, formats = mode.partition(FORMAT_SEPARATOR)
    return base, (formats if separator else None)


def is_verify_mode(mode: str) -> bool:
    """``relay+verify@<rule>`` and ``relay-spec+verify@<rule>``: relay whose small segments the large model checks."""
    base = split_format(mode)[0].split("@", 1)[0]
    return base.endswith(VERIFY_SUFFIX) and base.removesuffix(VERIFY_SUFFIX) in VERIFY_MODES


def is_relay_mode(mode: str) -> bool:
    """``relay``, ``reprompt`` and ``relay-spec``, also with a cue set (``relay@generic``, ``relay@all-candidates``)
    or verified (``relay+verify@greedy``, ``relay-spec+verify@prob:0.05``)."""
    return split_format(mode)[0].split("@", 1)[0] in RELAY_MODES or is_verify_mode(mode)


@dataclass
class Run:
    """One mode on one problem."""

    problem: int
    mode: str
    seconds: float
    completion_tokens: int
    finish_reason: str
    text: str
    predicted: str | None
    reference: str
    correct: bool
    small_tokens: int = 0
    switches: int = 0
    catchup_tokens: int = 0
    speculative_rounds: int = 0
    draft_tokens: int = 0
    accepted_draft_tokens: int = 0
    # Of those, copied from the context (prompt lookup: ``engine/local/prompt_lookup.py``) and kept; 0 otherwise.
    lookup_draft_tokens: int = 0
    lookup_accepted_tokens: int = 0
    # Verified relay (0 otherwise, and in results saved before it existed): small-model tokens the large model
    # checked and kept, and those dropped (each rejected token and the rest of its segment; the large model rewrote).
    verified_tokens: int = 0
    rejected_tokens: int = 0
    large_forward_seconds: float = 0.0  # time inside each model's forward passes (engine modes only)
    small_forward_seconds: float = 0.0
    spans: list[dict[str, Any]] = field(default_factory=list)
    # Forward seconds by model and pass kind ("large.decode", "small.draft", ...: ``Usage.time_split``); empty in
    # results saved before it existed and for modes outside the engine.
    time_split: dict[str, float] = field(default_factory=dict)
    # Forward passes by model and positions read (``Usage.passes``, JSON keys as strings) and the prompt's length:
    # what ``relaygen tune`` prices with a machine's pass costs. Empty / 0 in results saved before they existed.
    passes: dict[str, dict[str, int]] = field(default_factory=dict)
    prompt_tokens: int = 0
    # The seconds those passes took, by model and positions read (``Usage.pass_seconds``; empty before it existed):
    # what the machine charged for each size of pass during the run.
    pass_seconds: dict[str, dict[str, float]] = field(default_factory=dict)


def summarize(runs: list[Run], modes: list[str]) -> dict[str, dict[str, Any]]:
    by_mode = {m: [r for r in runs if r.mode == m] for m in modes}
    summary: dict[str, dict[str, Any]] = {}
    for mode, mode_runs in by_mode.items():
        seconds = [r.seconds for r in mode_runs]
        tokens = sum(r.completion_tokens for r in mode_runs)
        summary[mode] = {
            "n": len(mode_runs),
            "accuracy": sum(r.correct for r in mode_runs) / len(mode_runs),
            "mean_s": statistics.mean(seconds),
            "median_s": statistics.median(seconds),
            "mean_tokens": tokens / len(mode_runs),
            "tok_per_s": tokens / sum(seconds) if sum(seconds) else 0.0,
            "s_per_token": sum(seconds) / tokens if tokens else 0.0,
            "cap_hits": sum(r.finish_reason == "length" for r in mode_runs),
        }
    large, small = summary.get("large"), summary.get("small")
    r = small["s_per_token"] / large["s_per_token"] if large and small and large["s_per_token"] else None
    for mode in summary:
        if not is_relay_mode(mode):
            continue
        mode_runs, entry = by_mode[mode], summary[mode]
        total = sum(x.completion_tokens for x in mode_runs)
        f = sum(x.small_tokens for x in mode_runs) / total if total else 0.0
        entry.update(
            small_share=f,
            switches_per_problem=sum(x.switches for x in mode_runs) / len(mode_runs),
            small_segments_per_problem=sum(sp.get("model") == "small" for x in mode_runs for sp in x.spans)
            / len(mode_runs),
            catchup_tokens_per_problem=sum(x.catchup_tokens for x in mode_runs) / len(mode_runs),
        )
        if r is not None and large is not None:
            ideal = 1.0 / ((1 - f) + f * r)
            measured = large["s_per_token"] / entry["s_per_token"] if entry["s_per_token"] else 0.0
            entry.update(r=r, ideal_speedup=ideal, measured_speedup=measured, efficiency=measured / ideal)
    for mode, entry in summary.items():
        mode_runs = by_mode[mode]
        rounds = sum(x.speculative_rounds for x in mode_runs)
        drafted = sum(x.draft_tokens for x in mode_runs)
        if drafted:
            entry.update(
                acceptance_rate=sum(x.accepted_draft_tokens for x in mode_runs) / drafted,
                mean_draft_length=drafted / rounds,
            )
        copied = sum(x.lookup_draft_tokens for x in mode_runs)
        if copied:  # prompt lookup: the share of drafted tokens copied from the context, and their acceptance
            entry.update(
                lookup_share=copied / drafted,
                lookup_acceptance_rate=sum(x.lookup_accepted_tokens for x in mode_runs) / copied,
            )
        large_forward = sum(x.large_forward_seconds for x in mode_runs)
        small_forward = sum(x.small_forward_seconds for x in mode_runs)
        tokens = sum(x.completion_tokens for x in mode_runs)
        if (large_forward or small_forward) and tokens:
            # Where the time goes, per generated token: inside the large model, inside the small one, and the rest
            # (sampling, detokenizing, policy, Python). Speculation adds the verify-pass cost per large forward.
            entry.update(
                large_forward_ms_per_token=1000 * large_forward / tokens,
                small_forward_ms_per_token=1000 * small_forward / tokens,
                other_ms_per_token=1000 * (sum(x.seconds for x in mode_runs) - large_forward - small_forward) / tokens,
            )
            if rounds and drafted:
                entry.update(
                    ms_per_verify_pass=1000 * large_forward / rounds,
                    # Every drafted token and every token the small model writes itself costs it one decode step.
                    ms_per_small_token=1000 * small_forward / (drafted + sum(x.small_tokens for x in mode_runs)),
                    tokens_per_verify_pass=sum(x.completion_tokens - x.small_tokens for x in mode_runs) / rounds,
                )
    if large is not None:
        large_by_problem = {r.problem: r for r in by_mode["large"]}
        for mode, entry in summary.items():
            entry["speedup_vs_large"] = large["s_per_token"] / entry["s_per_token"] if entry["s_per_token"] else 0.0
            # Robust to a few disturbed runs (another process on the machine): the median over problems of the
            # per-problem ratio of seconds per token, each pair measured minutes apart on the same problem.
            ratios = [
                (large_by_problem[r.problem].seconds / large_by_problem[r.problem].completion_tokens)
                / (r.seconds / r.completion_tokens)
                for r in by_mode[mode]
                if r.problem in large_by_problem
                and r.completion_tokens
                and large_by_problem[r.problem].completion_tokens
            ]
            entry["median_speedup_vs_large"] = statistics.median(ratios) if ratios else 0.0
            # Per answer, the headline: what a user waits for. Total large seconds over the mode's on the same
            # problems, and the median over problems of the per-problem ratio (robust to a disturbed run).
            pairs = [(large_by_problem[r.problem], r) for r in by_mode[mode] if r.problem in large_by_problem]
            if pairs and all(r.seconds > 0 for _, r in pairs):
                entry["answer_speedup_vs_large"] = sum(a.seconds for a, _ in pairs) / sum(r.seconds for _, r in pairs)
                entry["median_answer_speedup_vs_large"] = statistics.median(a.seconds / r.seconds for a, r in pairs)
            entry.update(paired_with_large(by_mode["large"], by_mode[mode]))
    for mode, entry in summary.items():
        if is_verify_mode(mode):
            entry.update(verification(by_mode[mode]))
        split = time_split(by_mode[mode])
        if split:
            entry["time_split_s"] = split
    if "large" in summary:  # fastest per answer first: the order a reader wants, and the report's
        order = sorted(summary, key=lambda m: -summary[m].get("answer_speedup_vs_large", 0.0))
        summary = {mode: summary[mode] for mode in order}
    return summary


# The per-answer time split's columns: forward seconds by model and pass kind (``runner.PASS_KINDS``), then what the
# summary derives from the counts: the share of the small model's sentence time spent on tokens verification threw
# away, and of its drafting time on drafts the large model rejected.
TIME_SPLIT_KEYS = (
    "large.prefill", "large.decode", "large.catchup", "large.verify_drafts", "large.verify_lookup",
    "large.verify_sentences", "small.prefill", "small.decode", "small.catchup", "small.draft", "lookup.search",
)  # fmt: skip


def time_split(runs: list[Run]) -> dict[str, float]:
    """Mean seconds per answer by model and pass kind, plus ``small.decode.thrown_away`` (the part of the small
    model's sentence-writing time spent on tokens verification rejected, at its mean cost per written token),
    ``small.draft.rejected`` (drafting time spent on rejected drafts, likewise) and ``other`` (sampling,
    detokenizing, policy, Python: the answer's seconds outside any forward pass). Empty without recorded splits."""
    runs = [r for r in runs if r.time_split]
    if not runs:
        return {}
    n = len(runs)
    split = {key: sum(r.time_split.get(key, 0.0) for r in runs) / n for key in TIME_SPLIT_KEYS}
    written = sum(r.small_tokens + r.rejected_tokens for r in runs)  # small tokens written in sentences/answers
    rejected = sum(r.rejected_tokens for r in runs)
    split["small.decode.thrown_away"] = split["small.decode"] * rejected / written if written else 0.0
    # The small model's own drafts only: copied ones (prompt lookup) cost it no pass.
    drafted = sum(r.draft_tokens - r.lookup_draft_tokens for r in runs)
    refused = drafted - sum(r.accepted_draft_tokens - r.lookup_accepted_tokens for r in runs)
    split["small.draft.rejected"] = split["small.draft"] * refused / drafted if drafted else 0.0
    inside = sum(split[key] for key in TIME_SPLIT_KEYS)
    split["other"] = sum(r.seconds for r in runs) / n - inside
    return split


def verification(runs: list[Run]) -> dict[str, float]:
    """What verification did and cost, per problem: small segments written (kept or cut), tokens the large model
    checked (each one an extra row of its output projection in a catch-up pass it runs anyway), rejections, small
    tokens thrown away, and small tokens kept. Plus the share of the small model's tokens that verification threw
    away: rejected / (rejected + kept), where rejected counts each rejected token and the rest of its segment."""
    n = len(runs)
    rejected = sum(r.rejected_tokens for r in runs)
    kept = sum(r.small_tokens for r in runs)
    rejections = sum(1 for r in runs for span in r.spans if span.get("trigger") == "rejected")
    small_spans = sum(1 for r in runs for span in r.spans if span.get("model") == "small")
    return {
        "rejected_share": rejected / (rejected + kept) if rejected + kept else 0.0,
        "rejected_per_problem": rejected / n,
        "checked_per_problem": sum(r.verified_tokens + r.rejected_tokens for r in runs) / n,
        "rejections_per_problem": rejections / n,
        # A fully rejected segment leaves no small span behind; each rejection is one segment, cut or emptied.
        "segments_per_problem": (small_spans + sum(
            1 for r in runs for i, span in enumerate(r.spans)
            if span.get("trigger") == "rejected" and (i == 0 or r.spans[i - 1].get("model") != "small")
        )) / n,
        "kept_small_per_problem": kept / n,
    }  # fmt: skip


def paired_with_large(large_runs: list[Run], mode_runs: list[Run]) -> dict[str, Any]:
    """On the problems both the large model and the mode ran: the problems (0-based indices) only the large model
    solved, those only the mode solved, how many both solved, and how many problems were paired."""
    large = {r.problem: r for r in large_runs}
    mode = {r.problem: r for r in mode_runs}
    shared = sorted(large.keys() & mode.keys())
    paired: dict[str, Any] = {
        "paired": len(shared),
        "both": sum(large[p].correct and mode[p].correct for p in shared),
        "only_large": [p for p in shared if large[p].correct and not mode[p].correct],
        "only_mode": [p for p in shared if mode[p].correct and not large[p].correct],
    }
    large_seconds, large_tokens = (sum(getattr(large[p], k) for p in shared) for k in ("seconds", "completion_tokens"))
    mode_seconds, mode_tokens = (sum(getattr(mode[p], k) for p in shared) for k in ("seconds", "completion_tokens"))
    if large_tokens and mode_tokens and mode_seconds:
        # Seconds per token on the same problems: a mode that ran on fewer problems is compared on those alone.
        paired["paired_speedup"] = (large_seconds / large_tokens) / (mode_seconds / mode_tokens)
        paired["paired_answer_speedup"] = large_seconds / mode_seconds  # seconds per answer, the same problems
    return paired


def paired_accuracy_gain(entry: dict[str, Any]) -> float:
    """Accuracy over ``large`` on the problems both ran, as a fraction: (solved only by the mode − solved only by
    ``large``) / problems paired. Modes paired on different numbers of problems stay comparable."""
    return (len(entry["only_mode"]) - len(entry["only_large"])) / entry["paired"] if entry["paired"] else 0.0


def pareto_front(summary: dict[str, dict[str, Any]]) -> list[str]:
    """The modes no other mode beats on both axes, each measured against ``large`` on the problems the two share:
    speed-up per answer (seconds per answer: what a user waits for) and accuracy gained
    (:func:`paired_accuracy_gain`). ``large`` itself is the point (1, 0). Ordered from the fastest."""
    points = {"large": (1.0, 0.0)} if "large" in summary else {}
    for mode, s in summary.items():
        if mode != "large" and "paired_speedup" in s:
            points[mode] = (s.get("paired_answer_speedup", s["paired_speedup"]), paired_accuracy_gain(s))
    front = [
        mode for mode, (speed, gain) in points.items()
        if not any(o != mode and os >= speed and og >= gain and (os, og) != (speed, gain)
                   for o, (os, og) in points.items())
    ]  # fmt: skip
    return sorted(front, key=lambda m: -points[m][0])
