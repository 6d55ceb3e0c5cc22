"""Verified relay: the large model checks the small model's tokens in the catch-up pass it pays for anyway.

When the large model takes over after a small segment, its catch-up forward pass runs over exactly the small model's
tokens. Keeping the logits of those positions (not just the last) gives the large model's opinion of every small
token for the price of the output projection over those rows. A :class:`VerifyRule` decides which token is the first
the large model rejects; the transcript drops it and everything after it, and the large model writes from there,
starting with its own choice at that position.

Rules (``p`` is the large model's next-token distribution at a position, softmax of its raw logits; ``x`` the small
model's token there):

* ``greedy``      - reject unless ``x`` is the large model's argmax. Relay then writes the large model's greedy text
                    exactly (the small segment is a long speculative draft).
* ``prob:TAU``    - reject when ``p(x) < TAU``.
* ``ratio:TAU``   - reject when ``p(x) < TAU * max(p)`` (relative to how sure the large model is).

A ``+answer`` suffix verifies the answer-stage segment (after the reasoning end) too; without it only the small
model's reasoning sentences are checked. Spec strings: ``"greedy"``, ``"prob:0.05"``, ``"ratio:0.1+answer"``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, model_validator

if TYPE_CHECKING:
    import torch

RuleName = Literal["greedy", "prob", "ratio"]


class TokenScore(NamedTuple):
    """A server's score of one token of a prompt (vLLM's ``prompt_logprobs``): the token's log-probability under the
    large model, the most likely token's, and whether the token is that most likely one (rank 1)."""

    logprob: float
    top_logprob: float
    is_top: bool


class VerifyRule(BaseModel):
    """Which small-model tokens the large model rejects (see the module docstring)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rule: RuleName
    threshold: float = Field(0.0, ge=0.0, lt=1.0)
    answer: bool = False  # also verify the answer-stage segment

    @model_validator(mode="after")
    def _threshold_fits_the_rule(self) -> VerifyRule:
        if self.rule == "greedy" and self.threshold:
            raise ValueError("the greedy rule takes no threshold")
        if self.rule != "greedy" and not 0.0 < self.threshold < 1.0:
            raise ValueError(f"the {self.rule} rule needs a threshold in (0, 1), e.g. '{self.rule}:0.05'")
        return self

    @classmethod
    def parse(cls, spec: str) -> VerifyRule:
        """``"greedy"``, ``"prob:0.05"``, ``"ratio:0.1"``, each optionally with ``"+answer"``."""
        body, plus, extra = spec.strip().partition("+")
        if plus and extra != "answer":
            raise ValueError(f"unknown verify option {'+' + extra!r}: only '+answer'")
        name, colon, value = body.partition(":")
        if name not in ("greedy", "prob", "ratio"):
            raise ValueError(f"unknown verify rule {name!r}: use 'greedy', 'prob:TAU' or 'ratio:TAU' (or 'off')")
        try:
            threshold = float(value) if colon else 0.0
        except ValueError:
            raise ValueError(f"verify threshold {value!r} is not a number") from None
        return cls(rule=name, threshold=threshold, answer=bool(plus))  # type: ignore[arg-type]

    @property
    def spec(self) -> str:
        body = self.rule if self.rule == "greedy" else f"{self.rule}:{self.threshold:g}"
        return body + ("+answer" if self.answer else "")

    def first_rejected(self, logits: torch.Tensor, tokens: list[int]) -> int | None:
        """Index of the first of ``tokens`` the large model rejects, or None. ``logits[j]`` (float) is the large
        model's next-token logits at the position that predicts ``tokens[j]``."""
        import torch

        index = torch.tensor(tokens, dtype=torch.long, device=logits.device)
        if self.rule == "greedy":
            rejected = torch.argmax(logits, dim=-1) != index
        else:
            probs = torch.softmax(logits.float(), dim=-1)
            chosen = probs.gather(1, index[:, None])[:, 0]
            bound = self.threshold * (probs.max(dim=-1).values if self.rule == "ratio" else 1.0)
            rejected = chosen < bound
        hits = torch.nonzero(rejected)
        return int(hits[0, 0]) if hits.numel() else None

    def first_rejected_scores(self, scores: Sequence[TokenScore]) -> int | None:
        """:meth:`first_rejected` for scores a server returned instead of logits (the remote backend)."""
        for index, score in enumerate(scores):
            if self.rule == "greedy":
                rejected = not score.is_top
            else:
                bound = math.log(self.threshold) + (score.top_logprob if self.rule == "ratio" else 0.0)
                rejected = score.logprob < bound
            if rejected:
                return index
        return None


VerifySetting = VerifyRule | Literal[False] | None
"""A request's ``verify``: a rule; ``False`` (said as "off") - none, whatever the engine's default; None - the
engine's default (for a known pair, the rule its profile ships)."""


def parse_verify(value: object) -> VerifySetting:
    """A request's value: None -> the engine's default; False / "off" -> no verification; True -> greedy; a spec
    string or a VerifyRule."""
    if value is None:
        return None
    if value is False or value == "off":
        return False
    if isinstance(value, VerifyRule):
        return value
    if value is True:
        return VerifyRule(rule="greedy")
    if isinstance(value, str):
        return VerifyRule.parse(value)
    raise ValueError(f"verify must be 'off', 'greedy', 'prob:TAU' or 'ratio:TAU', got {value!r}")


def parse_verify_default(value: object) -> VerifyRule | None:
    """An engine's default rule: what :func:`parse_verify` reads, with None and "off" both meaning none."""
    rule = parse_verify(value)
    return rule or None
