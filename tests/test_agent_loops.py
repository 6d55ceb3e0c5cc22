"""Agent tool loops on the real demo pair, constrained (the default): a hand-built LangGraph loop (``StateGraph`` +
``ToolNode`` + ``tools_condition``) and a LlamaIndex ``FunctionAgent`` each finish at least 8 of the 10 tasks of
``benchmarks/agent_loops.py`` with one right tool call and the right answer. The benchmark runs the same tasks
unconstrained too and keeps both counts (``benchmarks/data/agent-loops``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from relaygen_integrations import RelayEngine
from relaygen_integrations.registry import pair_paths

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from agent_loops import TASKS, run_task

pytestmark = pytest.mark.real_pair


@pytest.fixture(scope="module")
def engine() -> RelayEngine:
    if pair_paths("demo") is None:
        pytest.fail("the demo pair is not cached: run `relaygen models fetch demo` (make test does this first)")
    return RelayEngine.shared()  # what RelayChatModel() and RelayLLM() run: the pair's shipped default


@pytest.mark.parametrize("framework", ["langgraph", "llamaindex"])
def test_agent_loops_finish_with_the_right_call_and_answer(engine, framework):
    outcomes = [run_task(engine, framework, True, index) for index in range(len(TASKS))]
    failed = [(o.task, o.first_call, o.calls, o.answer[:80], o.error) for o in outcomes if not o.passed]
    assert len(outcomes) - len(failed) >= 8, failed
