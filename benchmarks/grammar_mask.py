"""What a grammar's token mask costs per token, against a large-model decode step, in one run on the demo pair.

Each case generates the same answers twice - under the grammar and without - on the engine a new user gets
(``RelayEngine.from_pretrained()``), and reads the engine's own time split: ``grammar.mask`` (computing the masks,
unpacking and applying them) against the large model's decode or draft-check time. Cases: a nested JSON schema
(structured output) and four tools with ``tool_choice="auto"`` (an agent's turn), each in ``mode="large"`` without
speculation (one mask per large decode step: the issue's measure) and in the shipped default (drafts and checks
masked too).

    python benchmarks/grammar_mask.py --out benchmarks/data/grammar-mask
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

sys.path.insert(0, str(Path(__file__).resolve().parent))
from agent_loops import TASKS, TOOLS


class Place(BaseModel):
    city: str = Field(max_length=40)
    country: str = Field(max_length=40)


class Landmark(BaseModel):
    """A landmark, where it is and when it was finished."""

    name: str = Field(max_length=60)
    place: Place
    year: int
    tags: list[str] = Field(max_length=3)


PROMPTS = ["Describe the Eiffel Tower.", "Tell me about the Colosseum.", "What do you know about Big Ben?"]


def run(engine: Any, case: str, settings: dict[str, Any], constrain: bool) -> dict[str, float]:
    from langchain_core.utils.function_calling import convert_to_openai_tool

    from relaygen_integrations.chat.relay_chat import prepare_chat, stream_chat
    from relaygen_integrations.engine.core.settings import merge_settings

    totals: dict[str, float] = {"tokens": 0, "seconds": 0.0, "mask": 0.0, "large": 0.0, "large_steps": 0}
    if case == "json_schema":
        schema = {"type": "json_schema", "json_schema": {"name": "landmark", "schema": Landmark.model_json_schema()}}
        requests = [([{"role": "user", "content": p}], None, schema) for p in PROMPTS]
    else:
        tools = [convert_to_openai_tool(fn) for fn in TOOLS]
        requests = [([{"role": "user", "content": t.prompt}], tools, None) for t in TASKS[:3]]
    for messages, tools, response_format in requests:
        chat_settings = merge_settings({"max_new_tokens": 120, "constrain": constrain, **settings})
        request = prepare_chat(messages, chat_settings, tools, None, None, response_format)
        started = time.perf_counter()
        result = list(stream_chat(engine, request))[-1].result
        totals["seconds"] += time.perf_counter() - started
        split = result.usage.time_split
        totals["tokens"] += result.usage.completion_tokens
        totals["mask"] += split.get("grammar.mask", 0.0)
        totals["large"] += split.get("large.decode", 0.0) + split.get("large.verify_drafts", 0.0)
        totals["large_steps"] += result.usage.speculative_rounds or max(0, result.usage.large_tokens - 1)
    return totals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    from relaygen_integrations import RelayEngine
    from relaygen_integrations.engine.local.cpu import cpu_model_and_flags

    engine = RelayEngine.from_pretrained()
    cpu, flags = cpu_model_and_flags()
    report: dict[str, Any] = {"machine": {"cpu": cpu, "cpu_flags": list(flags)}, "cases": {}}
    run(engine, "json_schema", {"mode": "large", "speculative": False}, True)  # warm-up: tokenizer, grammar, caches
    for case in ("json_schema", "tools_auto"):
        for label, settings in (("large", {"mode": "large", "speculative": False}), ("default", {})):
            constrained = run(engine, case, settings, True)
            free = run(engine, case, settings, False)
            entry = {
                "constrained": constrained,
                "unconstrained": free,
                "mask_ms_per_token": 1000 * constrained["mask"] / max(1, constrained["tokens"]),
                "large_ms_per_step": 1000 * constrained["large"] / max(1, constrained["large_steps"]),
                "seconds_per_token_ratio": (constrained["seconds"] / max(1, constrained["tokens"]))
                / (free["seconds"] / max(1, free["tokens"])),
            }
            entry["mask_share_of_large_step"] = entry["mask_ms_per_token"] / entry["large_ms_per_step"]
            report["cases"][f"{case}/{label}"] = entry
            print(f"{case}/{label}: mask {entry['mask_ms_per_token']:.3f} ms/token, large step "
                  f"{entry['large_ms_per_step']:.1f} ms ({100 * entry['mask_share_of_large_step']:.2f} %), "
                  f"seconds per token constrained/free {entry['seconds_per_token_ratio']:.3f}", flush=True)  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.json").write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
