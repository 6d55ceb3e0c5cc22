"""The shape of a mode's work on one pair, independent of the machine: forward passes per generated token, by model
and by how many positions each pass reads.

What a pair does under a mode - how often the large model accepts a draft, how long the small model's sentences are,
how much of them verified relay keeps, how many tokens a catch-up reads - decides how many passes of which size each
model runs per token. That does not depend on the machine (greedy decoding with the same weight formats writes the
same text anywhere, up to the rounding of multi-position passes); what a pass costs does (``costs.py``). So a mode's
work is measured once, from benchmark runs on any machine, shipped in the pair's profile, and priced on each machine
by ``cost_model.py``.

Runs recorded since ``Usage.passes`` existed carry their exact pass histogram. Older runs carry only aggregate counts
(rounds, drafted and accepted tokens, catch-up tokens, small spans); :func:`reconstruct_passes` rebuilds a histogram
from them, each kind of pass at its mean size (exact where a cost is linear in the size, which is where the mean of
a pass's size matters):

- a speculative round: one large pass over ``drafted / rounds + 1`` positions; the small model's catch-up pass
  (which also gives the first draft token's logits) and ``drafted - rounds`` one-token draft steps;
- a small sentence: ``written - 1`` small decode steps after its catch-up pass; under verified relay one large
  pass over ``written / sentences + 1`` positions, else the large model's catch-up pass over the kept tokens;
- the large model's own tokens outside speculation: one-token steps;
- each model that runs reads the prompt once (``prompt_tokens``, the run's own where it was recorded).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

# Prompt positions an answer prefills where a run did not record its passes (older runs): the question part of the
# demo's GSM8K prompt (50-80 tokens with the template's tail); the shared system prompt before it is reused from
# the previous request's cache (``reuse_prefix``), as in every benchmark run.
DEFAULT_PROMPT_TOKENS = 60

Histogram = dict[int, float]  # positions read by a pass -> passes


def _add_mean_size(histogram: Histogram, passes: float, mean_positions: float) -> None:
    """``passes`` passes whose sizes average ``mean_positions``: split between the two neighbouring whole sizes so
    the total positions are kept."""
    if passes <= 0:
        return
    mean_positions = max(1.0, mean_positions)
    low = math.floor(mean_positions)
    high_share = mean_positions - low
    if high_share > 1e-9:
        histogram[low + 1] = histogram.get(low + 1, 0.0) + passes * high_share
    if high_share < 1 - 1e-9:
        histogram[low] = histogram.get(low, 0.0) + passes * (1 - high_share)


def reconstruct_passes(run: Mapping[str, Any]) -> dict[str, Histogram]:
    """A pass histogram (role -> positions -> passes) for one recorded run from its aggregate counts (see the
    module docstring); for runs recorded before ``Usage.passes``."""
    tokens = int(run.get("completion_tokens", 0))
    rounds = int(run.get("speculative_rounds", 0))
    drafted = int(run.get("draft_tokens", 0))
    accepted = int(run.get("accepted_draft_tokens", 0))
    small_kept = int(run.get("small_tokens", 0))
    checked = int(run.get("verified_tokens", 0)) + int(run.get("rejected_tokens", 0))
    spans = run.get("spans") or []
    sentences = sum(1 for span in spans if isinstance(span, Mapping) and span.get("model") == "small")
    if checked and not sentences:  # every sentence rejected leaves no small span: one per switch pair
        sentences = max(1, int(run.get("switches", 0)) // 2)
    written = checked or small_kept
    prompt = int(run.get("prompt_tokens") or DEFAULT_PROMPT_TOKENS)
    mode = str(run.get("mode", ""))
    small_writes_all = mode.split("#")[0] == "small"
    large: Histogram = {}
    small: Histogram = {}
    if small_writes_all:
        small[1] = float(max(0, tokens - 1))
        small[prompt] = 1.0
        return {"small": small}
    large[prompt] = 1.0
    if rounds:
        _add_mean_size(large, rounds, drafted / rounds + 1)
    large_steps = max(0, tokens - small_kept - (accepted + rounds) - 1)
    if large_steps:
        large[1] = large.get(1, 0.0) + large_steps
    if sentences:
        if checked:
            _add_mean_size(large, sentences, checked / sentences + 1)
        elif small_kept:
            _add_mean_size(large, sentences, small_kept / sentences)
    if rounds or sentences:
        small[prompt] = 1.0
        # catch-up tokens count both models' reads of the other's tokens; the large model read the small sentences
        large_reads = written if sentences else 0
        small_reads = max(rounds + sentences, int(run.get("catchup_tokens", 0)) - large_reads)
        _add_mean_size(small, rounds + sentences, small_reads / (rounds + sentences))
        steps = max(0, drafted - rounds) + max(0, written - sentences)
        if steps:
            small[1] = small.get(1, 0.0) + steps
    return {"large": large, "small": small} if small else {"large": large}


def run_passes(run: Mapping[str, Any]) -> tuple[dict[str, Histogram], bool]:
    """A run's pass histogram: the recorded one (``passes``) when it has it, else reconstructed. The flag says
    whether it was reconstructed."""
    recorded = run.get("passes")
    if recorded:
        return {role: {int(k): float(n) for k, n in by_k.items()} for role, by_k in recorded.items()}, False
    return reconstruct_passes(run), True


@dataclass(frozen=True)
class ModeWork:
    """One mode's work on one pair, averaged over benchmark runs: passes per generated token (role -> positions ->
    passes), the tokens an answer has, and how many runs it rests on."""

    passes_per_token: dict[str, dict[int, float]]
    tokens_per_answer: float
    runs: int
    reconstructed: bool = False  # from aggregate counts (runs recorded before ``Usage.passes``)

    def to_json(self) -> dict[str, Any]:
        return {
            "passes_per_token": {
                role: {str(k): round(v, 6) for k, v in sorted(by_k.items())}
                for role, by_k in self.passes_per_token.items()
            },
            "tokens_per_answer": round(self.tokens_per_answer, 2),
            "runs": self.runs,
            "reconstructed": self.reconstructed,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ModeWork:
        return cls(
            passes_per_token={
                role: {int(k): float(v) for k, v in by_k.items()} for role, by_k in data["passes_per_token"].items()
            },
            tokens_per_answer=float(data["tokens_per_answer"]),
            runs=int(data["runs"]),
            reconstructed=bool(data.get("reconstructed", False)),
        )


def work_from_runs(runs: Iterable[Mapping[str, Any]]) -> ModeWork:
    """The mode's :class:`ModeWork` over recorded runs of it (all its passes over all its tokens)."""
    totals: dict[str, Histogram] = {}
    tokens = count = 0
    reconstructed = False
    for run in runs:
        passes, rebuilt = run_passes(run)
        reconstructed |= rebuilt
        tokens += int(run.get("completion_tokens", 0))
        count += 1
        for role, by_k in passes.items():
            into = totals.setdefault(role, {})
            for k, n in by_k.items():
                into[k] = into.get(k, 0.0) + n
    if not count or not tokens:
        raise ValueError("no runs with generated tokens to measure a mode's work from")
    per_token = {role: {k: n / tokens for k, n in sorted(by_k.items())} for role, by_k in totals.items()}
    return ModeWork(per_token, tokens / count, count, reconstructed)
