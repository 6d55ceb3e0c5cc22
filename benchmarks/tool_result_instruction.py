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
class OpenTurn:
    name: str
    system: str | None
    prompt: str
    tool: Any
    arguments: dict[str, Any]
    must_hold: tuple[str, ...]
    must_not_hold: tuple[str, ...] = ()
    bound: bool = True  # the tool bound in the request (a leaf agent of a workflow has none bound)


HANDOFF_WRITER = OpenTurn(
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
    replace(HANDOFF_WRITER, name="handoff-writer-leaf", bound=False),
    OpenTurn(
        "notes-three-facts",
        None,
        "Look up Zorbia in my notes and tell me three facts about it, one sentence each.",
        search_notes,
        {"query": "Zorbia"},
        ("Quellmarsh", "kelp", "Vint"),
    ),
]


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
            turns = [
                ("tasks", task.prompt, None, al.TOOLS, getattr(al, task.tool), task.arguments, (task.answer,), ())
                for task in al.TASKS
            ] + [
                (
                    "open",
                    turn.prompt,
                    turn.system,
                    [turn.tool] if turn.bound else [],
                    turn.tool,
                    turn.arguments,
                    turn.must_hold,
                    turn.must_not_hold,
                )
                for turn in OPEN_TURNS
            ]
            passes = {"tasks": 0, "open": 0}
            for family, prompt, system, tools, function, arguments, must_hold, must_not_hold in turns:
                call = {"id": "c1", "type": "function", "function": {"name": function.__name__, "arguments": arguments}}
                messages = [
                    *([{"role": "system", "content": system}] if system else []),
                    {"role": "user", "content": prompt},
                    {"role": "assistant", "content": "", "tool_calls": [call]},
                    {"role": "tool", "content": str(function(**arguments)), "tool_call_id": "c1"},
                ]
                schemas = [convert_to_openai_tool(f) for f in tools] or None
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
                    and all(word.lower() in answer.lower() for word in must_hold)
                    and not any(word.lower() in answer.lower() for word in must_not_hold)
                )
                passes[family] += good
                row = {
                    "instruction": label,
                    "family": family,
                    "prompt": prompt,
                    "passed": good,
                    "sentences": sentences(answer),
                    "answer": final.result.text,
                    "seconds": round(time.perf_counter() - started, 2),
                }
                lines.write(json.dumps(row) + "\n")
                lines.flush()
                print(label[:20], family, good, repr(final.result.text[:90]), flush=True)
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
