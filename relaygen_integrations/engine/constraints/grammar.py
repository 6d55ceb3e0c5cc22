"""One generation's grammar state and the token masks it gives, through llguidance.

A grammar (Lark, llguidance's dialect, which inlines JSON schemas as ``%json {...}``) constrains the whole completion.
Its state is one per generation and belongs to the *sequence*, not to a model: it follows the transcript's kept
completion ids the way a runner's KV cache does (:meth:`GrammarState.follow`, the counterpart of
``ModelRunner.sync_to``). Whoever writes the next token - the large model, the small model after a switch, a draft
step - has its logits masked by the state at that position, so a switch in the middle of a tool call leaves the call
well-formed. Rolled-back tokens (a rejected draft, a discarded speculative tail, a look-ahead token, verified relay's
rejected run) leave the state with the ids: the next :meth:`GrammarState.follow` rolls the matcher back to the longest
prefix it shares with the kept ids and consumes what is new.

Per step::

    grammar.follow(transcript.ids)          # roll back / catch up to the kept sequence
    logits = grammar.masked(logits)         # -inf where the grammar forbids the token
    ...                                     # the sampler picks; a draft step also calls grammar.advance(token)

A speculative check needs the mask at every draft position, and verified relay at every position of the small
model's run: :meth:`GrammarState.allowed` keeps the packed masks of recent positions (those it computed while the
tokens were written), so neither computes a mask twice.

Why llguidance (pinned in the setup): an abi3 wheel with no dependencies; Lark grammars with special tokens and lazy
lexemes (free text up to a tool-call tag, then a JSON schema); rollback of any number of tokens; and a mask in tens
of microseconds for a 152k vocabulary (``benchmarks/grammar_mask.py``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from functools import lru_cache

import llguidance
import llguidance.hf
import llguidance.torch
import torch
from transformers import PreTrainedTokenizerBase

from ..core.settings import GenerationError
from .opening import CALL_OPENINGS, MARKUP_OPENINGS, CallOpening, starting_with

# Packed masks kept for the most recent positions: a draft (<= 64 tokens) or a verified run (a sentence) reads masks
# that far back; older ones are recomputed on demand (rollback, mask, replay). 256 x 4.7k words = 4.9 MB at most.
KEPT_MASKS = 256


class GrammarError(GenerationError):
    """A grammar that does not compile, or a completion that left it (a bug: masks keep every token inside)."""

    def __init__(self, message: str, field: str | None = "grammar") -> None:
        super().__init__(message, field)


class GrammarTokenizer:
    """A tokenizer as llguidance reads it, built once per tokenizer (~1 s) and logits width."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, width: int, eos_ids: Sequence[int]) -> None:
        self.width = width  # the models' logits width (Qwen pads its vocabulary: 151936 > 151665 tokens)
        self.eos_ids = sorted(eos_ids)
        self._tokenizer = tokenizer
        self._built: llguidance.LLTokenizer | None = None
        self._openers: tuple[torch.Tensor, torch.Tensor] | None = None
        # The same grammar (a bound tool set, a response schema) comes back request after request: it is checked and
        # compiled once, and each request gets a copy of the compiled matcher. The caches belong to this tokenizer
        # (a module-level cache keyed by it kept up to 64 discarded engines' tokenizers alive, ~115 MB each).
        self._validate = lru_cache(maxsize=64)(self._validate_uncached)
        self._compiled = lru_cache(maxsize=64)(self._compile_uncached)

    @property
    def built(self) -> llguidance.LLTokenizer:
        if self._built is None:
            self._built = llguidance.hf.from_tokenizer(self._tokenizer, n_vocab=self.width, eos_token=self.eos_ids)
        return self._built

    def is_special(self, text: str) -> int | None:
        """The id of ``text`` if it is one special token of this tokenizer (e.g. Qwen's ``<tool_call>``), else
        None: a grammar names a special token as ``<[id]>``, and plain text as a string."""
        ids = self._tokenizer.encode(text, add_special_tokens=False)
        return ids[0] if len(ids) == 1 and self.built.is_special_token(ids[0]) else None

    def call_opening(self, tag: int) -> CallOpening:
        """The first-position decision between a call (opened by ``tag``) and text (``opening.py``)."""
        if self._openers is None:
            pieces = [self.built.decode_bytes([i]) for i in range(self.width)]
            self._openers = (starting_with(pieces, CALL_OPENINGS), starting_with(pieces, MARKUP_OPENINGS))
        return CallOpening(tag, *self._openers)

    def check(self, grammar: str, field: str = "grammar") -> None:
        """Raises :class:`GrammarError` naming ``field`` if ``grammar`` does not compile for this tokenizer."""
        error = self._validate(grammar)
        if error:
            raise GrammarError(f"the grammar does not compile: {error}", field)

    def state(self, grammar: str, prompt_len: int, opening: CallOpening | None = None) -> GrammarState:
        """A fresh state of ``grammar`` for a request whose prompt has ``prompt_len`` tokens (``opening``: the turn
        decides between a call and text at its first position)."""
        self.check(grammar)
        return GrammarState(self._compiled(grammar).deep_copy(), prompt_len, self.width, opening)

    def _validate_uncached(self, grammar: str) -> str:
        return llguidance.LLMatcher.validate_grammar(grammar, self.built)

    def _compile_uncached(self, grammar: str) -> llguidance.LLMatcher:
        return llguidance.LLMatcher(self.built, grammar, log_level=0)


