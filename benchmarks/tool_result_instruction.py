"""The turn after a tool result on the demo pair under each candidate system instruction: does the model answer with
the result, and does it still write a longer answer where the request asks for one?

Two families of turns, greedy, the default engine, all in one run:

* the ten tasks of ``benchmarks/agent_loops.py`` (four tools): passes when the answer holds the tool's result and makes
  no call;
* open-ended requests after a result: an ``AgentWorkflow`` handoff (LlamaIndex's own handoff output) to a writer asked
  for three sentences, with the handoff tool bound and without (a leaf agent: the chat has no tools, so no
  instruction is added either), passes when the answer is about the moon and not about the user's request; notes
  looked up by a tool and asked back as three facts, passes when the answer holds all three. Neither may make a call.

    python benchmarks/tool_result_instruction.py --out benchmarks/data/tool-result-instruction-v2 \\
        --instruction shipped --instruction "<text>" [--instruction none]

``shipped`` is ``chat/relay_chat.TOOL_RESULT_INSTRUCTION``; ``none`` is no instruction. Writes ``results.ndjson`` (one
line per instruction x turn) and ``summary.json`` (passes per instruction and family, the machine).
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

HANDOFF_OUTPUT = (  # llama_index.core.agent.workflow.prompts.DEFAULT_HANDOFF_OUTPUT_PROMPT, filled
    "Agent writer is now handling the request due to the following reason: the user wants sentences written.\n"
    "Please continue with the current request."
)
NOTES = "Quellmarsh is the capital of Zorbia. The national dish of Zorbia is fried kelp. Zorbia lies on the river Vint."


def handoff(to_agent: str, reason: str) -> str:
    """Handoff control of the conversation to another agent."""
    return HANDOFF_OUTPUT


def search_notes(query: str) -> str:
    """Search the user's notes."""
    return NOTES


@dataclass(frozen=True)
class Turn:
    """The turn after one tool call and its result."""

    name: str
    system: str | None
    prompt: str
    tool: Any
    arguments: dict[str, Any]
    must_hold: tuple[str, ...]
    must_not_hold: tuple[str, ...] = ()
    # The tools bound in the request: None for the called tool alone, () for none (a leaf agent of a workflow).
    bound: tuple[Any, ...] | None = None
    family: str = "open"


HANDOFF_WRITER = Turn(
    "handoff-writer",
    "You write short plain sentences. Every sentence starts with 'The'.",
    "Write three short sentences about the moon. Each sentence must start with 'The'.",
    handoff,
    {"to_agent": "writer", "reason": "the user wants sentences written"},
    ("moon",),
    ("user",),
)
OPEN_TURNS = [
    HANDOFF_WRITER,
    replace(HANDOFF_WRITER, name="handoff-writer-leaf", bound=()),
    Turn(
        "notes-three-facts",
        None,
        "Look up Zorbia in my notes and tell me three facts about it, one sentence each.",
        search_notes,
        {"query": "Zorbia"},
        ("Quellmarsh", "kelp", "Vint"),
    ),
]


def task_turns(agent_loops: Any) -> list[Turn]:
    """The ten agent tasks, all four tools bound: the answer must hold the tool's result."""
    return [
        Turn(task.prompt, None, task.prompt, getattr(agent_loops, task.tool), task.arguments, (task.answer,),
             bound=tuple(agent_loops.TOOLS), family="tasks")
        for task in agent_loops.TASKS
    ]  # fmt: skip


def sentences(text: str) -> int:
    return len(re.findall(r"[^.!?\n]+[.!?]", text))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--instruction", action="append", required=True, help="'shipped', 'none' or the text")
    parser.add_argument("--max-new-tokens", type=int, default=80)
    args = parser.parse_args()

    import agent_loops as al
    from langchain_core.utils.function_calling import convert_to_openai_tool

    from relaygen_integrations import RelayEngine
    from relaygen_integrations.chat import relay_chat
    from relaygen_integrations.chat.relay_chat import prepare_chat, stream_chat
    from relaygen_integrations.engine.core.settings import merge_settings
    from relaygen_integrations.engine.local.cpu import cpu_model_and_flags

    shipped = relay_chat.TOOL_RESULT_INSTRUCTION
    engine = RelayEngine.from_pretrained()
    args.out.mkdir(parents=True, exist_ok=True)
    cpu, flags = cpu_model_and_flags()
    machine = {"cpu": cpu, "cpu_flags": list(flags), "python": platform.python_version()}
    summary: dict[str, Any] = {"machine": machine, "results": {}}
    with (args.out / "results.ndjson").open("w") as lines:
        for label in args.instruction:
            text = {"shipped": shipped, "none": ""}.get(label, label)
            relay_chat.TOOL_RESULT_INSTRUCTION = text  # the chat layer adds it to every chat with a tool result
            passes = {"tasks": 0, "open": 0}
            for turn in task_turns(al) + OPEN_TURNS:
                function = {"name": turn.tool.__name__, "arguments": turn.arguments}
                messages = [
                    *([{"role": "system", "content": turn.system}] if turn.system else []),
                    {"role": "user", "content": turn.prompt},
                    {
                        "role": "assistant",
                        "content": "",
                        "tool_calls": [{"id": "c1", "type": "function", "function": function}],
                    },
                    {"role": "tool", "content": str(turn.tool(**turn.arguments)), "tool_call_id": "c1"},
                ]
                bound = (turn.tool,) if turn.bound is None else turn.bound
                schemas = [convert_to_openai_tool(f) for f in bound] or None
                request = prepare_chat(
                    messages,
                    merge_settings({"max_new_tokens": args.max_new_tokens}),
                    schemas,
                    "auto" if schemas else None,
                )
                started = time.perf_counter()
                final = list(stream_chat(engine, request))[-1]
                answer = final.parsed.content or ""
                good = (
                    not final.parsed.tool_calls
                    and all(word.lower() in answer.lower() for word in turn.must_hold)
                    and not any(word.lower() in answer.lower() for word in turn.must_not_hold)
                )
                passes[turn.family] += good
                row = {
                    "instruction": label,
                    "family": turn.family,
                    "prompt": turn.prompt,
                    "passed": good,
                    "sentences": sentences(answer),
                    "answer": final.result.text,
                    "seconds": round(time.perf_counter() - started, 2),
                }
                lines.write(json.dumps(row) + "\n")
                lines.flush()
                print(label[:20], turn.family, good, repr(final.result.text[:90]), flush=True)
            summary["results"][label] = {
                "text": text,
                "tasks": f"{passes['tasks']}/{len(al.TASKS)}",
                "open": f"{passes['open']}/{len(OPEN_TURNS)}",
            }
            print(label, summary["results"][label], flush=True)
    relay_chat.TOOL_RESULT_INSTRUCTION = shipped
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
