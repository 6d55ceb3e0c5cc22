"""Per-token log probabilities of one generation, as the backend notes them and the transcript hands them out.

A backend notes an entry for every token it produces, keyed by the token's position in the sequence, from the
distribution the token came from (``LocalSession``: the writer's decode logits, the large model's checking row for a
speculative round, its scoring row for the token it writes where it rejected a small-model token). A position can be
written several times - a rolled-back look-ahead token, a discarded speculative tail, a rejected small-model run
are written again - and the last note wins, so the entry at each kept position is that of the token kept there. The
transcript hands entries out in completion order, each exactly once: with the text event that completes the token,
and whatever is left at the end.
"""

from __future__ import annotations

from collections.abc import Sequence

from transformers import PreTrainedTokenizerBase

from .spans import ModelRole, TokenLogprob


class LogprobLedger:
    """The entries noted so far, by sequence position, and how many completion tokens' entries were handed out."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, prompt_len: int, top: int) -> None:
        self.tokenizer = tokenizer
        self.prompt_len = prompt_len
        self.top = top  # alternatives per entry (the request's top_logprobs)
        self.entries: dict[int, TokenLogprob] = {}
        self.handed_out = 0  # completion tokens whose entries went out with a text event

    def note(
        self,
        position: int,
        token_id: int,
        logprob: float,
        model: ModelRole,
        top: Sequence[tuple[int, float]] = (),
    ) -> None:
        """The entry of the token at sequence ``position`` (replacing one noted there before)."""
        self.entries[position] = TokenLogprob(
            token_id, self._text(token_id), logprob, model, tuple((i, self._text(i), lp) for i, lp in top)
        )

    def _text(self, token_id: int) -> str:
        # One token's own text, as OpenAI and vLLM report it (a token that is part of a multi-byte character decodes
        # to U+FFFD; the text events carry the exact text).
        return self.tokenizer.decode([token_id])

    def kept(self, count: int, start: int = 0) -> list[TokenLogprob]:
        """The entries of completion tokens [``start``, ``count``)."""
        missing = [j for j in range(start, count) if self.prompt_len + j not in self.entries]
        if missing:
            raise RuntimeError(f"no log probability was noted for completion token(s) {missing[:5]}")
        return [self.entries[self.prompt_len + j] for j in range(start, count)]

    def hand_out(self, through: int) -> tuple[TokenLogprob, ...]:
        """The entries of completion tokens [handed out so far, ``through``) - each handed out once."""
        if through <= self.handed_out:
            return ()
        entries = self.kept(through, self.handed_out)  # only the new ones: a text event per token stays O(1)
        self.handed_out = through
        return tuple(entries)
