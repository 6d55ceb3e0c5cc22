"""The tuner against the record: for every recorded machine, its choice; for every recorded run with a pass-cost
table of the same machine, each mode's predicted seconds per token (its own runs' work priced with that table)
against the measured. No model runs: it reads ``benchmarks/data`` only.

    .venv/bin/python benchmarks/tune_check.py [--profile relaygen_integrations/profiles/demo.json] \
        [--pair-table RESULTS=TABLE ...] > benchmarks/results/tune_check.txt
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from relaygen_integrations.bench.predicted import mode_formats
from relaygen_integrations.tune.choose import choose
from relaygen_integrations.tune.cost_model import seconds_per_token
from relaygen_integrations.tune.costs import PassCostTable
from relaygen_integrations.tune.profile import profiled_modes
from relaygen_integrations.tune.work import work_from_runs

DATA = Path("benchmarks/data")
AVX512_BF16 = "pass-cost-avx512bf16/pass_cost.json+pass-cost-avx512bf16/pass_cost-int8-row-scaled.json"
# machine -> its table (files joined with '+', later ones overriding: the row-scaled int8 remeasure)
MACHINES = {
    "AMD EPYC, AVX-512 + AVX512-BF16": AVX512_BF16,
    "Intel Xeon, AMX (native)": "pass-cost-avx2-capped/native.json",
    "Intel Xeon, AMX, AVX2 paths forced": "pass-cost-avx2-capped/avx2-capped.json",
    "AMD EPYC, AVX2 only (pass-cost-avx2.json)": "pass-cost-avx2.json",
    "AMD EPYC, AVX2 only (tune-avx2-epyc)": "tune-avx2-epyc/pass_cost.json",
    "Intel Xeon, AVX-512 without AVX512-BF16 or AMX (first use)": "tune-check-avx512/tune_table.json",
    "Intel Xeon, AVX-512 without AVX512-BF16 or AMX, AVX2 paths forced (first use)": (
        "tune-check-avx2-forced-avx512/tune_table.json"
    ),
    "NVIDIA H200, random weights (engine compile=True)": "gpu-h200/pass_cost.json",
}
# recorded runs -> the table of the machine (class) they ran on
RUNS = {
    "relay-vs-spec-60": AVX512_BF16,
    "probe-int8": AVX512_BF16,
    "draft-vocab-avx2": "pass-cost-avx2-capped/avx2-capped.json",
    "draft-vocab-bf16-amx": "pass-cost-avx2-capped/native.json",
    "int8-n5": "pass-cost-avx2.json",
    "verify-bf16": "pass-cost-avx2.json",
    "tune-check-avx512": "tune-check-avx512/tune_table_v2.json",  # remeasured: steps median of 3, 64 positions
    "tune-check-avx2-forced-avx512": "tune-check-avx2-forced-avx512/tune_table.json",
    "tune-check-observed-avx512": "tune-check-observed-avx512/tune_table_before.json",  # the table the run's engine had
}


def load_table(spec: str) -> PassCostTable:
    return PassCostTable.load_layered(*(DATA / part for part in spec.split("+")))


def predicted_against_measured(results: Path, table: PassCostTable) -> list[tuple[str, int, float, float]]:
    saved = json.loads(results.read_text(encoding="utf-8"))
    run_formats = str(saved.get("machine", {}).get("dtype") or "bf16")
    by_mode: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for run in saved["runs"]:
        by_mode[run["mode"]].append(run)
    rows = []
    configurations = saved.get("configurations") or {}
    for mode, runs in by_mode.items():
        large, small = mode_formats(mode, run_formats, configurations)
        predicted = seconds_per_token(work_from_runs(runs), table, {"large": large, "small": small})
        if predicted is None:
            continue
        measured = sum(r["seconds"] for r in runs) / sum(r["completion_tokens"] for r in runs)
        rows.append((mode, len(runs), predicted, measured))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", type=Path, default=Path("relaygen_integrations/profiles/demo.json"))
    more = "more recorded runs (a results.json folder under benchmarks/data) with their machine's table"
    parser.add_argument("--pair-table", nargs="*", default=[], metavar="RESULTS=TABLE", help=more)
    args = parser.parse_args()
    modes = profiled_modes(json.loads(args.profile.read_text(encoding="utf-8")))
    print("## The choice per machine (predicted speed-up over the large model alone in bf16)\n")
    print("| machine | winner | predicted speed-up | shipped default large-spec#bf16/int8 |")
    print("|---|---|---|---|")
    for machine, spec in MACHINES.items():
        choice = choose(modes, load_table(spec))
        shipped = choice.by_name("large-spec#bf16/int8")
        shipped_text = f"{shipped.speedup:.2f}x" if shipped else "not priced (no int8 on a GPU)"
        print(f"| {machine} | {choice.winner.candidate.name} | {choice.winner.speedup:.2f}x | {shipped_text} |")
    runs = dict(RUNS)
    for item in args.pair_table:
        folder, _, table = item.partition("=")
        runs[folder] = table
    print("\n## Predicted against measured seconds per token (each mode's own runs, its machine's table)\n")
    print("| run | mode | runs | predicted ms/token | measured ms/token | predicted / measured |")
    print("|---|---|---|---|---|---|")
    for folder, spec in runs.items():
        for mode, count, predicted, measured in predicted_against_measured(DATA / folder / "results.json",
                                                                           load_table(spec)):  # fmt: skip
            print(f"| {folder} | {mode} | {count} | {predicted * 1000:.1f} | {measured * 1000:.1f} | "
                  f"{predicted / measured:.2f} |")  # fmt: skip


if __name__ == "__main__":
    main()
