"""LangChain adapter overhead on the demo pair: ``RelayChatModel.invoke`` vs the engine's own ``generate``.

Both run the same messages, settings and engine instance (greedy, so the same tokens); runs are interleaved
(engine, adapter, engine, adapter, ...) so machine drift hits both alike, and medians are reported. Target: the
adapter within 2 % of the engine (ratio <= 1.02). A second pair of measurements at a 1-token budget shows the fixed
per-call cost of the adapter (message conversion, callback manager, result mapping) in milliseconds.

    .venv/bin/python benchmarks/langchain_overhead.py [--tokens 64] [--reps 5] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch
from langchain_core.messages import HumanMessage, SystemMessage
from rich.console import Console
from rich.table import Table

from relaygen_integrations import RelayEngine
from relaygen_integrations.langchain import RelayChatModel
from relaygen_integrations.prompts import MATH_SYSTEM_PROMPT, load_gsm8k

console = Console()


def timed(fn) -> tuple[float, object]:
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def compare(engine: RelayEngine, question: str, tokens: int, reps: int) -> dict:
    dicts = [{"role": "system", "content": MATH_SYSTEM_PROMPT}, {"role": "user", "content": question}]
    messages = [SystemMessage(MATH_SYSTEM_PROMPT), HumanMessage(question)]
    llm = RelayChatModel(engine=engine, max_tokens=tokens, temperature=0.0)

    def direct() -> str:
        return engine.generate(dicts, max_new_tokens=tokens, temperature=0.0).text

    def adapter() -> str:
        return llm.invoke(messages).text

    direct()  # warm-up: allocator, kernels, and the prompt prefix in both caches
    adapter()
    engine_times, adapter_times, same_text = [], [], True
    for _ in range(reps):
        t, ref = timed(direct)
        engine_times.append(t)
        t, got = timed(adapter)
        adapter_times.append(t)
        same_text &= got == ref
    eng, ada = statistics.median(engine_times), statistics.median(adapter_times)
    return {
        "tokens": tokens,
        "engine_median_s": eng,
        "adapter_median_s": ada,
        "adapter_over_engine": ada / eng,
        "adapter_minus_engine_ms": (ada - eng) * 1000,
        "same_text": same_text,
        "engine_s": engine_times,
        "adapter_s": adapter_times,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/langchain_overhead.json"))
    args = parser.parse_args()

    engine = RelayEngine.from_pretrained("demo", "demo", dtype=args.dtype)
    question = load_gsm8k()[0]["question"]
    load_before = os.getloadavg()[0]
    full = compare(engine, question, args.tokens, args.reps)
    fixed = compare(engine, question, 1, args.reps)
    load_after = os.getloadavg()[0]

    table = Table(title=f"LangChain adapter overhead, demo pair, {args.dtype}, {torch.get_num_threads()} threads")
    table.add_column("measure")
    table.add_column("value", justify="right")
    for run in (full, fixed):
        n = run["tokens"]
        table.add_row(f"engine.generate, {n} tokens (median s)", f"{run['engine_median_s']:.3f}")
        table.add_row(f"RelayChatModel.invoke, {n} tokens (median s)", f"{run['adapter_median_s']:.3f}")
        table.add_row(f"invoke / generate, {n} tokens", f"{run['adapter_over_engine']:.3f}")
        table.add_row(f"invoke - generate, {n} tokens (ms)", f"{run['adapter_minus_engine_ms']:.1f}")
        table.add_row(f"same text, {n} tokens", str(run["same_text"]))
    table.add_row("1-min load average before / after", f"{load_before:.2f} / {load_after:.2f}")
    console.print(table)

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "machine": {"cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
                            "torch": torch.__version__, "dtype": args.dtype, "cpus": os.cpu_count(),
                            "load_average_before_after": [load_before, load_after]},
                "question": question,
                "full": full,
                "one_token": fixed,
            },
            indent=2,
        )
    )  # fmt: skip
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
