"""A model pair's identity, shared by every backend: known pair names, tokenizer loading and the check that both
models share one tokenizer, the reasoning-end marker. No torch: the remote backend loads a tokenizer through here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from ...registry import KNOWN_PAIRS, pair_paths, resolve_model
from .spans import ModelRole


class ModelLoadError(RuntimeError):
    """A model or tokenizer could not be loaded from what the caller named."""


class TokenizerMismatchError(ValueError):
    """The two models do not share a tokenizer, so one token sequence cannot feed both."""


def known_pair(large: str, small: str) -> str | None:
    """The known pair (``"demo"``) both references name, e.g. ``demo`` / ``demo:small``; else None."""
    names = {ref.split(":", 1)[0] for ref in (large, small)}
    name = names.pop() if len(names) == 1 else None
    return name if name in KNOWN_PAIRS else None


# The window of a config that names none: Qwen2.5's, the demo pair's own.
FALLBACK_CONTEXT_WINDOW = 32768


def context_window_of(config: Mapping[str, Any]) -> int:
    """The context window a model's config declares: ``max_position_embeddings`` at its top or in its
    ``text_config`` (multimodal configs), else ``FALLBACK_CONTEXT_WINDOW``. The one reader behind the engine's
    ``context_window``, LangChain's profile and LlamaIndex's metadata, so they cannot disagree."""
    text = config.get("text_config")
    value = config.get("max_position_embeddings") or (
        text.get("max_position_embeddings") if isinstance(text, Mapping) else None
    )
    try:
        window = int(value) if value else 0
    except (TypeError, ValueError):
        window = 0
    return window if window > 0 else FALLBACK_CONTEXT_WINDOW


def large_model_folder(large: str, small: str | None = None) -> Path | None:
    """The large model's folder when it is on disk already - a fetched known pair, or a local directory holding a
    ``config.json`` - else None. Never downloads: adapters ask before any model loads."""
    pair = known_pair(large, small if small is not None else large)
    if pair is not None:
        paths = pair_paths(pair)
        return Path(paths.large) if paths is not None else None
    folder = Path(large)
    return folder if (folder / "config.json").is_file() else None


def peek_context_window(large: str, small: str | None = None) -> int | None:
    """:func:`context_window_of` the large model's ``config.json`` on disk, without loading it; None when the folder
    is not there or its config cannot be read."""
    folder = large_model_folder(large, small)
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8")) if folder is not None else None
    except (OSError, ValueError):
        return None
    return context_window_of(config) if isinstance(config, Mapping) else None


def resolve_reference(ref: str, role: ModelRole, copy: str = "bf16") -> tuple[str, str | None]:
    """Maps a user's model name to something ``from_pretrained`` accepts, plus the known pair's name if any. ``copy``:
    which converted copy of a known pair to read (``"bf16"`` or ``"fp32"``, see ``local/weights.dtype_tag``)."""
    pair = ref.split(":", 1)[0]
    return resolve_model(ref, role, dtype=copy), (pair if pair in KNOWN_PAIRS else None)


def load_tokenizer(ref: str, trust_remote_code: bool = False) -> PreTrainedTokenizerBase:
    try:
        return AutoTokenizer.from_pretrained(ref, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"could not load a tokenizer from {ref!r}: {exc}") from exc


def check_tokenizers_match(large: PreTrainedTokenizerBase, small: PreTrainedTokenizerBase) -> None:
    """Both models must map text to the same ids; differing *embedding* sizes (padding rows) are fine."""
    large_vocab, small_vocab = large.get_vocab(), small.get_vocab()
    if large_vocab == small_vocab:
        return
    large_by_id = {i: t for t, i in large_vocab.items()}
    small_by_id = {i: t for t, i in small_vocab.items()}
    for token_id in range(max(len(large_by_id), len(small_by_id)) + 1):
        a, b = large_by_id.get(token_id), small_by_id.get(token_id)
        if a != b:
            raise TokenizerMismatchError(
                f"the large and small tokenizers differ first at token id {token_id}: large has {a!r}, small has "
                f"{b!r} (vocab sizes {len(large_vocab)} vs {len(small_vocab)}); relay needs one shared tokenizer"
            )
    raise TokenizerMismatchError("the large and small tokenizers assign different ids to the same tokens")


def reasoning_end_marker(tokenizer: PreTrainedTokenizerBase) -> str | None:
    """``</think>`` when the tokenizer knows it as a token (thinking models), else None."""
    return "</think>" if "</think>" in tokenizer.get_vocab() else None
