"""Incremental detokenization that stays equal to ``tokenizer.decode(all_ids)``.

Byte-level BPE splits multi-byte characters across tokens; decoding token by token would emit U+FFFD halves. The
usual fix (as in TGI/vLLM): decode a short window and release text only once it no longer ends in a partial
character. The window keeps a few tokens of left context so tokenizers that strip a leading space on the first
token still join words correctly.
"""

from __future__ import annotations

from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase


@dataclass
class DetokenizerState:
    prefix_offset: int
    read_offset: int
    text_len: int


class IncrementalDetokenizer:
    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.text = ""
        self.prefix_offset = 0
        self.read_offset = 0

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def push(self, token_id: int) -> str:
        """Adds one token; returns the text that became final (possibly "")."""
        self.ids.append(token_id)
        prefix_text = self._decode(self.ids[self.prefix_offset : self.read_offset])
        new_text = self._decode(self.ids[self.prefix_offset :])
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            delta = new_text[len(prefix_text) :]
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)
            self.text += delta
            return delta
        return ""

    def snapshot(self) -> DetokenizerState:
        return DetokenizerState(self.prefix_offset, self.read_offset, len(self.text))

    def pop(self, state: DetokenizerState) -> None:
        """Drops the last pushed token, restoring the state taken just before it was pushed."""
        self.ids.pop()
        self.prefix_offset, self.read_offset = state.prefix_offset, state.read_offset
        self.text = self.text[: state.text_len]

    def truncate(self, length: int, state: DetokenizerState) -> None:
        """Keeps the first ``length`` tokens, restoring ``state``: the snapshot taken just before token ``length``."""
        del self.ids[length:]
        self.prefix_offset, self.read_offset = state.prefix_offset, state.read_offset
        self.text = self.text[: state.text_len]

    def flush(self) -> str:
        """Releases text held back at the end (an unfinished character decodes to U+FFFD, as decode() does)."""
        full = self._decode(self.ids[self.prefix_offset :])
        prefix_text = self._decode(self.ids[self.prefix_offset : self.read_offset])
        delta = full[len(prefix_text) :]
        self.text += delta
        self.prefix_offset = self.read_offset = len(self.ids)
        return delta
