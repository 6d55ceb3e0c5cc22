"""Engine overhead on the demo pair, measured as ratios within one run.

1. ``mode="large"`` through the engine vs plain ``large.generate`` for the same number of tokens (target: within 5 %).
2. A switch's catch-up: one forward over k unseen tokens vs one decode step, at a realistic context length
   (target: about one decode step per 16 caught-up tokens).
3. One relay generation for context: small-token share, switches, catch-up tokens, speed vs large-only.

Runs are interleaved (A, B, A, B, ...) so machine drift hits both alike; medians are reported.

    .venv/bin/python benchmarks/engine_overhead.py [--tokens 64] [--reps 3] [--dtype bf16] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from relaygen_integrations import RelayEngine
from relaygen_integrations.engine.local.runner import ModelRunner
from relaygen_integrations.prompts import load_gsm8k, math_messages

console = Console()


def timed(fn) -> tuple[float, object]:
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--relay-tokens", type=int, default=256)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/engine_overhead.json"))
    args = parser.parse_args()

    engine = RelayEngine.from_pretrained("demo", "demo", dtype=args.dtype, reuse_prefix=False)
    large = engine.backend.local_model("large")
    question = load_gsm8k()[0]["question"]
    prompt_ids = engine.encode_messages(math_messages(question))
    n = args.tokens

    def hf() -> list[int]:
        out = large.generate(torch.tensor([prompt_ids]), max_new_tokens=n, min_new_tokens=n, do_sample=False)
        return out[0, len(prompt_ids) :].tolist()

    def ours() -> list[int]:
        return engine.generate_ids(prompt_ids, max_new_tokens=n, mode="large").completion_ids

    hf()  # warm-up (allocator, kernels)
    ours()
    hf_times, engine_times = [], []
    same_tokens = True
    for _ in range(args.reps):
        t, ref = timed(hf)
        hf_times.append(t)
        t, got = timed(ours)
        engine_times.append(t)
        same_tokens &= got == ref[: len(got)]
    hf_med, eng_med = statistics.median(hf_times), statistics.median(engine_times)

    # Catch-up cost at a realistic position: ~prompt + 200 tokens already cached.
    context = prompt_ids + ours()[:64] * 3
    runner = ModelRunner("large", large)
    catchup: dict[int, float] = {}
    for k in (1, 8, 16, 32, 64):
        samples = []
        for _ in range(args.reps + 2):
            runner.reset()
            runner.forward_tokens(context)
            samples.append(timed(lambda k=k: runner.forward_tokens(context[:k]))[0])
        catchup[k] = statistics.median(samples)
    decode = catchup[1]

    relay_time, relay = timed(lambda: engine.generate(math_messages(question), max_new_tokens=args.relay_tokens))
    large_time, large_only = timed(
        lambda: engine.generate(math_messages(question), max_new_tokens=args.relay_tokens, mode="large")
    )

    table = Table(title=f"engine overhead, demo pair, {args.dtype}, {torch.get_num_threads()} threads")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_row(f"plain large.generate, {n} tokens (median s)", f"{hf_med:.2f}")
    table.add_row(f"engine mode=large, {n} tokens (median s)", f"{eng_med:.2f}")
    table.add_row("engine / generate", f"{eng_med / hf_med:.3f}")
    table.add_row("same token ids", str(same_tokens))
    for k, t in catchup.items():
        table.add_row(f"forward of {k} tokens / decode step", f"{t / decode:.2f}")
    table.add_row("relay: small share f", f"{relay.usage.small_share:.2f}")
    table.add_row("relay: switches", str(relay.usage.switches))
    table.add_row(
        "relay: catch-up tokens large/small", f"{relay.usage.large_catchup_tokens}/{relay.usage.small_catchup_tokens}"
    )
    relay_per_token = relay_time / max(1, relay.usage.completion_tokens)
    large_per_token = large_time / max(1, large_only.usage.completion_tokens)
    table.add_row("relay s/token vs large-only s/token", f"{relay_per_token / large_per_token:.3f}")
    console.print(table)

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "machine": {"cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
                            "torch": torch.__version__, "dtype": args.dtype},
                "tokens": n,
                "generate_median_s": hf_med,
                "engine_median_s": eng_med,
                "engine_over_generate": eng_med / hf_med,
                "same_tokens": same_tokens,
                "forward_k_over_decode": {k: t / decode for k, t in catchup.items()},
                "relay": {"usage": relay.usage.to_dict(), "elapsed": relay_time},
                "large_only": {"usage": large_only.usage.to_dict(), "elapsed": large_time},
            },
            indent=2,
        )
    )  # fmt: skip
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
