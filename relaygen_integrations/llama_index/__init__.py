"""LlamaIndex adapter: ``RelayLLM`` (alias ``RelayChatModel``), a FunctionCallingLLM over a RelayEngine, and the
``RelaySwitchEvent`` it dispatches through LlamaIndex instrumentation at every change of writer."""

from .llm import RelayChatModel, RelayLLM, RelaySwitchEvent, to_relay_messages

__all__ = ["RelayChatModel", "RelayLLM", "RelaySwitchEvent", "to_relay_messages"]
