"""The local backend's token source: two :class:`ModelRunner` s, a sampler and, for the large model with speculation
on, a drafter. ``drive`` (``engine/core/loop.py``) runs it like any other backend's session: each call returns a
:class:`Step` (tokens, the passes the runners reported, log probabilities) and the loop writes the transcript.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field

import torch

from ..constraints.grammar import GrammarState
from ..core.backend import LogprobRow, Step
from ..core.settings import MAX_DRAFT_LIMIT
from ..core.spans import ModelRole
from ..core.transcript import BackendUsage, Fed, Transcript
from .prompt_lookup import LookupCounts, PromptLookupDrafter
from .runner import ModelRunner
from .sampling import Sampler, token_logprobs
from .speculative import Drafter, SpeculationStats, speculative_step


@dataclass
class Speculation:
    """Per-request speculative-decoding state: the drafter (its adaptive draft length and early stop) and the
    acceptance counters."""

    drafter: Drafter
    stats: SpeculationStats = field(default_factory=SpeculationStats)


class LocalSession:
    """Tokens from in-process models: one decode step of the writer, or - for the large model with speculation on -
    one draft-and-verify round with the small model (lossless).

    ``reprefill_segments`` emulates RelayGen's original serving (each segment a fresh API call without prefix
    caching): the model taking over forgets its cache and re-reads prompt + text so far. A baseline, never faster.
    """

    def __init__(
        self,
        runners: dict[ModelRole, ModelRunner],
        transcript: Transcript,
        sampler: Sampler,
        reuse_prefix: bool = True,
        reprefill_segments: bool = False,
        speculation: Speculation | None = None,
        step_lock: threading.Lock | None = None,
        grammar: GrammarState | None = None,
    ) -> None:
        self.runners = runners
        # The request's grammar (None: unconstrained): it follows the transcript's kept ids before every step, and
        # every token - either model's, a draft's, the large model's where it rejects - is chosen under its mask.
        self.grammar = grammar
        # Runners shared with other sessions that interleave step by step (the single-model server): every step
        # takes the lock and first brings the cache back to this request's sequence, so an abandoned or concurrent
        # request can never leave it holding another one's tokens. None: this session has the runners to itself.
        self.step_lock = step_lock
        self.transcript = transcript
        self.sampler = sampler
        self.reprefill_segments = reprefill_segments
        self.speculation = speculation
        self.pending: int | None = None
        # Passes the runners reported since the last step (``on_forward``: the positions each read), for its Step.
        self.passes: list[tuple[ModelRole, int, int]] = []
        prompt_ids = transcript.ids[: transcript.prompt_len]
        # Positions the request may reach: its budget plus a draft beyond it (sizes a static cache once).
        expected_len = transcript.prompt_len + (transcript.max_new_tokens or 0) + MAX_DRAFT_LIMIT + 1
        with self.step_lock or contextlib.nullcontext():
            for role, runner in runners.items():
                runner.begin_request(
                    prompt_ids,
                    reuse_prefix,
                    lambda start, end, role=role: self.passes.append((role, start, end)),
                    expected_len=expected_len,
                )

    def verify(self) -> Step:
        """Scores the pending small-model run with the large model in one pass (its catch-up pass when the large
        model writes next) and returns the first token the rule rejects. Where it rejects, both caches go back to the
        kept sequence, and the large model's own token at that position, sampled from the same row, is what it
        writes next."""
        transcript, large = self.transcript, self.runners["large"]
        rule = transcript.verify
        assert rule is not None
        start, end = transcript.pending_run()
        first = transcript.prompt_len + start
        ids = transcript.ids
        rows = large.score(ids, first)  # rows[j] predicts ids[first + j]; the last row follows the whole sequence
        raw = rows
        if self.grammar is not None:
            # The large model judges each small token by its distribution under the grammar at that position (a
            # forced brace is no reason to reject), and writes its own token where it rejects under the mask too.
            self.grammar.follow(ids)
            rows = self.grammar.masked_rows(rows, first - transcript.prompt_len)
        rejected = rule.first_rejected(rows[: end - start], ids[first : transcript.prompt_len + end])
        verdict = Step(passes=self._take_passes(), rejected=rejected)
        if rejected is None:
            return verdict
        cut = start + rejected
        kept = ids[: transcript.prompt_len + cut]  # the sequence once the loop has cut the run there
        for runner in self.runners.values():
            runner.sync_to(kept)  # both caches back to the kept sequence
        self.pending = self.sampler(rows[cut - start], kept)  # the large model's own distribution at the cut
        verdict.logprobs = self._logprobs(len(kept), raw[cut - start][None], [self.pending], "large")
        return verdict

    def next_tokens(self, writer: ModelRole) -> Step:
        if self.pending is not None:
            token, self.pending = self.pending, None  # the large model's choice where it rejected the small one
            return Step([token], self._take_passes())
        ids = self.transcript.ids
        if self.grammar is not None:
            self.grammar.follow(ids)  # rejected drafts, a discarded tail, a rolled-back look-ahead token: undone
        if self.speculation is not None and writer == "large":
            # Draft-and-verify: several tokens, each the large model's own choice; whatever follows a switch is
            # discarded by the transcript (and cropped from the caches in after_feed).
            budget = (self.transcript.max_new_tokens or 1 << 30) - self.transcript.completion_tokens
            tokens, rows = speculative_step(
                self.runners["large"], self.speculation.drafter, ids, self.sampler, budget, self.transcript.eos_ids,
                self.speculation.stats, self.grammar,
            )  # fmt: skip
            return Step(tokens, self._take_passes(), self._logprobs(len(ids), rows, tokens, "large"))
        if self.step_lock is None:
            logits = self.runners[writer].logits_for(ids)
        else:
            with self.step_lock:
                runner = self.runners[writer]
                runner.sync_to(ids)
                logits = runner.logits_for(ids)
        choose = logits if self.grammar is None else self.grammar.masked(logits)
        token = self.sampler(choose, ids)
        return Step([token], self._take_passes(), self._logprobs(len(ids), logits[None], [token], writer))

    def _take_passes(self) -> list[tuple[ModelRole, int, int]]:
        taken, self.passes = self.passes, []
        return taken

    def _logprobs(self, position: int, rows: torch.Tensor, tokens: list[int], model: ModelRole) -> list[LogprobRow]:
        """Where the request asked for log probabilities: ``tokens`` (from sequence ``position`` on) came from
        ``rows``."""
        ledger = self.transcript.logprobs
        if ledger is None:
            return []
        return [
            (position + offset, tokens[offset], value, model, top)
            for offset, (value, top) in enumerate(token_logprobs(rows, tokens, ledger.top))
        ]

    def after_feed(self, fed: Fed) -> None:
        # A rolled-back look-ahead token never reached a cache without speculation (a token is forwarded only when
        # the next one is generated), so dropping it from the transcript's ids is the whole rollback.
        if fed.decision.action != "continue" and self.reprefill_segments:
            self.runners[fed.decision.to_model].reset()  # type: ignore[index]
        if self.speculation is not None:
            for runner in self.runners.values():
                runner.sync_to(self.transcript.ids)  # drop rejected drafts and a discarded tail from both caches

    def close(self, failed: bool) -> None:
        for runner in self.runners.values():
            if failed:
                # A failed forward pass may leave a cache half-written: forget both caches rather than trust them.
                runner.reset()
            runner.on_forward = None

    def usage(self) -> BackendUsage:
        stats = self.speculation.stats if self.speculation else SpeculationStats()
        seconds = {role: runner.stats.forward_seconds for role, runner in self.runners.items()}
        grammar = {"grammar.mask": self.grammar.mask_seconds} if self.grammar is not None else {}
        drafter = self.speculation.drafter if self.speculation else None
        copied, lookup = LookupCounts(), {}
        if isinstance(drafter, PromptLookupDrafter):  # copies cost a search, no forward pass
            copied, lookup = drafter.counts, {"lookup.search": drafter.counts.search_seconds}
        return BackendUsage(
            reused_prefix_tokens=sum(r.stats.reused_tokens for r in self.runners.values()),
            speculative_rounds=stats.rounds,
            draft_tokens=stats.drafted,
            accepted_draft_tokens=stats.accepted,
            lookup_draft_tokens=copied.drafted,
            lookup_accepted_tokens=copied.accepted,
            large_forward_seconds=seconds.get("large", 0.0),
            small_forward_seconds=seconds.get("small", 0.0),
            time_split={
                f"{role}.{kind}": spent
                for role, runner in self.runners.items()
                for kind, spent in runner.stats.seconds_by_kind.items()
            }
            | grammar
            | lookup,
            passes={role: dict(sorted(runner.stats.passes.items())) for role, runner in self.runners.items()},
            pass_seconds={role: dict(sorted(r.stats.pass_seconds.items())) for role, r in self.runners.items()},
        )