class GrammarState:
    """The matcher of one generation, the completion ids it has consumed and the masks of recent positions."""

    def __init__(
        self, matcher: llguidance.LLMatcher, prompt_len: int, width: int, opening: CallOpening | None = None
    ) -> None:
        self.matcher = matcher
        self.opening = opening
        self.prompt_len = prompt_len
        self.width = width
        self.consumed: list[int] = []  # completion tokens the matcher has consumed, in order
        self.packed: dict[int, torch.Tensor] = {}  # completion position -> packed mask (int32 words, 1 bit a token)
        self._bits = torch.arange(32, dtype=torch.int32)
        self.mask_seconds = 0.0  # time spent computing and applying masks (the benchmark's grammar.mask)
        self.masks_computed = 0

    @property
    def position(self) -> int:
        """The completion position the next token takes."""
        return len(self.consumed)

    def follow(self, ids: Sequence[int]) -> None:
        """Rolls the matcher back to the longest prefix it shares with the completion part of ``ids`` and consumes
        the rest: afterwards the state is the one after exactly those tokens."""
        completion = ids[self.prompt_len :]
        keep = 0
        limit = min(len(self.consumed), len(completion))
        while keep < limit and self.consumed[keep] == completion[keep]:
            keep += 1
        self._rollback_to(keep)
        for token in completion[keep:]:
            self.advance(token)

    def advance(self, token: int) -> None:
        """Consumes one token (a kept one, or a draft token the next ``follow`` may roll back)."""
        if not self.matcher.consume_token(token):
            raise GrammarError(
                f"completion token {len(self.consumed)} (id {token}) breaks the grammar: {self.matcher.get_error()}",
                None,
            )
        self.consumed.append(token)

    def _rollback_to(self, keep: int) -> None:
        if keep < len(self.consumed):
            self.matcher.rollback(len(self.consumed) - keep)
            del self.consumed[keep:]
            for position in [p for p in self.packed if p > keep]:
                del self.packed[position]  # a mask after a token that is gone

    def allowed(self, position: int | None = None) -> torch.Tensor:
        """Which tokens may take completion ``position`` (default: the next one), as a bool tensor of the logits'
        width. ``position`` may lie back to the start: a mask no longer kept is recomputed (rollback, mask, replay)."""
        position = self.position if position is None else position
        if not 0 <= position <= self.position:
            raise IndexError(f"no grammar state at completion position {position} (the state is at {self.position})")
        started = time.perf_counter()
        packed = self.packed.get(position)
        if packed is None:
            packed = self._compute(position)
        words = (packed[:, None] >> self._bits) & 1
        mask = words.flatten()[: self.width].bool()
        self.mask_seconds += time.perf_counter() - started
        return mask

    def _compute(self, position: int) -> torch.Tensor:
        replay = self.consumed[position:]
        if replay:
            self.matcher.rollback(len(replay))
        packed = torch.full((1, (self.width + 31) // 32), -1, dtype=torch.int32)
        llguidance.torch.fill_next_token_bitmask(self.matcher, packed)
        self.masks_computed += 1
        if replay and not self.matcher.consume_tokens(replay):
            raise GrammarError(f"replaying {len(replay)} tokens failed: {self.matcher.get_error()}", None)
        self.packed[position] = packed[0]
        for old in [p for p in self.packed if p < self.position - KEPT_MASKS]:
            del self.packed[old]
        return packed[0]

    def masked(self, logits: torch.Tensor, position: int | None = None) -> torch.Tensor:
        """``logits`` (1-D) with ``-inf`` where the grammar forbids the token at ``position``."""
        position = self.position if position is None else position
        allowed = self.allowed(position)
        if position == 0 and self.opening is not None:
            allowed = self.opening.decide(logits, allowed)
        allowed = _fit(allowed, logits.shape[-1]).to(logits.device)
        return logits.masked_fill(~allowed, float("-inf"))

    def masked_rows(self, rows: torch.Tensor, start: int) -> torch.Tensor:
        """2-D ``rows`` whose row ``i`` predicts completion position ``start + i``, each masked for its position.
        Rows past the state's position (after a drafted end-of-sequence token, which the state never consumes:
        nothing follows it) stay as they are."""
        count = max(0, min(rows.shape[0], self.position - start + 1))
        if not count:
            return rows
        masked = rows.clone()
        for i in range(count):
            masked[i] = self.masked(rows[i], start + i)
        return masked


def _fit(allowed: torch.Tensor, width: int) -> torch.Tensor:
    """A mask for logits ``width`` wide (a model whose output layer is narrower or wider than the grammar's
    vocabulary: the ids past the grammar's are never allowed)."""
    if width == allowed.shape[0]:
        return allowed
    if width < allowed.shape[0]:
        return allowed[:width]
    return torch.cat([allowed, torch.zeros(width - allowed.shape[0], dtype=torch.bool)])
