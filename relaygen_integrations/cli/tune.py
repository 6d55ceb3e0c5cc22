"""`relaygen tune`: measure this machine for a pair, price every candidate configuration, say which wins and why.

relaygen tune [PAIR] [--explain] [--refresh] [--budget 60] [--formats large:bf16,small:int8,...]
relaygen tune [PAIR] --costs TABLE.json --explain        # price on a recorded table (another machine's)
relaygen tune [PAIR] --profile-from RESULTS.json[:MODE,MODE] ...   # write the profile's "tuning" entry
relaygen tune [PAIR] --profile-from NEW/results.json --reference OLD/results.json  # NEW has no `large` of its own
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from ..engine.core.shipped import TUNING_KEY, ShippedProfile, shipped_profile_path
from ..tune.candidates import join_mode, split_mode
from ..tune.choose import choose
from ..tune.costs import PassCostTable
from ..tune.observed import MIN_PASSES, bucket_ratios, corrected_table, read_observed
from ..tune.profile import modes_from_results, profiled_modes, tuning_entry


def add_tune_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("tune", help="measure this machine and choose the pair's fastest accurate configuration")
    parser.add_argument("pair", nargs="?", default="demo", help="a known pair (default: demo)")
    parser.add_argument("--explain", action="store_true", help="print every candidate and why the winner won")
    parser.add_argument("--refresh", action="store_true", help="measure again even when this machine is cached")
    parser.add_argument("--budget", type=float, default=60.0, help="seconds the measurement may take (default 60)")
    parser.add_argument("--formats", default=None, help="what to measure, e.g. large:bf16,small:int8,large:int8")
    parser.add_argument("--costs", type=Path, default=None, help="price on this recorded pass-cost table instead")
    measured = "a bench results.json from this machine: show each mode's measured s/token too"
    parser.add_argument("--measured", type=Path, default=None, help=measured)
    profile_from = "write the profile's tuning entry from saved bench runs (MODES: comma-separated)"
    parser.add_argument("--profile-from", nargs="+", default=None, metavar="RESULTS[:MODES]", help=profile_from)
    reference = (
        "with --profile-from: a results.json whose 'large' runs are the accuracy reference of a run that has no "
        "'large' of its own, on the problems both have (refused unless both runs' data, max_new_tokens, "
        "temperature, CPU flags and torch match); a run with its own 'large' keeps it"
    )
    parser.add_argument("--reference", type=Path, default=None, metavar="RESULTS.json", help=reference)
    parser.add_argument("--profile", type=Path, default=None, help="the profile to read or write (default: shipped)")
    parser.set_defaults(func=run_tune)


def _profile_path(args: argparse.Namespace) -> Path:
    path = args.profile or shipped_profile_path(args.pair)
    if path is None:
        raise SystemExit(f"no shipped profile for pair {args.pair!r}: pass --profile")
    return Path(path)


def _write_profile(args: argparse.Namespace, console: Console) -> int:
    sources: list[tuple[Path, list[str] | None]] = []
    for spec in args.profile_from:
        path, _, modes = spec.partition(":")
        sources.append((Path(path), modes.split(",") if modes else None))
    modes = modes_from_results(sources, reference=args.reference)
    target = _profile_path(args)
    profile = json.loads(target.read_text(encoding="utf-8"))
    read = [path for path, _ in sources] + ([args.reference] if args.reference is not None else [])
    profile[TUNING_KEY] = tuning_entry(modes, [str(path.parent) for path in read])
    target.write_text(json.dumps(profile, indent=2) + "\n", encoding="utf-8")
    console.print(f"wrote {len(modes)} modes into {target}'s {TUNING_KEY!r} entry")
    return 0


def _measured_per_token(path: Path | None) -> dict[str, float]:
    if path is None:
        return {}
    saved = json.loads(path.read_text(encoding="utf-8"))
    run_formats = str(saved.get("machine", {}).get("dtype") or "bf16")
    seconds: dict[str, float] = {}
    tokens: dict[str, int] = {}
    for run in saved["runs"]:
        name = join_mode(*split_mode(run["mode"], run_formats))
        seconds[name] = seconds.get(name, 0.0) + run["seconds"]
        tokens[name] = tokens.get(name, 0) + run["completion_tokens"]
    return {name: seconds[name] / tokens[name] for name in seconds if tokens[name]}


def explain(choice: Any, measured: dict[str, float], console: Console) -> None:
    table = Table(title="candidates on this machine (predicted; fastest first)", show_edge=False)
    table.add_column("candidate", no_wrap=True)
    for column in ("ms/token", "s/answer", "vs large", "measured ms/token"):
        table.add_column(column, justify="right")
    table.add_column("accuracy")
    table.add_column("why", overflow="fold")
    for priced in choice.ranked:
        candidate = priced.candidate
        mark = "[bold green]> [/]" if priced is choice.winner else "  "
        seen = measured.get(candidate.name)
        table.add_row(
            mark + candidate.name,
            f"{priced.seconds_per_token * 1000:.1f}",
            f"{priced.seconds_per_answer:.1f}",
            f"{priced.speedup:.2f}x",
            f"{seen * 1000:.1f}" if seen else "-",
            "[green]backed[/]" if candidate.backed else "[red]not backed[/]",
            "; ".join([candidate.why, *candidate.notes]),
        )
    console.print(table)
    for candidate, missing in choice.unpriced:
        console.print(f"  [dim]{candidate.name}: not priced, this machine's table lacks {', '.join(missing)}[/]")
    console.print(f"[bold]winner[/]: {choice.winner.candidate.name} - {choice.reason}")


def explain_observed(table: Any, observed: Any, console: Console) -> None:
    """What an engine's passes cost here against the measured table, by bucket of sizes (``tune/observed.py``)."""
    for role, by_fmt in observed.cells.items():
        for fmt, cells in by_fmt.items():
            measured = table.get(role, fmt)
            if measured is None:
                continue
            ratios = ", ".join(
                f"{'past the table' if math.isinf(r.upto) else f'<= {r.upto:.0f}'}: x{r.ratio:.2f} ({r.passes:.0f})"
                + ("" if r.passes >= MIN_PASSES else " too few")
                for r in bucket_ratios(measured, cells)
            )
            console.print(f"  observed {role}:{fmt} against measured, by pass size (passes): {ratios}")


