"""What a pair can do, as the frameworks ask for it (LangChain's ``BaseChatModel.profile``), without loading weights.

The large model's context window bounds the input (and what is left of it, the output); a pair whose tokenizer knows
``</think>`` (or whose policy has a reasoning end) separates reasoning. Tool calling, tool choice and structured
output are the chat layer's, for every pair. Whether a system message after the first turn stays where it sits is the
chat template's: a probe chat is rendered through it. Read from the loaded engine when there is one, else from the
large model's ``config.json``, tokenizer and template files (a known pair's cached copy, or a local directory); a hub
id that is not on this machine gives no profile (``None``), since nothing may be fetched to build one.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..engine.core.pairs import large_model_folder, peek_context_window

if TYPE_CHECKING:
    from .model_fields import RelayModelFields

ChatTemplate = str | Mapping[str, str] | None
# A conversation with a system message after the first turn; the markers show where the template puts each message.
_PROBE = (("user", "relaygen-probe-user-1"), ("assistant", "relaygen-probe-assistant"),
          ("system", "relaygen-probe-system"), ("user", "relaygen-probe-user-2"))  # fmt: skip


def pair_profile(fields: RelayModelFields) -> dict[str, Any] | None:
    """LangChain's ``ModelProfile`` keys for the pair ``fields`` names (or the engine it was handed)."""
    engine = fields._engine
    if engine is not None:
        config = engine.policy_config
        reasoning = bool(config.reasoning_end or config.answer_marker)
        return _profile(engine.context_window, reasoning, engine.tokenizer.chat_template)
    folder = large_model_folder(fields.large, fields.small)
    window = peek_context_window(fields.large, fields.small)
    if folder is None or window is None:
        return None
    tokenizer_config = folder / "tokenizer_config.json"
    thinks = tokenizer_config.exists() and "</think>" in tokenizer_config.read_text()
    return _profile(window, thinks, _template_of(folder))


def _template_of(folder: Path) -> ChatTemplate:
    """The chat template the tokenizer in ``folder`` loads: ``chat_template.jinja`` (transformers 5's file) or the
    ``chat_template`` entry of ``tokenizer_config.json`` (one string, or a list of named templates)."""
    jinja = folder / "chat_template.jinja"
    if jinja.exists():
        return jinja.read_text()
    config = folder / "tokenizer_config.json"
    template = json.loads(config.read_text()).get("chat_template") if config.exists() else None
    if isinstance(template, list):
        return {str(entry.get("name")): str(entry.get("template")) for entry in template if isinstance(entry, dict)}
    return template if isinstance(template, str) else None


@functools.lru_cache(maxsize=16)
def _system_stays(template: str) -> bool:
    """Whether ``template`` renders a system message after the first turn where it sits (between the turns before
    and after it). False where it moves it, drops it or refuses it (a template that allows one leading system message
    only raises)."""
    from jinja2 import TemplateError
    from transformers.utils.chat_template_utils import render_jinja_template

    chat = [{"role": role, "content": text} for role, text in _PROBE]
    try:
        rendered = render_jinja_template([chat], chat_template=template)[0][0]
    except (TemplateError, TypeError, ValueError):
        return False
    spots = [rendered.find(text) for _, text in _PROBE]
    return -1 not in spots and spots == sorted(spots)


def mid_conversation_system_messages(chat_template: ChatTemplate) -> bool:
    """The profile's ``mid_conversation_system_messages`` for a tokenizer's ``chat_template``: the default template
    (``"default"`` of several named ones) keeps a later system message in place. No template: no chat at all."""
    if isinstance(chat_template, Mapping):
        chat_template = chat_template.get("default")
    return isinstance(chat_template, str) and _system_stays(chat_template)


def _profile(context_window: int, reasoning: bool, chat_template: ChatTemplate) -> dict[str, Any]:
    return {
        "max_input_tokens": context_window,
        "max_output_tokens": context_window,  # the room the prompt leaves: the request's budget is clipped to it
        "open_weights": True,
        "text_inputs": True,
        "text_outputs": True,
        # Text only, in every place a message can carry content (the adapters refuse any other block, in a
        # ToolMessage too).
        "image_inputs": False,
        "image_url_inputs": False,
        "audio_inputs": False,
        "video_inputs": False,
        "pdf_inputs": False,
        "image_tool_message": False,
        "pdf_tool_message": False,
        "attachment": False,
        "image_outputs": False,
        "audio_outputs": False,
        "video_outputs": False,
        "tool_calling": True,
        "tool_choice": True,
        "tool_call_streaming": True,
        "structured_output": True,
        "reasoning_output": reasoning,
        # Thinking is on or off (the adapters' ``reasoning``), never graded: a ``reasoning_effort`` is refused.
        "reasoning_effort_levels": [],
        "temperature": True,  # sampling: temperature, top_p, top_k and a seed, greedy at 0
        "mid_conversation_system_messages": mid_conversation_system_messages(chat_template),
        # Tools come in the request's tool list only (rendered by the template into its system prompt).
        "mid_conversation_tools": False,
    }
