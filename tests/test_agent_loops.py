"""Agent tool loops on the real demo pair, constrained (the default): a hand-built LangGraph loop (``StateGraph`` +
``ToolNode`` + ``tools_condition``) and a LlamaIndex ``FunctionAgent`` each run three tasks of
``benchmarks/agent_loops.py`` and must finish at least two with one right tool call and the right answer; between
them they use all four tools. A task costs ~60 s on a 2-core CPU without bf16 instructions (10 min for the ten tasks
this file ran before), so CI gets six. The benchmark runs all ten tasks on both frameworks, constrained and not, and
keeps the counts (``benchmarks/data/agent-loops``: 10 of 10 constrained on both, on an AVX512-BF16 EPYC). One miss
is allowed because greedy text is not the same on every CPU: a bf16 pass over several positions rounds differently
from one machine's kernels to another's (docs/benchmarks.md counts how often texts part).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from relaygen_integrations import RelayEngine
from relaygen_integrations.registry import pair_paths

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from agent_loops import TASKS, TOOLS, run_task

pytestmark = pytest.mark.real_pair


@pytest.fixture(scope="module")
def engine() -> RelayEngine:
    if pair_paths("demo") is None:
        pytest.fail("the demo pair is not cached: run `relaygen models fetch demo` (make test does this first)")
    return RelayEngine.shared()  # what RelayChatModel() and RelayLLM() run: the pair's shipped default


# LangGraph: add, subtract, the weather in Paris; LlamaIndex: multiply, the weather in Tokyo, a subtraction in words.
TASKS_BY_FRAMEWORK = {"langgraph": (0, 2, 3), "llamaindex": (1, 6, 9)}


@pytest.mark.parametrize("framework", sorted(TASKS_BY_FRAMEWORK))
def test_agent_loops_finish_with_the_right_call_and_answer(engine, framework):
    outcomes = [run_task(engine, framework, True, index) for index in TASKS_BY_FRAMEWORK[framework]]
    failed = [(o.task, o.first_call, o.calls, o.answer[:80], o.error) for o in outcomes if not o.passed]
    assert len(outcomes) == 3 and len(failed) <= 1, failed


def test_the_two_frameworks_use_every_tool():
    used = {TASKS[index].tool for indices in TASKS_BY_FRAMEWORK.values() for index in indices}
    assert used == {tool.__name__ for tool in TOOLS}
