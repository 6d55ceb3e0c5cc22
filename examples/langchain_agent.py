"""A LangChain agent (``langchain.agents.create_agent``) on the relay pair, calling a Python tool.

    .venv/bin/python examples/langchain_agent.py ["What is 1234 times 5678?"]

The agent must call ``multiply`` until a tool result is in the history (a middleware sets ``tool_choice="any"``):
the demo pair's 1.5B coder model tends to answer an optional tool call as a ```json block instead of a
``<tool_call>``. Each model answer prints with which models wrote it.
"""

from __future__ import annotations

import sys
from typing import Any

from langchain.agents import create_agent
from langchain.agents.middleware import wrap_model_call
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool

from relaygen_integrations.langchain import RelayChatModel


@tool
def multiply(a: int, b: int) -> int:
    """Multiply two integers and return the product."""
    return a * b


@wrap_model_call
def tool_first(request: Any, handler: Any) -> Any:
    if not any(isinstance(m, ToolMessage) for m in request.messages):
        request = request.override(tool_choice="any")
    return handler(request)


def main() -> None:
    question = sys.argv[1] if len(sys.argv) > 1 else "What is 1234 times 5678?"
    llm = RelayChatModel(large="demo", small="demo", max_tokens=64, temperature=0.0)
    agent = create_agent(
        llm,
        tools=[multiply],
        system_prompt="You are a calculator assistant. Use the multiply tool for products, then state its result.",
        middleware=[tool_first],
    )
    state = agent.invoke({"messages": [HumanMessage(question)]})
    for message in state["messages"]:
        if isinstance(message, AIMessage):
            relay = message.response_metadata["relaygen"]
            who = f"large {relay['large_tokens']} tok, small {relay['small_tokens']} tok"
            if message.tool_calls:
                for call in message.tool_calls:
                    print(f"[model → tool call] {call['name']}({call['args']})   ({who})")
            else:
                print(f"[model] {message.text}   ({who})")
        elif isinstance(message, ToolMessage):
            print(f"[tool {message.name}] {message.content}")
        else:
            print(f"[{message.type}] {message.text}")


if __name__ == "__main__":
    main()
