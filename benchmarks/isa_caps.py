"""Which instruction-set caps make this CPU's passes cheaper: each cap set alone, in a fresh process (torch reads
them when it starts), timing the pair's models as ``relaygen tune`` does (``tune/measure.py``: a cached context of
random keys and values, each pass's logits kept).

Why: on a 2-core Intel Xeon with AVX-512 + AVX512-VNNI and no AVX512-BF16, ``relaygen tune`` with torch's AVX2 paths
forced measured the large model's one-token bf16 step at 221 ms and the small model's int8 step at 55 ms, against 326
and 84 ms without the caps a minute earlier; the run that followed paid 278-337 ms a large step with the caps
(``benchmarks/data/tune-check-avx2-forced-avx512``). This tells an ISA effect from a draw of the machine's own
variation: on that Xeon, every cap alone and all four gave 271-327 ms and 76-81 ms (``isa_caps.json`` there), so the
221 ms was the machine, not the caps.

    .venv/bin/python benchmarks/isa_caps.py [--out benchmarks/results/isa_caps.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

AVX2_CAPS = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    "FBGEMM_ENABLE_INSTRUCTIONS": "AVX2",
}
# (role, format, positions) timed in each process
PASSES = (("large", "bf16", 1), ("large", "bf16", 4), ("small", "int8", 1), ("small", "int8", 4))
SAMPLES = 5


def measure_here() -> dict[str, float]:
    """In this process (its caps as they are): the median seconds of each of ``PASSES``."""
    import torch

    from relaygen_integrations.tune.measure import ModelPassTimer
    from relaygen_integrations.tune.tuner import pair_model_loader

    timer = ModelPassTimer(pair_model_loader("demo", torch.device("cpu")))
    seconds: dict[str, float] = {}
    for role, fmt in dict.fromkeys((role, fmt) for role, fmt, _ in PASSES):
        timer.load(role, fmt)
        timer.time_pass(1)  # warm-up
        for _, _, k in (p for p in PASSES if p[:2] == (role, fmt)):
            seconds[f"{role}:{fmt}:{k}"] = statistics.median(timer.time_pass(k) for _ in range(SAMPLES))
        timer.close()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/isa_caps.json"))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure_here()))
        return
    from relaygen_integrations.tune.machine import this_machine

    settings = {"none": {}, **{name: {name: value} for name, value in AVX2_CAPS.items()}, "all four": AVX2_CAPS}
    results: dict[str, dict[str, float]] = {}
    for label, caps in settings.items():
        env = {k: v for k, v in os.environ.items() if k not in AVX2_CAPS} | caps
        out = subprocess.run([sys.executable, __file__, "--child"], env=env, capture_output=True, text=True, check=True)
        results[label] = json.loads(out.stdout.strip().splitlines()[-1])
        print(label, {k: f"{v * 1000:.0f} ms" for k, v in results[label].items()}, flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    machine = this_machine("cpu").to_json()
    args.out.write_text(json.dumps({"machine": machine, "caps": AVX2_CAPS, "median_seconds": results}, indent=1))


if __name__ == "__main__":
    main()
