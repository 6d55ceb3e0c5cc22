"""LlamaIndex adapter: ``RelayLLM``, a FunctionCallingLLM over one RelayEngine.

The adapter only converts: LlamaIndex messages and tools to the OpenAI-style dicts the chat layer takes, and the chat
layer's deltas (text tagged with the model that wrote it, completed tool calls, switches, the final result) back to
LlamaIndex responses and instrumentation events. Prompt rendering, tool-choice prefills and tool-call parsing live in
``relaygen_integrations.chat`` and are shared with the LangChain adapter.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llama_index.core.base.llms.types import (
    CachePoint,
    ChatMessage,
    ChatResponse,
    ChatResponseAsyncGen,
    ChatResponseGen,
    CompletionResponse,
    CompletionResponseAsyncGen,
    CompletionResponseGen,
    LLMMetadata,
    MessageRole,
    TextBlock,
    ThinkingBlock,
    ToolCallBlock,
)
from llama_index.core.bridge.pydantic import Field
from llama_index.core.constants import DEFAULT_CONTEXT_WINDOW
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.events.base import BaseEvent
from llama_index.core.instrumentation.span import active_span_id
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.llms.function_calling import FunctionCallingLLM
from llama_index.core.llms.llm import ToolSelection

from ..chat.model_fields import RelayModelFields
from ..chat.relay_chat import ChatDelta, ChatRequest, astream_chat, prepare_chat, stream_chat
from ..chat.tool_calls import InvalidToolCall, ParsedOutput, ToolCall, assistant_tool_calls_for_template
from ..engine.settings import GenerationSettings, merge_settings
from ..engine.spans import FinalEvent, RelayResult, StreamEvent, SwitchEvent, TextEvent

if TYPE_CHECKING:
    from llama_index.core.tools.types import BaseTool

    from ..engine.engine import RelayEngine
    from ..engine.settings import GenerationPlan

logger = logging.getLogger(__name__)
dispatcher = get_dispatcher(__name__)

# Per-call keyword arguments that override the LLM's generation settings; anything else LlamaIndex passes through
# (it forwards whatever a caller gives chat_with_tools) is ignored, as other LlamaIndex LLMs do.
_SETTING_KEYS = (
    "max_tokens", "max_new_tokens", "temperature", "top_p", "top_k", "seed", "stop", "mode", "speculative", "cues",
)  # fmt: skip
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


class RelaySwitchEvent(BaseEvent):
    """The writer of a relay generation changed (large -> small at a cue, small -> large at a sentence end, ...).

    Dispatched with the span id of the LLM call that produced it, so span handlers can attach it to that call.
    """

    from_model: str
    to_model: str
    trigger: str
    char_offset: int
    span_index: int

    @classmethod
    def class_name(cls) -> str:
        return "RelaySwitchEvent"


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
        calls: list[dict[str, Any]] = []
        for block in message.blocks:
            if isinstance(block, TextBlock):
                texts.append(block.text)
            elif isinstance(block, ToolCallBlock):
                calls.append(_template_call(block.tool_call_id, block.tool_name, block.tool_kwargs))
            elif isinstance(block, (CachePoint, ThinkingBlock)):
                # A cache hint means nothing to a local model; earlier reasoning is dropped from history the way
                # reasoning-model chat templates drop it themselves.
                continue
            else:
                raise ValueError(
                    f"message {index} ({role}) holds a {type(block).__name__}: the relay model pair is text-only, "
                    "so only text and tool-call blocks can be sent (no images, audio, video or documents)"
                )
        if not calls and role == "assistant":
            calls = [_template_call_from_kwargs(raw) for raw in message.additional_kwargs.get("tool_calls") or []]
        entry: dict[str, Any] = {"role": role, "content": "\n".join(texts)}
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
    call: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": _arguments_dict(arguments)}}
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


def _arguments_dict(arguments: Mapping[str, Any] | str) -> dict[str, Any] | str:
    """Arguments as an object, as the template renders them; a string that is not a JSON object stays as written."""
    if isinstance(arguments, Mapping):
        return dict(arguments)
    try:
        parsed = json.loads(arguments) if arguments.strip() else {}
    except json.JSONDecodeError:
        return arguments
    return parsed if isinstance(parsed, dict) else arguments


def _tool_dicts(tools: Sequence[Any] | None) -> list[dict[str, Any]] | None:
    """Tools as OpenAI dicts: LlamaIndex tools are converted, dicts are passed on (the chat layer validates them)."""
    if not tools:
        return None
    converted = []
    for tool in tools:
        metadata = getattr(tool, "metadata", None)
        converted.append(metadata.to_openai_tool(skip_length_check=True) if metadata is not None else tool)
    return converted


# -- responses ----------------------------------------------------------------------------------------------------
def _assistant_message(content: str, calls: Sequence[ToolCall], invalid: Sequence[InvalidToolCall] = ()) -> ChatMessage:
    blocks: list[Any] = []
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


def _raw(result: RelayResult) -> dict[str, Any]:
    """``raw["usage"]`` carries prompt/completion/total tokens under the names TokenCountingHandler reads, so it
    counts the engine's exact numbers instead of re-tokenizing with its own tokenizer."""
    return {"usage": result.usage.to_dict(), "finish_reason": result.finish_reason}