def run_tune(args: argparse.Namespace) -> int:
    import torch

    from ..engine.local.loading import pick_device
    from ..tune.configuration import configuration_for
    from ..tune.tuner import tune_pair

    # Piped or redirected, rich would wrap the candidate table at 80 columns: write it whole instead.
    console = Console() if sys.stdout.isatty() else Console(width=200)
    if args.profile_from:
        return _write_profile(args, console)
    if args.reference is not None:
        raise SystemExit("--reference only applies with --profile-from")
    profile = ShippedProfile.read(_profile_path(args)).data
    if args.costs is not None:
        table, observed = PassCostTable.load(args.costs), read_observed(args.costs)
        choice = choose(profiled_modes(profile), corrected_table(table, observed))
        console.print(f"pass costs recorded on: {table.machine.get('cpu', table.machine.get('processor', '?'))} "
                      f"{table.machine.get('cpu_flags', table.machine.get('flags', ''))}")  # fmt: skip
        machine_key = "recorded"
    else:
        plan = None
        if args.formats:
            plan = [tuple(item.split(":", 1)) for item in args.formats.split(",")]
        device: torch.device = pick_device("auto")
        tuned = tune_pair(args.pair, profile, device, refresh=args.refresh, plan=plan, budget=args.budget)
        choice, machine_key, table, observed = tuned.choice, tuned.machine.key(), tuned.table, tuned.observed
        state = "cached" if tuned.cached else "measured"
        console.print(f"{tuned.machine.describe()}\npass costs {state}: {tuned.path}")
    winner = choice.winner
    configuration = configuration_for(winner.candidate, winner.speedup, machine_key)
    if args.explain:
        explain(choice, _measured_per_token(args.measured), console)
        explain_observed(table, observed, console)
    console.print_json(json.dumps(configuration.describe()))
    return 0
