"""Tools together with a response format on the real demo pair, under the one grammar (a call or the schema's JSON):
20 tool turns and 20 schema turns, each valid, bound exactly as ``create_agent(model, tools, response_format=...)``
binds them (the provider strategy), plus one whole ``create_agent`` run.

A tool turn is a user's question with the four tools of ``benchmarks/agent_loops.py`` bound: it must be one call of a
bound tool with arguments its schema takes (whether the tool and arguments are the right ones is printed on failure,
not asserted). A schema turn is the same question after the right call and its result: it must be the answer,
an object the schema validates. The 40 turns are greedy and independent (a schema turn does not depend on what the
tool turn wrote)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from pydantic import BaseModel, Field

from relaygen_integrations import RelayEngine
from relaygen_integrations.langchain import RelayChatModel
from relaygen_integrations.registry import pair_paths

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from agent_loops import TASKS, TOOLS, Task

pytestmark = pytest.mark.real_pair


class Reply(BaseModel):
    """The final answer of every task: each has a number for an answer (a sum, a product, a temperature)."""

    answer: str = Field(max_length=100, description="the answer to the user's question, in one short sentence")
    number: int = Field(description="the number that answers the question")


# Ten more tasks of the same kinds as benchmarks/agent_loops.py's ten (its weather tool knows Paris and Tokyo).
TWENTY = [
    *TASKS,
    Task("What is 64 plus 29?", "add", {"a": 64, "b": 29}, "93"),
    Task("Multiply 15 by 12 with the tool.", "multiply", {"a": 15, "b": 12}, "180"),
    Task("What is 500 minus 123?", "subtract", {"a": 500, "b": 123}, "377"),
    Task("How is the weather in Tokyo today?", "get_weather", {"city": "Tokyo"}, "24"),
    Task("A shelf has 8 rows of 14 books. How many books are there?", "multiply", {"a": 8, "b": 14}, "112"),
    Task("I walked 320 meters and then 275 more. How far did I walk?", "add", {"a": 320, "b": 275}, "595"),
    Task("Is it sunny in Paris at the moment?", "get_weather", {"city": "Paris"}, "18"),
    Task("There were 72 birds and 19 flew away. How many are left?", "subtract", {"a": 72, "b": 19}, "53"),
    Task("Compute 47 times 3.", "multiply", {"a": 47, "b": 3}, "141"),
    Task("Add 2024 and 76.", "add", {"a": 2024, "b": 76}, "2100"),
]
LC_TOOLS = {fn.__name__: tool(fn) for fn in TOOLS}


@pytest.fixture(scope="module")
def engine() -> RelayEngine:
    if pair_paths("demo") is None:
        pytest.fail("the demo pair is not cached: run `relaygen models fetch demo` (make test does this first)")
    return RelayEngine.shared()  # what RelayChatModel() runs: the pair's shipped default


@pytest.fixture(scope="module")
def bound(engine: RelayEngine) -> Any:
    from langchain.agents.structured_output import ProviderStrategy

    # The binding create_agent makes with the provider strategy: the tools, and the schema as a response format.
    response_format = ProviderStrategy(Reply).to_model_kwargs()["response_format"]
    model = RelayChatModel(engine=engine, max_tokens=96)
    return model.bind_tools(list(LC_TOOLS.values()), response_format=response_format)


def after_the_call(task: Task) -> list[Any]:
    """The task's question, the right call and its result: the history of the turn that answers."""
    result = LC_TOOLS[task.tool].invoke(task.arguments)
    call = {"name": task.tool, "args": task.arguments, "id": "call_1"}
    return [
        HumanMessage(task.prompt),
        AIMessage("", tool_calls=[call]),
        ToolMessage(str(result), tool_call_id="call_1"),
    ]


def test_every_tool_turn_is_a_valid_call(bound):
    invalid, right = [], 0
    for task in TWENTY:
        message = bound.invoke([HumanMessage(task.prompt)])
        calls = message.tool_calls
        valid = len(calls) == 1 and not message.invalid_tool_calls and not message.text
        if valid:
            LC_TOOLS[calls[0]["name"]].args_schema.model_validate(calls[0]["args"])  # type: ignore[union-attr]
            right += task.right_call(calls[0]["name"], calls[0]["args"])
        else:
            invalid.append((task.prompt, message.text[:80], calls, message.invalid_tool_calls))
    assert not invalid, f"{len(invalid)} of 20 tool turns were no valid call ({right} right calls): {invalid}"


def test_every_schema_turn_is_a_valid_answer(bound):
    invalid, right = [], 0
    for task in TWENTY:
        message = bound.invoke(after_the_call(task))
        try:
            assert not message.tool_calls and not message.invalid_tool_calls
            reply = Reply.model_validate_json(message.text)
        except (AssertionError, ValueError) as exc:
            invalid.append((task.prompt, message.text[:120], message.tool_calls, type(exc).__name__))
            continue
        right += str(reply.number) == task.answer
    assert not invalid, f"{len(invalid)} of 20 schema turns were no valid answer ({right} right numbers): {invalid}"


def test_create_agent_calls_the_tool_and_answers_with_the_schema(engine):
    from langchain.agents import create_agent

    calls: list[str] = []

    @tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        calls.append(city)
        return "18 degrees Celsius and cloudy"

    agent = create_agent(RelayChatModel(engine=engine, max_tokens=96), tools=[get_weather], response_format=Reply)
    state = agent.invoke({"messages": [HumanMessage("What's the weather like in Paris right now?")]})
    assert [city.strip().lower() for city in calls] == ["paris"], calls
    reply = state["structured_response"]
    assert isinstance(reply, Reply) and reply.number == 18, reply
