"""Streams a relay answer through LangChain, coloured by the model that wrote each chunk, then a stats line.

    .venv/bin/python examples/langchain_streaming_spans.py ["QUESTION"] [--max-tokens 128] [--cues auto]
    .venv/bin/python examples/langchain_streaming_spans.py --cues "Therefore,Thus,So ,First,we,the" --max-tokens 64

Each streamed chunk carries ``response_metadata["relaygen_chunks"]`` (which model, which span); a callback handler
prints the ``relaygen_switch`` custom events as they fire (marked ⇄ inline).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from langchain_core.callbacks import BaseCallbackHandler
from rich.console import Console
from rich.text import Text
from transformers.utils import logging as hf_logging

from relaygen_integrations.cli.render import MODEL_STYLES, legend
from relaygen_integrations.langchain import SWITCH_EVENT, RelayChatModel
from relaygen_integrations.prompts import MATH_SYSTEM_PROMPT

QUESTION = (
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?"
)


class SwitchMarks(BaseCallbackHandler):
    def __init__(self, console: Console) -> None:
        self.console = console

    def on_custom_event(self, name: str, data: Any, **kwargs: Any) -> None:
        if name == SWITCH_EVENT:
            self.console.print(Text("⇄", style="dim"), end="")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("question", nargs="?", default=QUESTION)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--cues", default="auto", help="auto | a preset (generic, qwen3, r1) | a comma-separated list")
    args = parser.parse_args()
    cues = [c for c in args.cues.split(",") if c] if "," in args.cues else args.cues
    hf_logging.disable_progress_bar()

    console = Console()
    llm = RelayChatModel(large="demo", small="demo", cues=cues, max_tokens=args.max_tokens, temperature=0.0)
    console.print(legend(llm.large + ":large", llm.small + ":small"))
    messages = [("system", MATH_SYSTEM_PROMPT), ("human", args.question)]
    start = time.perf_counter()
    total = None
    for chunk in llm.stream(messages, config={"callbacks": [SwitchMarks(console)]}):
        for tag in chunk.response_metadata.get("relaygen_chunks", []):
            console.print(Text(chunk.text, style=MODEL_STYLES[tag["model"]]), end="", soft_wrap=True)
        total = chunk if total is None else total + chunk
    elapsed = time.perf_counter() - start
    console.print()
    assert total is not None
    relay = total.response_metadata["relaygen"]
    tokens = relay["large_tokens"] + relay["small_tokens"]
    stats = Text.assemble(
        ("large ", MODEL_STYLES["large"]), f"{relay['large_tokens']} tok · ",
        ("small ", MODEL_STYLES["small"]), f"{relay['small_tokens']} tok ({relay['small_share']:.0%}) · ",
        f"switches {relay['switches']} · {elapsed:.1f} s · {tokens / elapsed:.1f} tok/s · "
        f"finish {total.response_metadata['finish_reason']}",
    )  # fmt: skip
    console.print(stats)


if __name__ == "__main__":
    main()
