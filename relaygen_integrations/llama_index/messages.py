"""LlamaIndex messages and tools <-> the OpenAI-style dicts the chat layer takes.

``to_relay_messages`` renders a LlamaIndex history (text and tool-call blocks, or ``additional_kwargs["tool_calls"]``
from other LLMs) as template dicts; ``tool_dicts`` converts LlamaIndex tools; ``assistant_message`` builds the
assistant ChatMessage (tool-call blocks plus the OpenAI wire shape) from parsed model output.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any

from llama_index.core.base.llms.types import (
    CachePoint,
    ChatMessage,
    MessageRole,
    TextBlock,
    ThinkingBlock,
    ToolCallBlock,
)

from ..chat.tool_calls import InvalidToolCall, ToolCall, assistant_tool_calls_for_template

_ROLE_MAP: dict[str, str] = {
    MessageRole.SYSTEM.value: "system",
    MessageRole.DEVELOPER.value: "system",
    MessageRole.USER.value: "user",
    MessageRole.ASSISTANT.value: "assistant",
    MessageRole.CHATBOT.value: "assistant",
    MessageRole.MODEL.value: "assistant",
    MessageRole.TOOL.value: "tool",
    MessageRole.FUNCTION.value: "tool",
}


# -- message conversion -------------------------------------------------------------------------------------------
def to_relay_messages(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    """LlamaIndex messages -> the OpenAI-style dicts the chat template renders.

    Assistant tool calls come from ToolCallBlocks (or, for histories written by other LLMs, from
    ``additional_kwargs["tool_calls"]``); a tool result is a TOOL message with ``additional_kwargs["tool_call_id"]``.
    """
    converted: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        role_value = message.role.value if isinstance(message.role, MessageRole) else str(message.role)
        role = _ROLE_MAP.get(role_value)
        if role is None:
            raise ValueError(f"message {index} has role {role_value!r}, which the chat template cannot render")
        texts: list[str] = []
        thoughts: list[str] = []
        calls: list[dict[str, Any]] = []
        for block in message.blocks:
            if isinstance(block, TextBlock):
                texts.append(block.text)
            elif isinstance(block, ToolCallBlock):
                calls.append(_template_call(block.tool_call_id, block.tool_name, block.tool_kwargs))
            elif isinstance(block, ThinkingBlock):
                thoughts.append(block.content or "")
            elif isinstance(block, CachePoint):  # a cache hint means nothing to a local model
                continue
            else:
                raise ValueError(
                    f"message {index} ({role}) holds a {type(block).__name__}: the relay model pair is text-only, "
                    "so only text and tool-call blocks can be sent (no images, audio, video or documents)"
                )
        if not calls and role == "assistant":
            calls = [_template_call_from_kwargs(raw) for raw in message.additional_kwargs.get("tool_calls") or []]
        entry: dict[str, Any] = {"role": role, "content": "\n".join(texts)}
        if role == "assistant" and any(thoughts):
            # The reasoning goes to the chat template, which renders it where the model expects (Qwen3: inside
            # <think> for the turns after the last user message) or drops it, as reasoning templates do.
            entry["reasoning_content"] = "".join(thoughts)
        if calls:
            entry["tool_calls"] = calls
        if role == "tool":
            call_id = message.additional_kwargs.get("tool_call_id")
            if call_id:
                entry["tool_call_id"] = str(call_id)
            name = message.additional_kwargs.get("name")
            if name:
                entry["name"] = str(name)
        converted.append(entry)
    return converted


def _template_call(call_id: str | None, name: str, arguments: Mapping[str, Any] | str) -> dict[str, Any]:
    call: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": arguments_dict(arguments)}}
    if call_id:
        call["id"] = call_id
    return call


def _template_call_from_kwargs(raw: Any) -> dict[str, Any]:
    """An OpenAI-style tool call (a dict, or an SDK object with ``.function``) from ``additional_kwargs``."""
    function = raw.get("function") if isinstance(raw, Mapping) else getattr(raw, "function", None)
    call_id = raw.get("id") if isinstance(raw, Mapping) else getattr(raw, "id", None)
    if isinstance(function, Mapping):
        name, arguments = function.get("name"), function.get("arguments", {})
    else:
        name, arguments = getattr(function, "name", None), getattr(function, "arguments", {})
    if not isinstance(name, str) or not name:
        raise ValueError(f"assistant tool call {raw!r} has no function name")
    return _template_call(call_id, name, arguments if arguments is not None else {})


def arguments_dict(arguments: Mapping[str, Any] | str) -> dict[str, Any] | str:
    """Arguments as an object, as the template renders them; a string that is not a JSON object stays as written."""
    if isinstance(arguments, Mapping):
        return dict(arguments)
    try:
        parsed = json.loads(arguments) if arguments.strip() else {}
    except json.JSONDecodeError:
        return arguments
    return parsed if isinstance(parsed, dict) else arguments


def tool_dicts(tools: Sequence[Any] | None) -> list[dict[str, Any]] | None:
    """Tools as OpenAI dicts: LlamaIndex tools are converted, dicts are passed on (the chat layer validates them)."""
    if not tools:
        return None
    converted = []
    for tool in tools:
        metadata = getattr(tool, "metadata", None)
        converted.append(metadata.to_openai_tool(skip_length_check=True) if metadata is not None else tool)
    return converted


# -- assistant messages -------------------------------------------------------------------------------------------
def assistant_message(
    content: str, calls: Sequence[ToolCall], invalid: Sequence[InvalidToolCall] = (), reasoning: str | None = None
) -> ChatMessage:
    blocks: list[Any] = [ThinkingBlock(content=reasoning)] if reasoning else []
    if content or not calls:
        blocks.append(TextBlock(text=content))
    blocks.extend(ToolCallBlock(tool_call_id=c.id, tool_name=c.name, tool_kwargs=c.arguments) for c in calls)
    extra: dict[str, Any] = {}
    if calls:
        # The OpenAI wire shape (arguments as a JSON string): what LlamaIndex code outside the LLM class inspects
        # (chat engines' is_function, structured-output programs) and what other function-calling LLMs put here.
        extra["tool_calls"] = [
            {**call, "function": {**call["function"], "arguments": json.dumps(call["function"]["arguments"])}}
            for call in assistant_tool_calls_for_template(calls)
        ]
    if invalid:
        # Kept, never raised: an agent sees no tool call and the caller can inspect what the model wrote.
        extra["invalid_tool_calls"] = [asdict(call) for call in invalid]
    return ChatMessage(role=MessageRole.ASSISTANT, blocks=blocks, additional_kwargs=extra)
