"""LlamaIndex structured output under the chat layer's JSON grammar.

LlamaIndex's default for a function-calling LLM is a forced call of a tool built from the output class
(``FunctionCallingProgram``). ``RelayLLM`` answers ``structured_predict`` - and its async and streamed forms, and so
``as_structured_llm`` - with the class's JSON schema as the chat's ``response_format`` instead, as LlamaIndex's Ollama
LLM passes its ``format``: the answer is one object under the schema's grammar (``chat/constraints.py``), the same
grammar as LangChain's ``method="json_schema"`` and the server's ``response_format``, with no tool markup around it.
Any other ``pydantic_program_mode`` (``FUNCTION`` for the forced call) keeps LlamaIndex's own program.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Generator
from typing import TYPE_CHECKING, Any

from llama_index.core.base.llms.types import ChatMessage, ChatResponse
from llama_index.core.instrumentation.events.llm import (
    LLMStructuredPredictEndEvent,
    LLMStructuredPredictInProgressEvent,
    LLMStructuredPredictStartEvent,
)
from llama_index.core.program.utils import FlexibleModel, process_streaming_objects
from llama_index.core.prompts import BasePromptTemplate
from llama_index.core.types import Model, PydanticProgramMode

from .events import dispatcher

if TYPE_CHECKING:
    from llama_index.core.llms.function_calling import FunctionCallingLLM

    _Base = FunctionCallingLLM
else:
    _Base = object


def schema_format(output_cls: type[Model]) -> dict[str, Any]:
    """The OpenAI-style ``response_format`` of ``output_cls``'s JSON schema."""
    schema = output_cls.model_json_schema()
    return {"type": "json_schema", "json_schema": {"name": output_cls.__name__, "schema": schema}}


class _Partials:
    """The partial objects of a streamed JSON answer (LlamaIndex's flexible models), then the validated whole."""

    def __init__(self, llm: FunctionCallingLLM, output_cls: type[Model]) -> None:
        self.llm, self.output_cls = llm, output_cls
        self.current: list[Any] | None = None
        self.content = ""

    def on(self, response: ChatResponse) -> Model | FlexibleModel:
        self.content = response.message.content or ""
        partial = process_streaming_objects(response, self.output_cls, cur_objects=self.current, llm=self.llm)
        self.current = [partial]
        dispatcher.event(LLMStructuredPredictInProgressEvent(output=partial))
        return partial

    def whole(self) -> Model:
        result = self.output_cls.model_validate_json(self.content)
        dispatcher.event(LLMStructuredPredictEndEvent(output=result))
        return result


class JsonStructuredOutput(_Base):
    """``structured_predict`` and its forms through a JSON-schema ``response_format`` (mixed into ``RelayLLM``)."""

    def _json_turn(
        self, output_cls: type[Model], prompt: BasePromptTemplate, llm_kwargs: dict[str, Any] | None, args: Any
    ) -> tuple[list[ChatMessage], dict[str, Any]]:
        """The chat and the call's keywords, as LlamaIndex's programs format them (the LLM's system prompt too);
        announced as LlamaIndex's own ``structured_predict`` announces it."""
        dispatcher.event(LLMStructuredPredictStartEvent(output_cls=output_cls, template=prompt, template_args=args))
        messages = self._extend_messages(prompt.format_messages(llm=self, **args))
        return messages, {**(llm_kwargs or {}), "response_format": schema_format(output_cls)}

    def _own_program(self) -> bool:
        return self.pydantic_program_mode != PydanticProgramMode.DEFAULT

    @dispatcher.span
    def structured_predict(
        self, output_cls: type[Model], prompt: BasePromptTemplate, llm_kwargs: dict[str, Any] | None = None,
        **prompt_args: Any,
    ) -> Model:  # fmt: skip
        if self._own_program():
            return super().structured_predict(output_cls, prompt, llm_kwargs, **prompt_args)
        messages, kwargs = self._json_turn(output_cls, prompt, llm_kwargs, prompt_args)
        result = output_cls.model_validate_json(self.chat(messages, **kwargs).message.content or "")
        dispatcher.event(LLMStructuredPredictEndEvent(output=result))
        return result

    @dispatcher.span
    async def astructured_predict(
        self, output_cls: type[Model], prompt: BasePromptTemplate, llm_kwargs: dict[str, Any] | None = None,
        **prompt_args: Any,
    ) -> Model:  # fmt: skip
        if self._own_program():
            return await super().astructured_predict(output_cls, prompt, llm_kwargs, **prompt_args)
        messages, kwargs = self._json_turn(output_cls, prompt, llm_kwargs, prompt_args)
        response = await self.achat(messages, **kwargs)
        result = output_cls.model_validate_json(response.message.content or "")
        dispatcher.event(LLMStructuredPredictEndEvent(output=result))
        return result

    @dispatcher.span
    def stream_structured_predict(
        self, output_cls: type[Model], prompt: BasePromptTemplate, llm_kwargs: dict[str, Any] | None = None,
        **prompt_args: Any,
    ) -> Generator[Model | FlexibleModel, None, None]:  # fmt: skip
        """Partial objects as the JSON streams (LlamaIndex's flexible models), then the validated whole."""
        if self._own_program():
            yield from super().stream_structured_predict(output_cls, prompt, llm_kwargs, **prompt_args)
            return
        messages, kwargs = self._json_turn(output_cls, prompt, llm_kwargs, prompt_args)
        partials = _Partials(self, output_cls)
        for response in self.stream_chat(messages, **kwargs):
            yield partials.on(response)
        yield partials.whole()

    @dispatcher.span
    async def astream_structured_predict(
        self, output_cls: type[Model], prompt: BasePromptTemplate, llm_kwargs: dict[str, Any] | None = None,
        **prompt_args: Any,
    ) -> AsyncGenerator[Model | FlexibleModel, None]:  # fmt: skip
        if self._own_program():
            return await super().astream_structured_predict(output_cls, prompt, llm_kwargs, **prompt_args)
        messages, kwargs = self._json_turn(output_cls, prompt, llm_kwargs, prompt_args)
        responses = await self.astream_chat(messages, **kwargs)

        async def gen() -> AsyncGenerator[Model | FlexibleModel, None]:
            partials = _Partials(self, output_cls)
            async for response in responses:
                yield partials.on(response)
            yield partials.whole()

        return gen()
