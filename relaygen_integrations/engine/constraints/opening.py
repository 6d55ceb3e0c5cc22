"""Whether a turn with tools opens with a call or with text: decided by the model's whole mass on opening a call.

A small model asked to call a tool rarely writes the chat template's tag first: Qwen2.5-Coder-1.5B, asked "What is 17
plus 25?" with four tools bound, puts 0.82 on a code fence, 0.11 on ``{{`` and 0.03 on ``{"`` - a call in its own
dialects, 0.98 in all - and < 0.002 on ``<tool_call>``. After the tool's result it puts 0.12 on the fence, 0.10 on
``{"``, 0.08 on ``{{`` and 0.07 on ``<``, and the rest (0.63) on prose. Greedy decoding picks the single likeliest
token - the fence, both times - so the model calls the tool again and again; a grammar that only allowed the tag
would leave it prose both times. What the model means is the sum: a call (0.98) first, an answer (0.63) after the
result. Across ten tasks the sums part cleanly: 0.95-0.98 in the first turn, 0.25-0.69 after the result.

So, at the first position of a turn whose grammar offers a call (``tool_choice="auto"``; measured on the demo pair,
``benchmarks/agent_loops.py``)::

    p_call = p(tag) + sum(p(t) for t in openers)     # openers: tokens that start with "{" or "```"
    call   = p_call >= CALL_SHARE (0.8)              # sampling or not
    allowed &= {tag} if call else not ({tag} | openers)

A call is then written in the template's form, under the grammar; text cannot open with a brace or a fence (with
tools bound, a reply that opens that way is how these models open a call: ``constrain=False`` for code answers that
start with a fence), nor with markup (``<``: after a result the demo model's likeliest prose opening, with which it
echoes the template's ``<tool_response>`` instead of answering). The decision reads each row's own logits, so the
large model's check of a small model's draft makes it again, from its own row, and keeps speculation lossless.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# The forms a call opens in, besides the template's tag: a JSON object, a code fence.
CALL_OPENINGS = (b"{", b"```")
# What text may not open with either: markup. After a tool's result the demo model's likeliest prose opening is "<"
# (it echoes the template's "<tool_response>42</tool_response>" instead of answering).
MARKUP_OPENINGS = (b"<",)
# A call needs most of the mass, not just the larger share: on the ten tasks of benchmarks/agent_loops.py the demo
# model put 0.95-0.98 on opening a call in the first turn, and 0.25-0.69 after the tool's result (at 0.5 it called
# the weather tool again and again). Measured with the large model's logits, bf16, greedy, in a run not kept under
# benchmarks/data/; 0.8 is a choice inside the gap between the two, not a fitted value.
CALL_SHARE = 0.8


@dataclass(frozen=True)
class CallOpening:
    """The template's call tag and the tokens that open a call in the model's other dialects."""

    tag: int
    openers: torch.Tensor  # bool, one per token id of the grammar's vocabulary: opens a call in another dialect
    markup: torch.Tensor  # bool, likewise: opens markup (text may not open with either)

    def __hash__(self) -> int:
        return hash((self.tag, int(self.openers.sum())))

    def decide(self, logits: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        """``allowed`` (bool, the grammar's mask at the turn's first position) narrowed to the call or to text."""
        width = min(logits.shape[-1], self.openers.shape[0])
        probs = torch.softmax(logits[:width].detach().float().cpu(), dim=-1)
        openers = self.openers[:width].clone()
        openers[self.tag] = True
        p_call = float(probs[openers].sum())
        narrowed = allowed.clone()
        if p_call >= CALL_SHARE:
            narrowed[:] = False
            narrowed[self.tag] = bool(allowed[self.tag])
        else:
            narrowed[:width] &= ~(openers | self.markup[:width])
        return narrowed


def starting_with(token_bytes: list[bytes], openings: tuple[bytes, ...]) -> torch.Tensor:
    """Which tokens start (after any leading spaces or newlines) with one of ``openings``."""
    return torch.tensor([piece.lstrip(b" \n").startswith(openings) for piece in token_bytes], dtype=torch.bool)
