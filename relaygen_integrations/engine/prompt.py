"""Rendering OpenAI-style message dicts (and tool schemas) to prompt token ids through the model's own chat template.

It lives in the engine because ``RelayEngine.generate(messages)`` renders prompts itself; the chat layer above
(``chat/``) builds on it and never the other way round.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

ROLES = frozenset({"system", "user", "assistant", "tool"})


class MessageError(ValueError):
    """The messages cannot be rendered into a prompt."""


class ToolSchemaError(ValueError):
    """A tool definition is not an OpenAI-style function schema."""


def validate_tools(tools: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Checks OpenAI-style tool schemas (``{"type": "function", "function": {"name", "parameters"}}``)."""
    checked = []
    for index, tool in enumerate(tools):
        if not isinstance(tool, Mapping):
            raise ToolSchemaError(f"tool {index} is a {type(tool).__name__}, not an OpenAI-style tool dict")
        function = tool.get("function")
        if tool.get("type") != "function" or not isinstance(function, Mapping):
            raise ToolSchemaError(f"tool {index} must look like {{'type': 'function', 'function': {{...}}}}")
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise ToolSchemaError(f"tool {index} has no function name")
        parameters = function.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(parameters, Mapping) or parameters.get("type", "object") != "object":
            raise ToolSchemaError(f"tool {name!r}: 'parameters' must be a JSON schema of type 'object'")
        checked.append(dict(tool))
    return checked


def validate_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Checks the shape the chat template expects and returns plain dict copies."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise MessageError("messages must be a list of {'role': ..., 'content': ...} dicts")
    if not messages:
        raise MessageError("messages is empty: give at least one user message")
    checked: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise MessageError(f"message {index} is a {type(message).__name__}, not a dict")
        role = message.get("role")
        if role not in ROLES:
            raise MessageError(f"message {index} has unknown role {role!r}; use one of {sorted(ROLES)}")
        content = message.get("content")
        if content is None and not message.get("tool_calls"):
            raise MessageError(f"message {index} ({role}) has no content")
        if content is not None and not isinstance(content, str):
            raise MessageError(
                f"message {index} ({role}) content must be text; got {type(content).__name__} "
                "(images, audio and other content parts are not supported by a text-only model pair)"
            )
        checked.append(dict(message))
    return checked


def render_prompt_text(
    tokenizer: PreTrainedTokenizerBase,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    add_generation_prompt: bool = True,
) -> str:
    checked = validate_messages(messages)
    if tokenizer.chat_template is None:
        raise MessageError("the tokenizer has no chat template; pass prompt token ids instead of messages")
    return tokenizer.apply_chat_template(
        checked,
        tools=validate_tools(tools) if tools else None,
        add_generation_prompt=add_generation_prompt,
        tokenize=False,
        **dict(chat_template_kwargs or {}),
    )


def render_prompt_ids(
    tokenizer: PreTrainedTokenizerBase,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    assistant_prefix: str | None = None,
) -> list[int]:
    """Prompt ids for a chat; the template already holds the special tokens, so none are added on top.

    ``assistant_prefix`` is prefilled into the assistant turn (e.g. ``<tool_call>`` to force a tool call); the
    model continues after it.
    """
    text = render_prompt_text(tokenizer, messages, tools, chat_template_kwargs) + (assistant_prefix or "")
    return list(tokenizer.encode(text, add_special_tokens=False))
