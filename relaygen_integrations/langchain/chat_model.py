"""LangChain chat model over the relay engine: message conversion, one engine call, metadata mapping.

Modelled on ChatOllama: construction only stores settings; the engine (and its weights) loads on first use and is
shared by every RelayChatModel with the same model settings.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from operator import itemgetter
from typing import Any, Literal

from langchain_core.callbacks import (
    AsyncCallbackManager,
    AsyncCallbackManagerForLLMRun,
    CallbackManager,
    CallbackManagerForLLMRun,
)
from langchain_core.callbacks.manager import ahandle_event, handle_event
from langchain_core.language_models import BaseChatModel, LanguageModelInput, ModelProfile
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
)
from langchain_core.messages.ai import UsageMetadata
from langchain_core.messages.tool import invalid_tool_call, tool_call, tool_call_chunk
from langchain_core.output_parsers import JsonOutputParser, PydanticOutputParser
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable, RunnableConfig, RunnableMap, RunnablePassthrough, ensure_config
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_json_schema, convert_to_openai_tool
from langchain_core.utils.uuid import uuid7
from pydantic import BaseModel, ConfigDict

from ..chat.model_fields import RelayModelFields
from ..chat.profile import pair_profile
from ..chat.relay_chat import ChatDelta, ChatRequest, astream_chat, prepare_chat, stream_chat
from ..chat.tool_calls import InvalidToolCall, ParsedOutput, ToolCall, check_tool_choice, validate_tools
from ..engine.core.settings import merge_settings
from ..engine.core.spans import RelayResult, SwitchEvent
from ..engine.engine import RelayEngine
from .messages import convert_messages
from .protocol_events import PROVIDER, ProtocolEvents

SWITCH_EVENT = "relaygen_switch"
_RUN_KWARG = "relaygen_run_id"
# BaseChatModel.stream/astream do not hand their run manager to _stream/_astream, so those two entry points register
# the run's config under a run id chosen up front; _stream finds it here to fire switch events under that run.
_STREAM_RUNS: dict[str, RunnableConfig] = {}


class RelayChatModel(RelayModelFields, ProtocolEvents, BaseChatModel):  # ProtocolEvents: stream_events v3
    """A chat model where a large model reasons and a small model finishes easy sentences (RelayGen).

    Every streamed chunk says which model wrote it in ``response_metadata["relaygen_chunks"]`` (a list, so chunks
    merge cleanly); the final message carries ``response_metadata["relaygen"]`` (spans, large/small tokens,
    switches) and ``usage_metadata``. A ``relaygen_switch`` custom event fires at each switch.

    Example:
        .. code-block:: python

            from relaygen_integrations.langchain import RelayChatModel

            llm = RelayChatModel(large="demo", small="demo", max_tokens=256)
            msg = llm.invoke("What is 17 * 23? Think step by step.")
            print(msg.content, msg.response_metadata["relaygen"]["small_share"])
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, populate_by_name=True)

    chat_template_kwargs: dict[str, Any] | None = None
    streaming: bool = False
    """Whether ``invoke`` streams internally (so callbacks see tokens)."""

    def __init__(self, engine: RelayEngine | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._engine = engine
        if engine is not None and "profile" not in kwargs:
            self.profile = self._resolve_model_profile()  # the validator ran before the engine was set

    # -- identity -----------------------------------------------------------------------------------------------
    @property
    def _llm_type(self) -> str:
        return "relaygen"

    @property
    def model_name(self) -> str:
        engine = self._engine
        large, small = (engine.large_name, engine.small_name) if engine is not None else (self.large, self.small)
        return f"{self.writing_mode()}({large}+{small})"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {
            "model_name": self.model_name, "cues": self.cues, "mode": self.mode, "speculative": self.speculative,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens, "top_p": self.top_p, "top_k": self.top_k, "dtype": self.dtype,
        }  # fmt: skip

    def _resolve_model_profile(self) -> ModelProfile | None:
        """The pair's profile (context window, tools, structured output, reasoning) from the handed engine or the
        large model's config files: no weights are loaded for it (``chat/profile.py``)."""
        return pair_profile(self)  # type: ignore[return-value]

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> Any:
        params = super()._get_ls_params(stop=stop, **kwargs)
        params["ls_provider"] = PROVIDER
        params["ls_model_name"] = kwargs.get("model", self.model_name)
        params["ls_model_type"] = "chat"
        params["ls_temperature"] = kwargs.get("temperature", self.temperature)
        params["ls_max_tokens"] = kwargs.get("max_tokens", self.max_tokens)
        return params

    @property
    def engine(self) -> RelayEngine:
        """The engine given to the constructor, or the shared one for this pair, loaded on first use."""
        return self.load_engine()

    # -- tools --------------------------------------------------------------------------------------------------
    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable | BaseTool],
        *,
        tool_choice: dict | str | bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Renders the tools through the chat template; a forced ``tool_choice`` ("any"/"required"/a name) is
        enforced by prefilling the tool-call opening."""
        formatted = validate_tools([convert_to_openai_tool(tool) for tool in tools])
        check_tool_choice(tool_choice, formatted)  # fail at bind time: a name that is not bound, forcing with no tools
        return super().bind(tools=formatted, tool_choice=tool_choice, **kwargs)

    def with_structured_output(
        self,
        schema: dict | type,
        *,
        method: Literal["function_calling", "json_schema", "json_mode"] = "function_calling",
        include_raw: bool = False,
        strict: bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, dict | BaseModel]:
        """``function_calling`` forces a tool call with the schema; ``json_schema``/``json_mode`` put the schema (or
        just "JSON") in the system prompt and prefill ``{`` so the answer is a bare JSON object."""
        if method == "function_calling":
            return super().with_structured_output(schema, include_raw=include_raw, **kwargs)
        if kwargs:
            raise ValueError(f"Received unsupported arguments {kwargs}")
        is_model = isinstance(schema, type) and issubclass(schema, BaseModel)
        if method == "json_schema":
            response_format = {"type": "json_schema", "schema": convert_to_json_schema(schema)}
        elif method == "json_mode":
            response_format = {"type": "json_object"}
        else:
            raise ValueError(f"unknown structured output method {method!r}")
        llm = self.bind(
            response_format=response_format,
            ls_structured_output_format={"kwargs": {"method": method}, "schema": schema},
        )
        parser: Runnable = PydanticOutputParser(pydantic_object=schema) if is_model else JsonOutputParser()  # type: ignore[arg-type]
        if not include_raw:
            return llm | parser
        parse = RunnablePassthrough.assign(parsed=itemgetter("raw") | parser, parsing_error=lambda _: None)
        fallback = RunnablePassthrough.assign(parsed=lambda _: None)
        return RunnableMap(raw=llm) | parse.with_fallbacks([fallback], exception_key="parsing_error")

    # -- request building ---------------------------------------------------------------------------------------
    def _request(self, messages: list[BaseMessage], stop: list[str] | None, kwargs: dict[str, Any]) -> ChatRequest:
        kwargs = dict(kwargs)
        tools = kwargs.pop("tools", None)
        tool_choice = kwargs.pop("tool_choice", None)
        template_kwargs = kwargs.pop("chat_template_kwargs", self.chat_template_kwargs)
        response_format = kwargs.pop("response_format", None)
        raw_markup = kwargs.pop("raw_markup", self.raw_markup)
        parallel = kwargs.pop("parallel_tool_calls", False)  # bind_tools(..., parallel_tool_calls=True), as ChatOpenAI
        reasoning = kwargs.pop("reasoning", self.reasoning)  # per call too, as ChatOllama's
        kwargs.pop("ls_structured_output_format", None)
        kwargs.pop(_RUN_KWARG, None)
        # LangChain adds a call's stop sequences to the model's own; a string is one stop sequence.
        stops = [*(self.stop or []), *_stop_list(stop), *_stop_list(kwargs.pop("stop", None))]
        settings = merge_settings(self.settings_layer(), kwargs, {"stop": stops})
        return prepare_chat(
            convert_messages(messages), settings, tools, tool_choice, template_kwargs, response_format, raw_markup,
            parallel, reasoning,
        )  # fmt: skip

    # -- LangChain entry points ---------------------------------------------------------------------------------
    def stream(
        self, input: LanguageModelInput, config: RunnableConfig | None = None, *, stop: list[str] | None = None,
        **kwargs: Any,
    ) -> Iterator[AIMessageChunk]:  # fmt: skip
        config, token = _register_run(config)
        try:
            yield from super().stream(input, config, stop=stop, **{_RUN_KWARG: token}, **kwargs)
        finally:
            _STREAM_RUNS.pop(token, None)

    async def astream(
        self, input: LanguageModelInput, config: RunnableConfig | None = None, *, stop: list[str] | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[AIMessageChunk]:  # fmt: skip
        config, token = _register_run(config)
        try:
            async for chunk in super().astream(input, config, stop=stop, **{_RUN_KWARG: token}, **kwargs):
                yield chunk
        finally:
            _STREAM_RUNS.pop(token, None)

    def _stream_run_manager(self, kwargs: dict[str, Any], is_async: bool = False) -> Any:
        """Rebuilds the run manager of a stream()/astream() call from the config registered under its run id."""
        token = kwargs.pop(_RUN_KWARG, None)
        config = _STREAM_RUNS.get(token) if token else None
        if config is None:
            return None
        manager_cls, run_cls = (
            (AsyncCallbackManager, AsyncCallbackManagerForLLMRun)
            if is_async
            else (CallbackManager, CallbackManagerForLLMRun)
        )
        manager = manager_cls.configure(
            config.get("callbacks"), self.callbacks, self.verbose, config.get("tags"), self.tags,
            config.get("metadata"), self.metadata,
        )  # fmt: skip
        return run_cls(
            run_id=config["run_id"], handlers=manager.handlers, inheritable_handlers=manager.inheritable_handlers,
            parent_run_id=manager.parent_run_id, tags=manager.tags, metadata=manager.metadata,
        )  # fmt: skip

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        request = self._request(messages, stop, kwargs)
        if self.streaming:
            return _aggregate(self._chunks(stream_chat(self.engine, request), run_manager))
        for delta in stream_chat(self.engine, request):
            if delta.switch is not None:
                _emit_switch(run_manager, delta.switch)
            if delta.result is not None:
                return _chat_result(delta, self.model_name)
        raise RuntimeError("the engine ended without a result")

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        # From stream(): no run manager is passed, and BaseChatModel reports each chunk itself; only switch events
        # need the rebuilt one.
        events_manager = run_manager or self._stream_run_manager(kwargs)
        request = self._request(messages, stop, kwargs)
        yield from self._chunks(
            stream_chat(self.engine, request), events_manager, report_tokens=run_manager is not None
        )

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        request = self._request(messages, stop, kwargs)
        if self.streaming:
            return _aggregate([chunk async for chunk in self._achunks(astream_chat(self.engine, request), run_manager)])
        async for delta in astream_chat(self.engine, request):
            if delta.switch is not None:
                await _aemit_switch(run_manager, delta.switch)
            if delta.result is not None:
                return _chat_result(delta, self.model_name)
        raise RuntimeError("the engine ended without a result")

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        events_manager = run_manager or self._stream_run_manager(kwargs, is_async=True)
        request = self._request(messages, stop, kwargs)
        chunks = self._achunks(
            astream_chat(self.engine, request), events_manager, report_tokens=run_manager is not None
        )
        async for chunk in chunks:
            yield chunk

    # -- delta -> chunk -----------------------------------------------------------------------------------------
    def _chunks(
        self, deltas: Iterator[ChatDelta], run_manager: CallbackManagerForLLMRun | None, report_tokens: bool = True
    ) -> Iterator[ChatGenerationChunk]:
        calls = 0
        for delta in deltas:
            if delta.switch is not None:
                _emit_switch(run_manager, delta.switch)
                continue
            chunk = _chunk(delta, calls, self.model_name)
            calls += delta.tool_call is not None
            if report_tokens and run_manager is not None and delta.result is None:
                run_manager.on_llm_new_token(delta.text, chunk=chunk)
            yield chunk

    async def _achunks(
        self,
        deltas: AsyncIterator[ChatDelta],
        run_manager: AsyncCallbackManagerForLLMRun | None,
        report_tokens: bool = True,
    ) -> AsyncIterator[ChatGenerationChunk]:
        calls = 0
        async for delta in deltas:
            if delta.switch is not None:
                await _aemit_switch(run_manager, delta.switch)
                continue
            chunk = _chunk(delta, calls, self.model_name)
            calls += delta.tool_call is not None
            if report_tokens and run_manager is not None and delta.result is None:
                await run_manager.on_llm_new_token(delta.text, chunk=chunk)
            yield chunk


def _stop_list(stop: str | Sequence[str] | None) -> list[str]:
    """Stop sequences as the engine reads them: a string is one, None none; anything else is checked there (a
    ``SettingsError`` naming ``stop``), before LangChain's layers are added up."""
    return list(merge_settings({"stop": stop}).stop)


# -- metadata mapping ------------------------------------------------------------------------------------------------
def _usage(result: RelayResult, parsed: ParsedOutput | None) -> UsageMetadata:
    """The engine's exact counts; prompt tokens read from the reused cache as ``cache_read``, and the reasoning's
    tokens (the marker and the blank lines after it included) as ``reasoning`` when it was told apart."""
    usage = result.usage
    details = UsageMetadata(
        input_tokens=usage.prompt_tokens,
        output_tokens=usage.completion_tokens,
        total_tokens=usage.total_tokens,
        input_token_details={"cache_read": usage.reused_prefix_tokens},
    )
    if parsed is not None and parsed.reasoning is not None:
        details["output_token_details"] = {"reasoning": parsed.reasoning_tokens}
    return details


def _response_metadata(delta: ChatDelta, model_name: str, streamed: bool = False) -> dict[str, Any]:
    """The final message's metadata. ``logprobs`` (asked for): ChatOpenAI's ``{"content": [...]}``, each entry
    naming the model that wrote the token; a stream's chunks carry them piece by piece instead (``streamed``), so
    that the merged message holds each once."""
    result = delta.result
    assert result is not None and delta.parsed is not None
    finish = "tool_calls" if delta.parsed.tool_calls else result.finish_reason
    metadata = {
        "model_name": model_name,
        "model_provider": PROVIDER,
        "finish_reason": finish,
        "relaygen": result.relay_metadata(),
    }
    if result.logprobs is not None and not streamed:
        metadata["logprobs"] = {"content": [entry.to_openai() for entry in result.logprobs]}
    return metadata


def _chat_result(delta: ChatDelta, model_name: str) -> ChatResult:
    parsed = delta.parsed
    assert parsed is not None and delta.result is not None
    message = AIMessage(
        content=parsed.content,
        additional_kwargs={"reasoning_content": parsed.reasoning} if parsed.reasoning else {},
        tool_calls=[tool_call(name=c.name, args=c.arguments, id=c.id) for c in parsed.tool_calls],
        invalid_tool_calls=[
            invalid_tool_call(name=c.name, args=c.raw, id=c.id, error=c.error) for c in parsed.invalid_tool_calls
        ],
        usage_metadata=_usage(delta.result, parsed),
        response_metadata=_response_metadata(delta, model_name),
    )
    return ChatResult(generations=[ChatGeneration(message=message)])


def _chunk(delta: ChatDelta, call_index: int, model_name: str) -> ChatGenerationChunk:
    if delta.result is not None:
        message = AIMessageChunk(
            content="",
            usage_metadata=_usage(delta.result, delta.parsed),
            response_metadata=_response_metadata(delta, model_name, streamed=True),
            chunk_position="last",
        )
        return ChatGenerationChunk(message=message)
    per_chunk: dict[str, Any] = {"relaygen_chunks": [{"model": delta.model, "span_index": delta.span_index}]}
    if delta.logprobs:  # merged chunk by chunk into the message's {"content": [...]}, as ChatOpenAI's stream does
        per_chunk["logprobs"] = {"content": [entry.to_openai() for entry in delta.logprobs]}
    call = delta.tool_call
    if delta.reasoning:  # merged into additional_kwargs["reasoning_content"]: content_blocks' reasoning block
        reasoning = {"reasoning_content": delta.reasoning}
        return ChatGenerationChunk(
            message=AIMessageChunk(content="", additional_kwargs=reasoning, response_metadata=per_chunk)
        )
    if call is None:
        return ChatGenerationChunk(message=AIMessageChunk(content=delta.text, response_metadata=per_chunk))
    if isinstance(call, ToolCall):
        piece = tool_call_chunk(name=call.name, args=json.dumps(call.arguments), id=call.id, index=call_index)
    else:
        assert isinstance(call, InvalidToolCall)
        piece = tool_call_chunk(name=call.name, args=call.raw, id=call.id, index=call_index)
    return ChatGenerationChunk(
        message=AIMessageChunk(content="", tool_call_chunks=[piece], response_metadata=per_chunk)
    )


def _aggregate(chunks: Iterator[ChatGenerationChunk] | list[ChatGenerationChunk]) -> ChatResult:
    total: ChatGenerationChunk | None = None
    for chunk in chunks:
        total = chunk if total is None else total + chunk
    if total is None:
        raise RuntimeError("the engine produced no output")
    message = total.message
    return ChatResult(
        generations=[
            ChatGeneration(
                message=AIMessage(
                    content=message.content,
                    additional_kwargs=message.additional_kwargs,
                    tool_calls=message.tool_calls,
                    invalid_tool_calls=message.invalid_tool_calls,
                    usage_metadata=message.usage_metadata,
                    response_metadata=message.response_metadata,
                )
            )
        ]
    )


# -- switch events ---------------------------------------------------------------------------------------------------
def _register_run(config: RunnableConfig | None) -> tuple[RunnableConfig, str]:
    config = ensure_config(config)
    config = {**config, "run_id": config.get("run_id") or uuid7()}  # type: ignore[assignment]
    token = str(config["run_id"])
    _STREAM_RUNS[token] = config
    return config, token


def _switch_data(switch: SwitchEvent) -> dict[str, Any]:
    return {
        "from": switch.from_model, "to": switch.to_model, "trigger": switch.trigger,
        "char_offset": switch.char_offset, "span_index": switch.span_index,
    }  # fmt: skip


def _emit_switch(run_manager: CallbackManagerForLLMRun | None, switch: SwitchEvent) -> None:
    """Custom event under the chat model's own run (its handlers and run_id), so it also reaches handlers and
    ``astream_events`` when the model is invoked on its own, outside any chain."""
    if run_manager is None or not run_manager.handlers:
        return
    handle_event(
        run_manager.handlers, "on_custom_event", "ignore_custom_event", SWITCH_EVENT, _switch_data(switch),
        run_id=run_manager.run_id, tags=run_manager.tags, metadata=run_manager.metadata,
    )  # fmt: skip


async def _aemit_switch(run_manager: AsyncCallbackManagerForLLMRun | None, switch: SwitchEvent) -> None:
    if run_manager is None or not run_manager.handlers:
        return
    await ahandle_event(
        run_manager.handlers, "on_custom_event", "ignore_custom_event", SWITCH_EVENT, _switch_data(switch),
        run_id=run_manager.run_id, tags=run_manager.tags, metadata=run_manager.metadata,
    )  # fmt: skip
