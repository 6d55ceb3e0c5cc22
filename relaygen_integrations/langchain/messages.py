"""LangChain messages -> the OpenAI-style dicts the chat template renders (tool calls, tool results, reasoning)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, ChatMessage, HumanMessage, SystemMessage, ToolMessage

from ..engine.core.prompt import TEXT_PART_SEPARATOR

_ROLE_OF = {"human": "user", "user": "user", "ai": "assistant", "assistant": "assistant", "system": "system"}
# Content blocks that restate what AIMessage.tool_calls carries (rendered from there) or a provider's hidden reasoning.
_SKIPPED_AI_BLOCKS = frozenset(
    {"tool_use", "tool_call", "tool_call_chunk", "function_call", "server_tool_call", "reasoning", "thinking"}
)


def _text_content(message: BaseMessage) -> str:
    content = message.content
    if isinstance(content, str):
        return content
    parts = []
    for block in content:
        if isinstance(block, str):
            parts.append(block)
        elif isinstance(block, Mapping) and block.get("type") == "text":
            parts.append(str(block.get("text", "")))
        elif isinstance(message, AIMessage) and isinstance(block, Mapping) and block.get("type") in _SKIPPED_AI_BLOCKS:
            continue
        else:
            kind = block.get("type") if isinstance(block, Mapping) else type(block).__name__
            raise ValueError(
                f"{type(message).__name__} has a {kind!r} content block; this text-only model pair accepts text only"
            )
    return TEXT_PART_SEPARATOR.join(parts)  # as the engine joins an OpenAI message's text parts


def _reasoning_of(message: AIMessage) -> str:
    """The reasoning an AIMessage carries: ``additional_kwargs["reasoning_content"]`` (what this adapter returns) or
    v1 ``reasoning`` content blocks."""
    given = message.additional_kwargs.get("reasoning_content")
    if isinstance(given, str):
        return given
    blocks = message.content if isinstance(message.content, list) else []
    return "".join(
        str(block.get("reasoning", ""))
        for block in blocks
        if isinstance(block, Mapping) and block.get("type") == "reasoning"
    )


def convert_messages(messages: Sequence[BaseMessage]) -> list[dict[str, Any]]:
    """LangChain messages -> OpenAI-style dicts that the chat template renders (tool calls and results included)."""
    converted: list[dict[str, Any]] = []
    for message in messages:
        if isinstance(message, ToolMessage):
            converted.append({"role": "tool", "content": _text_content(message), "tool_call_id": message.tool_call_id})
        elif isinstance(message, AIMessage):
            entry: dict[str, Any] = {"role": "assistant", "content": _text_content(message)}
            reasoning = _reasoning_of(message)
            if reasoning:  # the chat template renders it (Qwen3: the latest turns' <think>) or drops it
                entry["reasoning_content"] = reasoning
            if message.tool_calls:
                entry["tool_calls"] = [
                    {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["args"]}}
                    for c in message.tool_calls
                ]
            converted.append(entry)
        elif isinstance(message, (HumanMessage, SystemMessage)):
            converted.append({"role": _ROLE_OF[message.type], "content": _text_content(message)})
        elif isinstance(message, ChatMessage):
            converted.append({"role": _ROLE_OF.get(message.role, message.role), "content": _text_content(message)})
        else:
            raise ValueError(f"unsupported message type {type(message).__name__}")
    return converted