def _delta_tags(model: str | None, span_index: int) -> dict[str, Any]:
    return {"relaygen_model": model, "relaygen_span": span_index}


def _dispatch_switch(switch: SwitchEvent, span_id: str | None) -> None:
    # The span id is captured when the call starts: a stream is consumed after the call's span has been exited,
    # so the active span at consumption time belongs to the consumer, not to this LLM call.
    dispatcher.event(
        RelaySwitchEvent(
            from_model=switch.from_model,
            to_model=switch.to_model,
            trigger=switch.trigger,
            char_offset=switch.char_offset,
            span_index=switch.span_index,
            span_id=span_id,
        )
    )


class _ChatTurn:
    """Turns one turn's ChatDeltas into ChatResponses (streamed deltas, then the final response)."""

    def __init__(self, span_id: str | None, emit_deltas: bool = True) -> None:
        self.span_id = span_id
        self.emit_deltas = emit_deltas
        self.content = ""
        self.calls: list[ToolCall] = []

    def on_delta(self, delta: ChatDelta) -> ChatResponse | None:
        if delta.switch is not None:
            _dispatch_switch(delta.switch, self.span_id)
            return None
        if delta.result is not None:
            parsed = delta.parsed or ParsedOutput(content=self.content, tool_calls=self.calls)
            return ChatResponse(
                message=_assistant_message(parsed.content, parsed.tool_calls, parsed.invalid_tool_calls),
                delta="" if self.emit_deltas else None,
                raw=_raw(delta.result),
                additional_kwargs={"relaygen": delta.result.relay_metadata()},
            )
        if isinstance(delta.tool_call, ToolCall):
            self.calls.append(delta.tool_call)
            text = ""
        elif delta.text:
            self.content += delta.text
            text = delta.text
        else:
            return None  # an invalid tool call: it is reported on the final response
        if not self.emit_deltas:
            return None
        return ChatResponse(
            message=_assistant_message(self.content, self.calls),
            delta=text,
            additional_kwargs=_delta_tags(delta.model, delta.span_index),
        )


class _CompletionTurn:
    """Turns engine events into CompletionResponses (streamed deltas, then the final response)."""

    def __init__(self, span_id: str | None, emit_deltas: bool = True) -> None:
        self.span_id = span_id
        self.emit_deltas = emit_deltas
        self.text = ""

    def on_event(self, event: StreamEvent) -> CompletionResponse | None:
        if isinstance(event, SwitchEvent):
            _dispatch_switch(event, self.span_id)
            return None
        if isinstance(event, FinalEvent):
            result = event.result
            return CompletionResponse(
                text=result.text,
                delta="" if self.emit_deltas else None,
                raw=_raw(result),
                additional_kwargs={"relaygen": result.relay_metadata()},
            )
        if isinstance(event, TextEvent) and event.text:
            self.text += event.text
            if self.emit_deltas:
                return CompletionResponse(
                    text=self.text, delta=event.text, additional_kwargs=_delta_tags(event.model, event.span_index)
                )
        return None


def _last(responses: Iterator[Any]) -> Any:
    """The final response of a stream that was run only for its result."""
    tail = deque(responses, maxlen=1)
    if not tail:
        raise RuntimeError("generation ended without a result")
    return tail[0]


