"""What a forward pass over k positions costs, in one-token decode steps, per weight format, on this machine.

Catch-up (after a switch), verification (verified relay) and speculation (self-speculative relay) are all passes
over several positions; relay pays only when those cost about what one decode step costs. On CPUs without native
bf16 instructions (AVX2 only) they do not in bf16, which is what ``dtype="int8"`` is for. Formats interleave per
repetition (A, B, A, B, ...) so machine drift hits them alike; the median is reported.

    .venv/bin/python benchmarks/pass_cost.py [--formats bf16,int8] [--roles large,small] [--context 300] \
        [--reps 3] [--out benchmarks/results/pass_cost.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table
from transformers import DynamicCache
from transformers.utils import logging as hf_logging

from relaygen_integrations.engine.core.pairs import resolve_reference
from relaygen_integrations.engine.local.cpu import cpu_model_and_flags, isa_limits
from relaygen_integrations.engine.local.loading import load_causal_lm, pick_device
from relaygen_integrations.engine.local.weights import pick_weights, quantize_linear_int8

POSITIONS = (1, 2, 4, 8, 16, 32)


def load(role: str, fmt: str, pair: str) -> torch.nn.Module:
    device = pick_device("cpu")
    weights = pick_weights(fmt, device)
    reference, _ = resolve_reference(pair, role, weights.source_dtype)  # type: ignore[arg-type]
    model = load_causal_lm(reference, weights.source_dtype, device)
    return quantize_linear_int8(model) if weights.quantized else model


def pass_seconds(model: torch.nn.Module, cache: DynamicCache, k: int) -> float:
    """One forward over k new positions on top of the cached context (rolled back afterwards), with the logits of
    every position (what verification keeps)."""
    ids = torch.randint(1000, 20000, (1, k))
    start = time.perf_counter()
    model(ids, past_key_values=cache, use_cache=True, logits_to_keep=k)
    seconds = time.perf_counter() - start
    cache.crop(-k)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--formats", default="bf16,int8")
    parser.add_argument("--roles", default="large,small")
    parser.add_argument("--pair", default="demo")
    parser.add_argument("--context", type=int, default=300)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/pass_cost.json"))
    args = parser.parse_args()
    hf_logging.disable_progress_bar()
    console = Console()
    cpu, flags = cpu_model_and_flags()
    machine = {"cpu": cpu, "cpu_flags": list(flags), "threads": torch.get_num_threads(), "torch": torch.__version__,
               "isa_limits": isa_limits(), "torch_cpu_capability": torch.backends.cpu.get_cpu_capability()}  # fmt: skip
    limits = " ".join(f"{k}={v}" for k, v in machine["isa_limits"].items()) or "none"  # type: ignore[union-attr]
    console.print(f"{cpu}, flags {' '.join(flags) or '-'}, ISA caps {limits}, {machine['threads']} threads, "
                  f"torch {torch.__version__}")  # fmt: skip
    torch.manual_seed(0)
    context = torch.randint(1000, 20000, (1, args.context))
    results: dict[str, dict[str, dict[int, float]]] = {}
    for role in args.roles.split(","):
        formats = args.formats.split(",")
        models, caches = {}, {}
        with torch.inference_mode():
            for fmt in formats:
                models[fmt] = load(role, fmt, args.pair)
                caches[fmt] = DynamicCache(config=models[fmt].config)
                models[fmt](context, past_key_values=caches[fmt], use_cache=True, logits_to_keep=1)
                pass_seconds(models[fmt], caches[fmt], 1)  # warm-up: first calls pack weights / pick kernels
            samples: dict[str, dict[int, list[float]]] = {fmt: {k: [] for k in POSITIONS} for fmt in formats}
            for _ in range(args.reps):
                for k in POSITIONS:
                    for fmt in formats:
                        samples[fmt][k].append(pass_seconds(models[fmt], caches[fmt], k))
        results[role] = {fmt: {k: statistics.median(v) for k, v in per_k.items()} for fmt, per_k in samples.items()}
        del models, caches
        table = Table(title=f"{role} model: ms per pass (in that format's one-token steps)", show_edge=False)
        table.add_column("format")
        for k in POSITIONS:
            table.add_column(f"k={k}", justify="right")
        table.add_column("step vs first format", justify="right")
        first_step = results[role][formats[0]][1]
        for fmt in formats:
            row = results[role][fmt]
            cells = [f"{row[k] * 1000:.0f} ({row[k] / row[1]:.2f})" for k in POSITIONS]
            table.add_row(fmt, *cells, f"{row[1] / first_step:.2f}")
        console.print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"machine": machine, "context": args.context, "seconds": results}, indent=2))
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
