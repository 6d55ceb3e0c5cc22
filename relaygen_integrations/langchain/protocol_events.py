"""``stream_events(version="v3")``: langchain-core 1.8's content-block protocol, over the chat model's own stream.

langchain-core bridges any ``_stream`` to the protocol (``_compat_bridge.chunks_to_events``), but the bridge keeps
only the last chunk's value of each ``response_metadata`` key, where merging chunks (``stream()`` and ``+``) adds
them up. The relay's per-chunk metadata is made to be added up: ``relaygen_chunks`` (which model wrote each chunk)
and ``logprobs`` (each chunk's tokens). Bridged as it is, a v3 stream's message would name the model of its last
chunk alone and hold the last chunk's log probabilities. So the chat model provides the native hooks the v3 driver
prefers (``_stream_chat_model_events`` / ``_astream_chat_model_events``): the same bridge over the same chunks, with
the finished message's metadata merged as ``stream()`` merges it, and the model named from the first event on.

What a v3 stream then carries of the relay: ``.text``, ``.reasoning`` and ``.tool_calls`` as the protocol defines
them; on ``.output.response_metadata``, ``relaygen`` (spans with the trigger of every switch, counts) and
``relaygen_chunks`` (one entry per chunk, in order); the ``relaygen_switch`` custom events reach the run's callback
handlers as each switch happens, as in every other entry point.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any, cast

from langchain_core.utils._merge import merge_dicts

# The provider name in LangSmith params (ls_provider), response_metadata["model_provider"] and the v3 stream's
# message-start: one name in all, so middleware that trusts reported token counts only from its tracing provider
# trusts ours.
PROVIDER = "relaygen"

if TYPE_CHECKING:
    from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
    from langchain_core.messages import BaseMessage
    from langchain_core.outputs import ChatGenerationChunk
    from langchain_protocol.protocol import MessagesData  # langchain-core 1.8's dependency, as the hooks are 1.8's


class _MergedMetadata:
    """Watches the chunks on their way to the bridge and merges their ``response_metadata`` as chunk addition does;
    :meth:`fix` puts that merge (and the model's name, from the start) into the bridge's events."""

    def __init__(self, provider: str, model_name: str) -> None:
        self.metadata: dict[str, Any] = {}
        self.start = {"provider": provider, "model": model_name}

    def watch(self, chunk: ChatGenerationChunk) -> ChatGenerationChunk:
        given = {**(chunk.generation_info or {}), **(chunk.message.response_metadata or {})}
        self.metadata = merge_dicts(self.metadata, given)
        return chunk

    def fix(self, event: MessagesData) -> MessagesData:
        fixed: dict[str, Any] = dict(event)
        if fixed["event"] == "message-start":
            # The bridge reads the model from the first chunk's metadata; ours names it on the last chunk only.
            fixed["metadata"] = {**self.start, **(fixed.get("metadata") or {})}
        elif fixed["event"] == "message-finish":
            fixed["metadata"] = self.metadata  # where the bridge puts a message's metadata and the stream reads it
        return cast("MessagesData", fixed)


class ProtocolEvents:
    """The v3 protocol hooks of ``RelayChatModel`` (a mixin: it only calls the model's ``_stream`` / ``_astream``)."""

    def _stream_chat_model_events(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[MessagesData]:
        # Imported here: only langchain-core 1.8 (the first with the v3 protocol) has the bridge, and only 1.8's v3
        # driver calls these hooks; the package supports langchain-core from 1.3.
        from langchain_core.language_models._compat_bridge import chunks_to_events

        merged = _MergedMetadata(PROVIDER, self.model_name)  # type: ignore[attr-defined]
        chunks = self._stream(messages, stop=stop, run_manager=run_manager, **kwargs)  # type: ignore[attr-defined]
        for event in chunks_to_events(merged.watch(chunk) for chunk in chunks):
            yield merged.fix(event)

    async def _astream_chat_model_events(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[MessagesData]:
        from langchain_core.language_models._compat_bridge import achunks_to_events

        merged = _MergedMetadata(PROVIDER, self.model_name)  # type: ignore[attr-defined]
        chunks = self._astream(messages, stop=stop, run_manager=run_manager, **kwargs)  # type: ignore[attr-defined]

        async def watched() -> AsyncIterator[ChatGenerationChunk]:
            async for chunk in chunks:
                yield merged.watch(chunk)

        async for event in achunks_to_events(watched()):
            yield merged.fix(event)
