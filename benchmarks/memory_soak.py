"""Resident memory across many sequential short relay requests (target: < 5 % growth after warm-up).

    .venv/bin/python benchmarks/memory_soak.py [--requests 200] [--max-new-tokens 8] [--large demo --small demo]

Each request has a different prompt (so prefix reuse crops and regrows the caches every time) and a broad cue list
(so both models write and both caches are exercised). RSS is read from /proc after a warm-up of 10 requests.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
from pathlib import Path

from rich.console import Console
from rich.progress import track

from relaygen_integrations import RelayEngine

CUES = ["Therefore", "So", "The", "We", "First", "Then", "To"]


def rss_mib() -> float:
    with open(f"/proc/{os.getpid()}/statm") as statm:
        pages = int(statm.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--max-new-tokens", type=int, default=8)
    parser.add_argument("--large", default="demo")
    parser.add_argument("--small", default="demo")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/memory_soak.json"))
    args = parser.parse_args()
    console = Console()

    engine = RelayEngine.from_pretrained(args.large, args.small, cues=CUES, policy={"min_large_tokens": 1})

    def request(i: int) -> None:
        messages = [{"role": "user", "content": f"Request {i}: what is {i} times {i + 1}? Answer briefly."}]
        engine.generate(messages, max_new_tokens=args.max_new_tokens)

    for i in range(10):
        request(i)
    gc.collect()
    start = rss_mib()
    samples = []
    for i in track(range(args.requests), description="requests"):
        request(1000 + i)
        if i % 20 == 19:
            gc.collect()
            samples.append(round(rss_mib(), 1))
    gc.collect()
    end = rss_mib()
    growth = (end - start) / start
    console.print(f"RSS after warm-up {start:.0f} MiB, after {args.requests} requests {end:.0f} MiB: {growth:+.2%}")
    console.print(f"samples every 20 requests (MiB): {samples}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps({"start_mib": start, "end_mib": end, "growth": growth, "samples_mib": samples}, indent=2)
    )
    if growth >= 0.05:
        raise SystemExit(f"resident memory grew {growth:.1%} (limit 5 %)")


if __name__ == "__main__":
    main()
