"""A LlamaIndex FunctionAgent on the relay pair, calling a Python tool.

    .venv/bin/python examples/llama_index_agent.py ["What is 1234 times 5678?"]

The demo pair's 1.5B coder model knows the ``{"name", "arguments"}`` shape of a call but, left to itself, writes it as
a ```json block instead of inside ``<tool_call>`` tags. So the system prompt spells the format out and
``initial_tool_choice`` prefills the tool's name on the first turn; after the tool result the model answers freely.
Every model turn prints with which models wrote it; switches print as they happen (RelaySwitchEvent).
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from llama_index.core.agent.workflow import AgentOutput, FunctionAgent, ToolCallResult
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events import BaseEvent
from llama_index.core.tools import FunctionTool

from relaygen_integrations.llama_index import RelayLLM, RelaySwitchEvent

SYSTEM_PROMPT = (
    "You are a calculator. For every multiplication, call the multiply tool by replying with exactly:\n"
    '<tool_call>\n{"name": "multiply", "arguments": {"a": <first number>, "b": <second number>}}\n</tool_call>\n'
    "After the tool result arrives, answer with that number."
)


def multiply(a: int, b: int) -> int:
    """Multiply two integers and return the product."""
    return a * b


class SwitchPrinter(BaseEventHandler):
    @classmethod
    def class_name(cls) -> str:
        return "SwitchPrinter"

    def handle(self, event: BaseEvent, **kwargs: Any) -> None:
        if isinstance(event, RelaySwitchEvent):
            print(f"  [switch {event.from_model} → {event.to_model} at char {event.char_offset}: {event.trigger}]")


async def main() -> None:
    question = sys.argv[1] if len(sys.argv) > 1 else "What is 1234 times 5678?"
    get_dispatcher().add_event_handler(SwitchPrinter())
    llm = RelayLLM(large="demo", small="demo", max_tokens=64, temperature=0.0)
    agent = FunctionAgent(
        tools=[FunctionTool.from_defaults(fn=multiply)],
        llm=llm,
        system_prompt=SYSTEM_PROMPT,
        initial_tool_choice="multiply",
    )
    print(f"[user] {question}")
    handler = agent.run(question)
    async for event in handler.stream_events():
        if isinstance(event, AgentOutput):
            relay = (event.raw or {}).get("usage", {})
            who = f"large {relay.get('large_tokens')} tok, small {relay.get('small_tokens')} tok"
            for call in event.tool_calls:
                print(f"[model → tool call] {call.tool_name}({call.tool_kwargs})   ({who})")
            if not event.tool_calls:
                print(f"[model] {event.response.content}   ({who})")
        elif isinstance(event, ToolCallResult):
            print(f"[tool {event.tool_name}] {event.tool_output.content}")
    print(f"[answer] {await handler}")


if __name__ == "__main__":
    asyncio.run(main())