# -- the LLM ------------------------------------------------------------------------------------------------------
class RelayLLM(RelayModelFields, FunctionCallingLLM):
    """RelayGen as a LlamaIndex LLM: a large model reasons, a small model with the same tokenizer finishes the easy
    sentences (after switch cues) and writes the final answer.

    Construction is cheap: the pair loads on first use through ``RelayEngine.shared`` (one copy of the weights per
    configuration, also shared with the LangChain adapter), or pass a ready ``engine=``.
    """

    context_window: int | None = Field(
        default=None, gt=0, description="Override; by default the large model's max_position_embeddings."
    )

    def __init__(self, engine: RelayEngine | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._engine = engine

    @classmethod
    def class_name(cls) -> str:
        return "RelayLLM"

    # -- engine ------------------------------------------------------------------------------------------------
    @property
    def engine(self) -> RelayEngine:
        """The engine, loaded (or taken from the shared cache) on first access."""
        if self._engine is None:
            self._engine = self._load_engine()
        return self._engine

    def _load_engine(self) -> RelayEngine:
        return self.load_engine()

    async def _aengine(self) -> RelayEngine:
        # Loading takes seconds to minutes; a worker thread keeps the event loop responsive meanwhile.
        if self._engine is None:
            self._engine = await asyncio.to_thread(self._load_engine)
        return self._engine

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(
            context_window=self._context_window(),
            num_output=self.max_tokens,
            is_chat_model=True,
            is_function_calling_model=True,
            model_name=self._model_name(),
            system_role=MessageRole.SYSTEM,
        )

    def _context_window(self) -> int:
        # Metadata is read while indexes and query engines are built, so it must not load the models.
        if self.context_window is not None:
            return self.context_window
        if self._engine is not None:
            return int(self._engine.context_window)
        return _peek_context_window(self.large) or DEFAULT_CONTEXT_WINDOW

    def _model_name(self) -> str:
        if self._engine is not None:
            large, small = self._engine.large_name, self._engine.small_name
        else:
            large, small = _display_name(self.large, "large"), _display_name(self.small, "small")
        return f"relay({large}+{small})" if self.mode == "relay" else f"{self.mode}({large}+{small})"

    # -- request building --------------------------------------------------------------------------------------
    def _settings(self, overrides: Mapping[str, Any]) -> GenerationSettings:
        """The fields, overridden by the call's generation keywords (given, not None); LlamaIndex passes other
        keywords through (e.g. ``tool_required``), which are not generation settings."""
        given = {key: overrides[key] for key in _SETTING_KEYS if overrides.get(key) is not None}
        return merge_settings(self.settings_layer(), given)

    def _chat_request(self, messages: Sequence[ChatMessage], kwargs: Mapping[str, Any]) -> ChatRequest:
        return prepare_chat(
            to_relay_messages(messages),
            self._settings(kwargs),
            tools=_tool_dicts(kwargs.get("tools")),
            tool_choice=kwargs.get("tool_choice"),
            chat_template_kwargs=kwargs.get("chat_template_kwargs"),
        )

    def _completion_plan(
        self, engine: RelayEngine, prompt: str, formatted: bool, kwargs: Mapping[str, Any]
    ) -> GenerationPlan:
        """A validated plan: the chat template with one user message, or the raw prompt ids if ``formatted``."""
        settings = self._settings(kwargs)
        if formatted:
            return engine.plan(engine.tokenizer.encode(prompt, add_special_tokens=False), settings)
        return engine.plan(
            engine.encode_messages([{"role": "user", "content": prompt}], None, kwargs.get("chat_template_kwargs")),
            settings,
        )

    # -- chat --------------------------------------------------------------------------------------------------
    @llm_chat_callback()
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        request = self._chat_request(messages, kwargs)
        turn = _ChatTurn(active_span_id.get(), emit_deltas=False)
        return _last(r for d in stream_chat(self.engine, request) if (r := turn.on_delta(d)) is not None)

    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        # Not a generator function: the request is validated and the span id captured now, at call time.
        request = self._chat_request(messages, kwargs)
        turn = _ChatTurn(active_span_id.get())
        engine = self.engine

        def gen() -> ChatResponseGen:
            for delta in stream_chat(engine, request):
                response = turn.on_delta(delta)
                if response is not None:
                    yield response

        return gen()

    @llm_chat_callback()
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        request = self._chat_request(messages, kwargs)
        turn = _ChatTurn(active_span_id.get(), emit_deltas=False)
        final: ChatResponse | None = None
        async for delta in astream_chat(await self._aengine(), request):
            response = turn.on_delta(delta)
            if response is not None:
                final = response
        if final is None:
            raise RuntimeError("generation ended without a result")
        return final

    @llm_chat_callback()
    async def astream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseAsyncGen:
        request = self._chat_request(messages, kwargs)
        turn = _ChatTurn(active_span_id.get())
        engine = await self._aengine()

        async def gen() -> ChatResponseAsyncGen:
            async for delta in astream_chat(engine, request):
                response = turn.on_delta(delta)
                if response is not None:
                    yield response

        return gen()

    # -- completion --------------------------------------------------------------------------------------------
    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        """The prompt goes through the chat template as one user message, or as raw token ids if ``formatted``."""
        engine = self.engine
        plan = self._completion_plan(engine, prompt, formatted, kwargs)
        turn = _CompletionTurn(active_span_id.get(), emit_deltas=False)
        return _last(r for e in engine.run_plan(plan) if (r := turn.on_event(e)) is not None)

    @llm_completion_callback()
    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseGen:
        engine = self.engine
        plan = self._completion_plan(engine, prompt, formatted, kwargs)
        turn = _CompletionTurn(active_span_id.get())

        def gen() -> CompletionResponseGen:
            for event in engine.run_plan(plan):
                response = turn.on_event(event)
                if response is not None:
                    yield response

        return gen()

    @llm_completion_callback()
    async def acomplete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        engine = await self._aengine()
        plan = self._completion_plan(engine, prompt, formatted, kwargs)
        turn = _CompletionTurn(active_span_id.get(), emit_deltas=False)
        final: CompletionResponse | None = None
        async for event in engine.astream_plan(plan):
            response = turn.on_event(event)
            if response is not None:
                final = response
        if final is None:
            raise RuntimeError("generation ended without a result")
        return final

    @llm_completion_callback()
    async def astream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseAsyncGen:
        engine = await self._aengine()
        plan = self._completion_plan(engine, prompt, formatted, kwargs)
        turn = _CompletionTurn(active_span_id.get())

        async def gen() -> CompletionResponseAsyncGen:
            events: AsyncIterator[StreamEvent] = engine.astream_plan(plan)
            async for event in events:
                response = turn.on_event(event)
                if response is not None:
                    yield response

        return gen()

    # -- tools -------------------------------------------------------------------------------------------------
    def _prepare_chat_with_tools(
        self,
        tools: Sequence[BaseTool],
        user_msg: str | ChatMessage | None = None,
        chat_history: list[ChatMessage] | None = None,
        verbose: bool = False,
        allow_parallel_tool_calls: bool = False,
        tool_required: bool = False,
        tool_choice: str | dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        messages = list(chat_history or [])
        if user_msg is not None:
            messages.append(
                ChatMessage(role=MessageRole.USER, content=user_msg) if isinstance(user_msg, str) else user_msg
            )
        if tool_choice is None and tool_required:
            tool_choice = "required"  # the chat layer prefills "<tool_call>" so the model can only call a tool
        return {
            "messages": messages,
            "tools": _tool_dicts(tools),
            **({"tool_choice": tool_choice} if tool_choice is not None else {}),
            **kwargs,
        }

    def _validate_chat_with_tools_response(
        self,
        response: ChatResponse,
        tools: Sequence[BaseTool],
        allow_parallel_tool_calls: bool = False,
        **kwargs: Any,
    ) -> ChatResponse:
        """Keeps only the first tool call unless parallel calls are allowed (as LlamaIndex's OpenAI LLM does)."""
        blocks = response.message.blocks
        calls = [b for b in blocks if isinstance(b, ToolCallBlock)]
        if allow_parallel_tool_calls or len(calls) <= 1:
            return response
        response.message.blocks = [b for b in blocks if not isinstance(b, ToolCallBlock)] + calls[:1]
        wire_calls = response.message.additional_kwargs.get("tool_calls")
        if isinstance(wire_calls, list):
            response.message.additional_kwargs["tool_calls"] = wire_calls[:1]
        return response

    def get_tool_calls_from_response(
        self, response: ChatResponse, error_on_no_tool_call: bool = True, **kwargs: Any
    ) -> list[ToolSelection]:
        calls = [b for b in response.message.blocks if isinstance(b, ToolCallBlock)]
        if not calls:
            if error_on_no_tool_call:
                invalid = response.message.additional_kwargs.get("invalid_tool_calls") or []
                detail = f"; the model wrote {len(invalid)} malformed tool call(s): {invalid}" if invalid else ""
                raise ValueError(f"Expected at least one tool call, but got 0 tool calls{detail}")
            return []
        selections = []
        for call in calls:
            arguments = _arguments_dict(call.tool_kwargs)
            selections.append(
                ToolSelection(
                    tool_id=call.tool_call_id or "",
                    tool_name=call.tool_name,
                    tool_kwargs=arguments if isinstance(arguments, dict) else {},
                )
            )
        return selections


RelayChatModel = RelayLLM


# -- names and sizes without loading ------------------------------------------------------------------------------
def _display_name(ref: str, role: str) -> str:
    """``demo`` -> ``demo:large`` (what the loaded engine will call it); other references are shown as given."""
    from ..registry import KNOWN_PAIRS

    return f"{ref}:{role}" if ref in KNOWN_PAIRS else ref


def _peek_context_window(ref: str) -> int | None:
    """The large model's context window from its config.json when it is on disk already (a cached pair or a local
    directory); never downloads or loads weights."""
    try:
        from ..registry import KNOWN_PAIRS, pair_paths

        pair, _, role = ref.partition(":")
        if pair in KNOWN_PAIRS:
            paths = pair_paths(pair)
            directory = paths.for_role("small" if role == "small" else "large") if paths is not None else None
        else:
            directory = Path(ref) if Path(ref).is_dir() else None
        if directory is None or not (directory / "config.json").is_file():
            return None
        config = json.loads((directory / "config.json").read_text())
        value = config.get("max_position_embeddings") or (config.get("text_config") or {}).get(
            "max_position_embeddings"
        )
        return int(value) if value else None
    except (OSError, ValueError, TypeError) as exc:
        logger.debug("could not read the context window of %s: %s", ref, exc)
        return None
