"""Agent tool loops on the demo pair, constrained and not: a hand-built LangGraph loop (``StateGraph`` + ``ToolNode``
+ ``tools_condition``) and a LlamaIndex ``FunctionAgent``, each over ten everyday tasks with no special prompting.

A task passes when the agent makes one tool call, the right tool with the right arguments, the loop ends on its own
(no recursion limit, no iteration limit), and the final answer is prose holding the expected value (no call or
template markup echoed as the answer).

    python benchmarks/agent_loops.py --out benchmarks/data/agent-loops [--resume] [--frameworks langgraph,llamaindex]
    python benchmarks/agent_loops.py --out benchmarks/data/agent-loops-no-instruction --without-result-instruction

Writes ``results.ndjson`` (one line per framework x constrain x task, appended as each finishes: ``--resume`` skips
those done) and ``summary.json`` (passes per framework and setting, seconds, the machine). ``tests/test_agent_loops.py``
runs the constrained loops of both frameworks as real-pair tests with the same tasks.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

WEATHER = {"Paris": "18 degrees Celsius and cloudy", "Tokyo": "24 degrees Celsius and sunny"}


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


def subtract(a: int, b: int) -> int:
    """Subtract b from a."""
    return a - b


def get_weather(city: str) -> str:
    """The current weather in a city."""
    return WEATHER.get(city.strip().title(), "no weather report for that city")


TOOLS: list[Callable[..., Any]] = [add, multiply, subtract, get_weather]
COMMUTATIVE = {"add", "multiply"}


@dataclass(frozen=True)
class Task:
    prompt: str
    tool: str
    arguments: dict[str, Any]
    answer: str  # what the final answer must contain

    def right_call(self, name: str | None, arguments: dict[str, Any] | None) -> bool:
        if name != self.tool or not isinstance(arguments, dict):
            return False
        if name in COMMUTATIVE:
            return sorted(map(str, arguments.values())) == sorted(map(str, self.arguments.values())) and set(
                arguments
            ) == set(self.arguments)
        return {k: str(v).strip().lower() for k, v in arguments.items()} == {
            k: str(v).strip().lower() for k, v in self.arguments.items()
        }


TASKS = [
    Task("What is 17 plus 25?", "add", {"a": 17, "b": 25}, "42"),
    Task("Use a tool to multiply 13 by 7.", "multiply", {"a": 13, "b": 7}, "91"),
    Task("How much is 250 minus 75?", "subtract", {"a": 250, "b": 75}, "175"),
    Task("What's the weather like in Paris right now?", "get_weather", {"city": "Paris"}, "18"),
    Task("I had 48 apples and bought 36 more. How many apples do I have now?", "add", {"a": 48, "b": 36}, "84"),
    Task("A box holds 12 eggs. How many eggs are in 9 boxes?", "multiply", {"a": 12, "b": 9}, "108"),
    Task("Tell me the current weather in Tokyo.", "get_weather", {"city": "Tokyo"}, "24"),
    Task("Compute 1234 + 4321.", "add", {"a": 1234, "b": 4321}, "5555"),
    Task("A train ticket costs 35 dollars. What do 6 tickets cost?", "multiply", {"a": 35, "b": 6}, "210"),
    Task("My account had 900 dollars and I spent 345. What is left?", "subtract", {"a": 900, "b": 345}, "555"),
]


@dataclass
class Outcome:
    framework: str
    constrain: bool
    task: int
    passed: bool
    first_call: list[Any] | None  # [name, arguments]
    calls: int
    answer: str
    error: str | None
    seconds: float


def run_langgraph(engine: Any, task: Task, constrain: bool) -> tuple[list[Any] | None, int, str, str | None]:
    from langchain_core.messages import AIMessage
    from langchain_core.tools import tool
    from langgraph.errors import GraphRecursionError
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition

    from relaygen_integrations.langchain import RelayChatModel

    tools = [tool(fn) for fn in TOOLS]
    llm = RelayChatModel(engine=engine, max_tokens=160, constrain=constrain).bind_tools(tools)

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [llm.invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode(tools))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    try:
        state = graph.compile().invoke({"messages": [("user", task.prompt)]}, {"recursion_limit": 8})
    except GraphRecursionError as exc:
        return None, 0, "", f"recursion limit: {str(exc)[:80]}"
    calls = [call for m in state["messages"] if isinstance(m, AIMessage) for call in m.tool_calls]
    first = [calls[0]["name"], calls[0]["args"]] if calls else None
    final = state["messages"][-1]
    return first, len(calls), str(final.content), None


def run_llamaindex(engine: Any, task: Task, constrain: bool) -> tuple[list[Any] | None, int, str, str | None]:
    from llama_index.core.agent.workflow import FunctionAgent, ToolCallResult
    from llama_index.core.tools import FunctionTool

    from relaygen_integrations.llama_index import RelayLLM

    llm = RelayLLM(engine=engine, max_tokens=160, constrain=constrain)
    agent = FunctionAgent(tools=[FunctionTool.from_defaults(fn) for fn in TOOLS], llm=llm)

    async def go() -> tuple[list[Any] | None, int, str, str | None]:
        handler = agent.run(user_msg=task.prompt, max_iterations=6)
        calls: list[list[Any]] = []
        async for event in handler.stream_events():
            if isinstance(event, ToolCallResult):
                calls.append([event.tool_name, event.tool_kwargs])
        try:
            response = await handler
        except Exception as exc:  # the workflow's own limits (max iterations) end the task as failed
            return (calls[0] if calls else None), len(calls), "", f"{type(exc).__name__}: {str(exc)[:80]}"
        return (calls[0] if calls else None), len(calls), str(response.response.content or ""), None

    return asyncio.run(go())


RUNNERS = {"langgraph": run_langgraph, "llamaindex": run_llamaindex}


def run_task(engine: Any, framework: str, constrain: bool, index: int) -> Outcome:
    task = TASKS[index]
    started = time.perf_counter()
    first, calls, answer, error = RUNNERS[framework](engine, task, constrain)
    # One call, the right one, and an answer in prose that holds the value (not the template's markup echoed).
    clean = "<tool_" not in answer and not answer.lstrip().startswith(("{", "```"))
    passed = (
        error is None and calls == 1 and first is not None and task.right_call(first[0], first[1])
        and task.answer in answer and clean
    )  # fmt: skip
    return Outcome(framework, constrain, index, passed, first, calls, answer, error, time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--frameworks", default="langgraph,llamaindex")
    parser.add_argument("--constrain", default="true,false", help="which settings to run: true,false")
    parser.add_argument(
        "--without-result-instruction", action="store_true",
        help="ablation: no instruction to answer with a tool's result (chat/relay_chat.TOOL_RESULT_INSTRUCTION)",
    )  # fmt: skip
    args = parser.parse_args()
    if args.without_result_instruction:
        import relaygen_integrations.chat.relay_chat as relay_chat

        relay_chat.TOOL_RESULT_INSTRUCTION = ""

    from relaygen_integrations import RelayEngine
    from relaygen_integrations.engine.local.cpu import cpu_model_and_flags

    args.out.mkdir(parents=True, exist_ok=True)
    results = args.out / "results.ndjson"  # one JSON object a line (not .jsonl: the docs check reads those as traces)
    done = set()
    if args.resume and results.exists():
        for line in results.read_text().splitlines():
            row = json.loads(line)
            done.add((row["framework"], row["constrain"], row["task"]))
    elif results.exists():
        results.unlink()
    engine = RelayEngine.from_pretrained()  # the shipped default: what a new user's RelayChatModel() runs
    settings = [value == "true" for value in args.constrain.split(",")]
    for framework in args.frameworks.split(","):
        for constrain in settings:
            for index in range(len(TASKS)):
                if (framework, constrain, index) in done:
                    continue
                outcome = run_task(engine, framework, constrain, index)
                print(json.dumps(asdict(outcome)), flush=True)
                with results.open("a") as sink:
                    sink.write(json.dumps(asdict(outcome)) + "\n")
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    cpu, flags = cpu_model_and_flags()
    summary: dict[str, Any] = {
        "machine": {"cpu": cpu, "cpu_flags": list(flags), "python": platform.python_version()},
        "engine": {"mode": engine.mode, "speculative": engine.speculative, "pair": engine.pair_name},
        "result_instruction": not args.without_result_instruction,
    }
    for row in rows:
        key = f"{row['framework']}/{'constrained' if row['constrain'] else 'unconstrained'}"
        entry = summary.setdefault(key, {"passed": 0, "tasks": 0, "seconds": 0.0})
        entry["passed"] += row["passed"]
        entry["tasks"] += 1
        entry["seconds"] = round(entry["seconds"] + row["seconds"], 1)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
