"""The turn after a tool result on the demo pair, with and without an instruction in the system message: does the
model answer with the result? The ten tasks of ``benchmarks/agent_loops.py``, four tools, greedy, the default engine
(``benchmarks/data/tool-result-instruction``; the instruction now ships as ``chat/relay_chat.TOOL_RESULT_INSTRUCTION``,
so run this with that set to "" to see the "none" case again).

    python benchmarks/tool_result_instruction.py "<instruction text>"
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    import agent_loops as al
    from langchain_core.utils.function_calling import convert_to_openai_tool

    from relaygen_integrations import RelayEngine
    from relaygen_integrations.chat.relay_chat import prepare_chat, stream_chat
    from relaygen_integrations.engine.core.settings import merge_settings

    engine = RelayEngine.from_pretrained()
    tools = [convert_to_openai_tool(f) for f in al.TOOLS]
    functions = {f.__name__: f for f in al.TOOLS}
    for name, hint in {"none": None, "hint": sys.argv[1]}.items():
        answered = 0
        for task in al.TASKS:
            call = {"id": "c1", "type": "function", "function": {"name": task.tool, "arguments": task.arguments}}
            result = functions[task.tool](**task.arguments)
            messages = [
                *([{"role": "system", "content": hint}] if hint else []),
                {"role": "user", "content": task.prompt},
                {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "content": str(result), "tool_call_id": "c1"},
            ]
            request = prepare_chat(messages, merge_settings({"max_new_tokens": 80}), tools, "auto")
            final = list(stream_chat(engine, request))[-1]
            good = task.answer in final.parsed.content and not final.parsed.tool_calls
            answered += good
            print(name, good, repr(final.result.text[:100]))
        print(name, answered)


if __name__ == "__main__":
    main()
