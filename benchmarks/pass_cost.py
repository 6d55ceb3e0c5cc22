"""What a forward pass over k positions costs, per model and weight format, on this machine: the table
``relaygen tune`` prices every configuration with (``relaygen_integrations/tune/measure.py`` does the measuring).

Catch-up (after a switch), verification (verified relay) and speculation are all passes over several positions; they
pay only where those cost about what one decode step costs. On CPUs without native bf16 instructions (AVX2 only) they
do not in bf16. Unlike ``relaygen tune`` this has no time budget unless given one, and measures what you name.

    .venv/bin/python benchmarks/pass_cost.py [--formats bf16,int8] [--roles large,small] [--budget 600] \
        [--out benchmarks/results/pass_cost.json]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table
from transformers.utils import logging as hf_logging

from relaygen_integrations.tune.machine import this_machine
from relaygen_integrations.tune.measure import POSITIONS, ModelPassTimer
from relaygen_integrations.tune.tuner import measure_with_progress, pair_model_loader


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--formats", default="bf16,int8")
    parser.add_argument("--roles", default="large,small")
    parser.add_argument("--pair", default="demo")
    parser.add_argument("--budget", type=float, default=600.0, help="seconds in all, loading included")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/pass_cost.json"))
    args = parser.parse_args()
    hf_logging.disable_progress_bar()
    console = Console()
    machine = this_machine("cpu")
    console.print(machine.describe())
    plan = [(role, fmt) for role in args.roles.split(",") for fmt in args.formats.split(",")]
    timer = ModelPassTimer(pair_model_loader(args.pair, torch.device("cpu")))
    table = measure_with_progress(timer, plan, args.budget, show_progress=True)
    table.machine = machine.to_json()
    for role in table.costs:
        view = Table(title=f"{role} model: ms per pass (in that format's one-token steps)", show_edge=False)
        view.add_column("format")
        for k in POSITIONS:
            view.add_column(f"k={k}", justify="right")
        for fmt, costs in table.costs[role].items():
            row = costs.seconds
            view.add_row(fmt, *[f"{row[k] * 1000:.0f} ({row[k] / row[1]:.2f})" if k in row else "-" for k in POSITIONS])
        console.print(view)
    table.save(args.out)
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
