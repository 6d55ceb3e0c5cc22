"""LlamaIndex adapter: ``RelayLLM``, a FunctionCallingLLM over one RelayEngine.

The adapter only converts: LlamaIndex messages and tools to the OpenAI-style dicts the chat layer takes
(``messages``), and the chat layer's deltas (text tagged with the model that wrote it, completed tool calls, switches,
the final result) back to LlamaIndex responses and instrumentation events (``events``). This module holds the LLM
class itself: engine loading, metadata read without loading the models, request building and the chat, completion
and tool-calling entry points. Prompt rendering, tool-choice prefills and tool-call parsing live in
``relaygen_integrations.chat`` and are shared with the LangChain adapter.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    ChatResponseAsyncGen,
    ChatResponseGen,
    CompletionResponse,
    CompletionResponseAsyncGen,
    CompletionResponseGen,
    LLMMetadata,
    MessageRole,
    ToolCallBlock,
)
from llama_index.core.bridge.pydantic import Field
from llama_index.core.constants import DEFAULT_CONTEXT_WINDOW
from llama_index.core.instrumentation.span import active_span_id
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.llms.function_calling import FunctionCallingLLM
from llama_index.core.llms.llm import ToolSelection

from ..chat.model_fields import RelayModelFields
from ..chat.reasoning import thinking_template_kwargs
from ..chat.relay_chat import ChatRequest, astream_chat, prepare_chat, stream_chat
from ..engine.core.pairs import peek_context_window
from ..engine.core.prompt import MessageError, check_text
from ..engine.core.settings import KEYS, GenerationSettings, SettingsError, merge_settings, shown
from ..engine.core.spans import StreamEvent
from ..registry import KNOWN_PAIRS
from .events import ChatTurn, CompletionTurn, last_response
from .events import RelaySwitchEvent as RelaySwitchEvent
from .events import dispatcher as dispatcher
from .messages import arguments_dict, tool_dicts
from .messages import to_relay_messages as to_relay_messages
from .structured import JsonStructuredOutput

if TYPE_CHECKING:
    from llama_index.core.tools.types import BaseTool

    from ..engine.core.settings import GenerationPlan
    from ..engine.engine import RelayEngine

logger = logging.getLogger(__name__)


# -- the LLM ------------------------------------------------------------------------------------------------------
class RelayLLM(RelayModelFields, JsonStructuredOutput, FunctionCallingLLM):
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
        return peek_context_window(self.large, self.small) or DEFAULT_CONTEXT_WINDOW

    def _model_name(self) -> str:
        if self._engine is not None:
            large, small = self._engine.large_name, self._engine.small_name
        else:
            large, small = _display_name(self.large, "large"), _display_name(self.small, "small")
        return f"{self.writing_mode()}({large}+{small})"

    # -- request building --------------------------------------------------------------------------------------
    def _settings(self, overrides: Mapping[str, Any]) -> GenerationSettings:
        """The fields, overridden by the call's generation keywords (given, not None: any key merge_settings takes);
        anything else LlamaIndex passes through (it forwards whatever a caller gives chat_with_tools, e.g.
        ``tool_required``) is not a generation setting and is ignored, as other LlamaIndex LLMs do."""
        given = {key: value for key, value in overrides.items() if key in KEYS and value is not None}
        return merge_settings(self.settings_layer(), given)

    def _chat_request(self, messages: Sequence[ChatMessage], kwargs: Mapping[str, Any]) -> ChatRequest:
        return prepare_chat(
            to_relay_messages(messages),
            self._settings(kwargs),
            tools=tool_dicts(kwargs.get("tools")),
            tool_choice=kwargs.get("tool_choice"),
            chat_template_kwargs=kwargs.get("chat_template_kwargs"),
            raw_markup=kwargs.get("raw_markup", self.raw_markup),
            parallel_tool_calls=bool(kwargs.get("parallel_tool_calls", False)),
            reasoning=self._reasoning(kwargs),
            response_format=kwargs.get("response_format"),  # OpenAI's: json_object (JSON mode) or json_schema
        )

    def _reasoning(self, kwargs: Mapping[str, Any]) -> bool | None:
        # A call's keyword wins when given (not None), as for the generation settings.
        given = kwargs.get("reasoning")
        return self.reasoning if given is None else given  # type: ignore[no-any-return]

    def _completion_plan(
        self, engine: RelayEngine, prompt: str, formatted: bool, kwargs: Mapping[str, Any]
    ) -> GenerationPlan:
        """A validated plan: the chat template with one user message, or - ``formatted`` - the prompt's own ids (a
        formatted prompt is markup already, so its control-token strings are tokens)."""
        settings = self._settings(kwargs)
        if kwargs.get("response_format") is not None:  # refused rather than ignored: the caller expects JSON
            raise SettingsError(
                "complete() takes no response_format: pass it to chat(), or use structured_predict() / "
                "as_structured_llm()",
                "response_format",
            )
        if not isinstance(prompt, str):
            raise MessageError(f"the prompt must be text, got {shown(prompt)}", "prompt")
        if formatted:
            check_text(prompt, "prompt")
            return engine.plan(engine.tokenizer.encode(prompt, add_special_tokens=False), settings)
        message = [{"role": "user", "content": prompt}]
        raw_markup = kwargs.get("raw_markup", self.raw_markup)
        template_kwargs = thinking_template_kwargs(engine, kwargs.get("chat_template_kwargs"), self._reasoning(kwargs))
        return engine.plan(engine.encode_messages(message, None, template_kwargs, raw_markup=raw_markup), settings)

    # -- chat --------------------------------------------------------------------------------------------------
    @llm_chat_callback()
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        request = self._chat_request(messages, kwargs)
        turn = ChatTurn(active_span_id.get(), emit_deltas=False)
        return last_response(r for d in stream_chat(self.engine, request) if (r := turn.on_delta(d)) is not None)

    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        # Not a generator function: the request is validated and the span id captured now, at call time.
        request = self._chat_request(messages, kwargs)
        turn = ChatTurn(active_span_id.get())
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
        turn = ChatTurn(active_span_id.get(), emit_deltas=False)
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
        turn = ChatTurn(active_span_id.get())
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
        turn = CompletionTurn(active_span_id.get(), emit_deltas=False)
        return last_response(r for e in engine.run_plan(plan) if (r := turn.on_event(e)) is not None)

    @llm_completion_callback()
    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseGen:
        engine = self.engine
        plan = self._completion_plan(engine, prompt, formatted, kwargs)
        turn = CompletionTurn(active_span_id.get())

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
        turn = CompletionTurn(active_span_id.get(), emit_deltas=False)
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
        turn = CompletionTurn(active_span_id.get())

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
        # allow_parallel_tool_calls (True in a FunctionAgent) keeps every call the model writes (see
        # _validate_chat_with_tools_response); the grammar lets the model write several only with
        # parallel_tool_calls=True among the call's keywords: allowed them, the demo model wrote further, different
        # calls in 3 of 10 FunctionAgent tasks (benchmarks/data/agent-loops-parallel).
        if tool_choice is None and tool_required:
            tool_choice = "required"  # the chat layer prefills "<tool_call>" so the model can only call a tool
        return {
            "messages": messages,
            "tools": tool_dicts(tools),
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
            arguments = arguments_dict(call.tool_kwargs)
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
    return f"{ref}:{role}" if ref in KNOWN_PAIRS else ref
