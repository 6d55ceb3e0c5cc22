"""What a pair can do, as the frameworks ask for it (LangChain's ``BaseChatModel.profile``), without loading weights.

The large model's context window bounds the input (and what is left of it, the output); a pair whose tokenizer knows
``</think>`` (or whose policy has a reasoning end) separates reasoning. Tool calling, tool choice and structured
output are the chat layer's, for every pair. Read from the loaded engine when there is one, else from the large
model's ``config.json`` and tokenizer files (a known pair's cached copy, or a local directory); a hub id that is not on
this machine gives no profile (``None``), since nothing may be fetched to build one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..engine.core.pairs import known_pair

if TYPE_CHECKING:
    from .model_fields import RelayModelFields


def pair_profile(fields: RelayModelFields) -> dict[str, Any] | None:
    """LangChain's ``ModelProfile`` keys for the pair ``fields`` names (or the engine it was handed)."""
    engine = fields._engine
    if engine is not None:
        config = engine.policy_config
        return _profile(engine.context_window, bool(config.reasoning_end or config.answer_marker))
    folder = _large_folder(fields.large, fields.small)
    if folder is None:
        return None
    settings = json.loads((folder / "config.json").read_text())
    window = int(settings.get("max_position_embeddings") or 32768)  # what engine/local/loading.context_window reads
    tokenizer_config = folder / "tokenizer_config.json"
    thinks = tokenizer_config.exists() and "</think>" in tokenizer_config.read_text()
    return _profile(window, thinks)


def _large_folder(large: str, small: str) -> Path | None:
    pair = known_pair(large, small)
    if pair is not None:
        from ..registry import pair_paths

        paths = pair_paths(pair)
        return Path(paths.large) if paths is not None else None
    folder = Path(large)
    return folder if (folder / "config.json").exists() else None


def _profile(context_window: int, reasoning: bool) -> dict[str, Any]:
    return {
        "max_input_tokens": context_window,
        "max_output_tokens": context_window,  # the room the prompt leaves: the request's budget is clipped to it
        "open_weights": True,
        "text_inputs": True,
        "text_outputs": True,
        "image_inputs": False,
        "audio_inputs": False,
        "video_inputs": False,
        "pdf_inputs": False,
        "tool_calling": True,
        "tool_choice": True,
        "tool_call_streaming": True,
        "structured_output": True,
        "reasoning_output": reasoning,
    }
