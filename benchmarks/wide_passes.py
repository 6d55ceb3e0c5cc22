"""Wide passes in bf16 against the same passes with their linear layers run in fp32 (``engine/local/wide_passes.py``),
on the demo pair's large model, from an empty cache (a prompt's prefill), on this machine. The evidence for
``WIDE_FROM_ROWS``: where the two cross, and how far the upcast pass's logits move (greedy choice and max difference).

    .venv/bin/python benchmarks/wide_passes.py [--positions 8,16,32,400] [--out benchmarks/results/wide-passes]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table
from transformers import AutoModelForCausalLM
from transformers.utils import logging as hf_logging

from relaygen_integrations.engine.local.wide_passes import Fp32WideLinears
from relaygen_integrations.registry import pair_paths
from relaygen_integrations.tune.machine import this_machine


@torch.inference_mode()
def time_pass(model: torch.nn.Module, ids: torch.Tensor, upcast: bool) -> tuple[float, torch.Tensor]:
    started = time.perf_counter()
    if upcast:
        with Fp32WideLinears(1):  # every linear: the pass as a whole, whatever its width
            logits = model(input_ids=ids, logits_to_keep=1).logits
    else:
        logits = model(input_ids=ids, logits_to_keep=1).logits
    return time.perf_counter() - started, logits[0, -1].float()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--positions", default="8,16,24,32,64,128,400")
    parser.add_argument("--pair", default="demo")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/wide-passes"))
    args = parser.parse_args()
    hf_logging.disable_progress_bar()
    console = Console()
    machine = this_machine("cpu")
    console.print(machine.describe())
    paths = pair_paths(args.pair)
    if paths is None:
        raise SystemExit(f"the {args.pair} pair is not cached: run `relaygen models fetch {args.pair}`")
    model = AutoModelForCausalLM.from_pretrained(paths.large, dtype=torch.bfloat16).eval()
    generator = torch.Generator().manual_seed(0)
    time_pass(model, torch.randint(1000, 20000, (1, 4), generator=generator), upcast=False)  # warm-up
    rows = []
    table = Table("positions", "bf16 s", "fp32 linears s", "speed-up", "same greedy token", "max |logit diff|")
    for positions in (int(p) for p in args.positions.split(",")):
        ids = torch.randint(1000, 20000, (1, positions), generator=generator)
        bf16_seconds, bf16_logits = time_pass(model, ids, upcast=False)
        fp32_seconds, fp32_logits = time_pass(model, ids, upcast=True)
        row = {
            "positions": positions,
            "bf16_seconds": round(bf16_seconds, 3),
            "fp32_linears_seconds": round(fp32_seconds, 3),
            "speedup": round(bf16_seconds / fp32_seconds, 2),
            "same_greedy_token": bool(bf16_logits.argmax() == fp32_logits.argmax()),
            "max_logit_diff": round(float((bf16_logits - fp32_logits).abs().max()), 3),
        }
        rows.append(row)
        table.add_row(*(str(v) for v in row.values()))
    console.print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    saved = args.out / "wide_passes.json"
    saved.write_text(json.dumps({"machine": machine.to_json(), "passes": rows}, indent=1) + "\n")
    console.print(f"wrote {saved}")


if __name__ == "__main__":
    main()
