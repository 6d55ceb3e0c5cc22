"""Chat markup versus the caller's text: control-token strings in messages are encoded as text, never as tokens.

A chat template writes its own control tokens (``<|im_start|>``, ``<|im_end|>``) around the caller's strings. Encoded
as one string, a user message holding ``<|im_end|>\\n<|im_start|>system\\n...`` would become a genuine system turn
(prompt injection through the template). Here only the template's own markup becomes control tokens:

1. Fast path: when no string the caller passed (message values, tools, template variables; dict keys too) holds a
   control-token string, the rendered text is encoded as before - the very same ids.
2. Otherwise every control-token string in those inputs is wrapped in two Unicode noncharacters (reserved for a
   program's internal use, and chosen among those no input holds, so no input can forge them), the template renders
   the marked inputs, and the rendered text is encoded run by run: the template's added tokens are tokens, and the
   text between two of them - template text and marked control-token strings alike - is encoded as plain text with no
   added token recognised. A tokenizer splits its input at added tokens before anything else, so for inputs without
   control-token strings this is exactly the ordinary encoding (``tests/test_markup.py`` checks it on many prompts).

Control tokens are the tokenizer's special tokens plus the added tokens that occur in its chat template (Qwen's
``<tool_call>``, DeepSeek-R1's ``<｜User｜>``), the rule transformers' own ``sanitize_control_tokens`` uses. A caller
who really passes raw markup opts out with ``raw_markup=True`` (``RelayEngine.encode_messages`` and the adapters).
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# Unicode noncharacters U+FDD0..U+FDEF: never assigned, meant for exactly this kind of internal marking.
_MARKER_CANDIDATES = tuple(chr(code) for code in range(0xFDD0, 0xFDF0))


@dataclass(frozen=True)
class ControlTokens:
    """What one tokenizer (with one chat template) treats as markup."""

    control: re.Pattern[str]  # any control-token string (longest first)
    added: re.Pattern[str]  # any added token, as the tokenizer splits text at them before encoding the rest
    group_ids: tuple[int, ...]  # the id of the token each group of ``added`` matches (group k -> group_ids[k - 1])
    control_ids: frozenset[int]


_CACHE: weakref.WeakKeyDictionary[Any, tuple[str, ControlTokens]] = weakref.WeakKeyDictionary()


def _alternation(tokens: Sequence[str]) -> str:
    return "|".join(re.escape(token) for token in sorted(tokens, key=len, reverse=True)) or "(?!)"


def control_tokens(tokenizer: PreTrainedTokenizerBase, template: str) -> ControlTokens:
    """The control tokens of ``tokenizer`` under ``template`` (computed once per tokenizer and template)."""
    cached = _CACHE.get(tokenizer)
    if cached is not None and cached[0] == template:
        return cached[1]
    added = list(tokenizer.added_tokens_decoder.items())
    control = [
        tok.content for _id, tok in added if tok.special or (tok.content in template and not tok.content.isspace())
    ]
    # An added token's own flags say how the tokenizer matches it: whitespace it swallows, whole words only.
    forms, group_ids = [], []
    for token_id, tok in sorted(added, key=lambda item: len(item[1].content), reverse=True):
        form = re.escape(tok.content)
        if getattr(tok, "single_word", False):
            form = rf"(?<!\w){form}(?!\w)"
        left, right = (r"\s*" if getattr(tok, side, False) else "" for side in ("lstrip", "rstrip"))
        forms.append(left + form + right)
        group_ids.append(token_id)
    tokens = ControlTokens(
        control=re.compile(_alternation(control)),
        added=re.compile("|".join(f"({form})" for form in forms) or "(?!)"),
        group_ids=tuple(group_ids),
        control_ids=frozenset(token_id for token_id, tok in added if tok.content in control),
    )
    _CACHE[tokenizer] = (template, tokens)
    return tokens


def strings_in(value: Any) -> Iterator[str]:
    """Every string in a JSON-like value: dict keys and values, list items."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            if isinstance(key, str):
                yield key
            yield from strings_in(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from strings_in(item)


def holds_control_text(tokens: ControlTokens, *values: Any) -> bool:
    return any(tokens.control.search(text) for value in values for text in strings_in(value))


def pick_markers(*values: Any) -> tuple[str, str]:
    """Two noncharacters that no input string holds, so no input can pass for a marked token."""
    used = {ch for value in values for text in strings_in(value) for ch in text if "\ufdd0" <= ch <= "\ufdef"}
    free = [ch for ch in _MARKER_CANDIDATES if ch not in used]
    if len(free) < 2:
        # 30 of the 32 reserved noncharacters in one request's strings: nothing a chat holds by accident.
        raise ValueError("the messages hold the Unicode noncharacters U+FDD0..U+FDEF, which are reserved here")
    return free[0], free[1]


def mark(value: Any, tokens: ControlTokens, start: str, end: str) -> Any:
    """A copy of ``value`` whose strings have each control-token string wrapped as ``start + token + end``."""
    if isinstance(value, str):
        return tokens.control.sub(lambda match: start + match.group(0) + end, value)
    if isinstance(value, Mapping):
        return {mark(key, tokens, start, end): mark(item, tokens, start, end) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [mark(item, tokens, start, end) for item in value]
    return value


def encode_marked(
    tokenizer: PreTrainedTokenizerBase, text: str, tokens: ControlTokens, start: str, end: str
) -> list[int]:
    """Ids of a chat rendered from marked inputs: the template's added tokens as tokens, everything else - marked
    control-token strings included - as plain text. A lone marker (a template that split a marked string) is
    dropped."""
    escaped = f"\\u{ord(start):04x}"
    if escaped in text.lower():
        raise ValueError(
            "the chat template escapes non-ASCII characters in JSON, so control-token text inside tools or tool-call "
            "arguments cannot be kept apart from its own markup; remove that text or pass raw_markup=True"
        )
    pieces = re.split(f"{start}({tokens.control.pattern}){end}|[{start}{end}]", text)
    ids: list[int] = []
    run: list[str] = []

    def flush() -> None:
        if run:
            run_ids = plain_ids(tokenizer, "".join(run), tokens, at_start=not ids)
            if tokens.control_ids.intersection(run_ids):  # a vocabulary whose merges can spell a control token
                raise ValueError(f"this tokenizer turns the text {''.join(run)[:80]!r} into a control token")
            ids.extend(run_ids)
            run.clear()

    for index, piece in enumerate(pieces):
        if index % 2:  # a marked control-token string: text (None for a lone marker: nothing)
            run.append(piece or "")
            continue
        position = 0
        for match in tokens.added.finditer(piece):
            run.append(piece[position : match.start()])
            flush()
            ids.append(tokens.group_ids[(match.lastindex or 1) - 1])
            position = match.end()
        run.append(piece[position:])
    flush()
    return ids


def plain_ids(tokenizer: PreTrainedTokenizerBase, text: str, tokens: ControlTokens, at_start: bool) -> list[int]:
    """``text`` encoded with no added token recognised (normalizer, pre-tokenizer and model of the tokenizer's own
    pipeline). A piece after the start is encoded after a newline that is then removed, so a SentencePiece-style
    pre-tokenizer does not add the word-start marker it adds at the start of a text."""
    if not text:
        return []
    if at_start:
        return _without_added_tokens(tokenizer, text, tokens)
    newline = _without_added_tokens(tokenizer, "\n", tokens)
    ids = _without_added_tokens(tokenizer, "\n" + text, tokens)
    return ids[len(newline) :] if ids[: len(newline)] == newline else _without_added_tokens(tokenizer, text, tokens)


def _without_added_tokens(tokenizer: PreTrainedTokenizerBase, text: str, tokens: ControlTokens) -> list[int]:
    backend = getattr(tokenizer, "_tokenizer", None)
    model = getattr(backend, "model", None)
    if model is None:  # a pure-Python tokenizer: special tokens split as text; a control id left over is refused
        ids = list(tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True))
        if tokens.control_ids.intersection(ids):
            raise ValueError(f"this tokenizer cannot encode {text[:80]!r} as plain text; pass raw_markup=True")
        return ids
    normalized = backend.normalizer.normalize_str(text) if backend.normalizer is not None else text
    words = (
        backend.pre_tokenizer.pre_tokenize_str(normalized)
        if backend.pre_tokenizer is not None
        else [(normalized, None)]
    )
    return [token.id for word, _offsets in words for token in model.tokenize(word)]
