"""`relaygen calibrate`: find a model pair's switch cues from data and write a profile."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import track
from rich.table import Table

from ..engine.core.configuration import PairConfiguration, pair_formats
from ..engine.core.cues import PAPER_CANDIDATES
from ..engine.core.verify import VerifyRule
from ..prompts import load_gsm8k, math_messages


def add_calibrate_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "calibrate",
        help="calibrate switch cues for a model pair: what verified relay keeps after each cue, and whether that "
        "saves time against speculation (--verify off: the probability-margin test alone)",
    )
    parser.add_argument("--large", default="demo")
    parser.add_argument("--small", default="demo")
    parser.add_argument("--data", type=Path, required=True, help="GSM8K-style jsonl (use a train split)")
    parser.add_argument("--n", type=int, default=40, help="problems to trace")
    parser.add_argument("--max-new-tokens", type=int, default=512)
    parser.add_argument("--dtype", default="bf16", help="the pair's weight formats (bf16, int8, bf16/int8, ...)")
    parser.add_argument("--traces", type=Path, default=None, help="reuse (or, if missing, save) traces here")
    parser.add_argument("--threshold", type=float, default=0.0, help="select cues with delta above this")
    parser.add_argument("--min-occurrences", type=int, default=3)
    parser.add_argument("--min-traces", type=int, default=3, help="distinct traces a selected cue must occur in")
    parser.add_argument("--no-propose", action="store_true", help="score only the paper's candidate list")
    parser.add_argument("--out", type=Path, required=True, help="profile JSON to write (a PNG is written beside it)")
    parser.add_argument(
        "--verify", default="auto", metavar="RULE",
        help="verified calibration under this rule (default: the pair's shipped rule, else greedy); 'off': select "
        "by the margin test alone",
    )  # fmt: skip
    parser.add_argument(
        "--costs", type=Path, default=None, metavar="BENCH_DIR",
        help="a saved `relaygen bench` run on this machine with a large-spec mode (the speculative baseline's cost "
        "per token and the small model's)",
    )  # fmt: skip
    parser.add_argument(
        "--costs-mode", default=None, help="the baseline mode in --costs (default: its first large-spec)"
    )
    parser.add_argument(
        "--pass-cost", type=Path, default=None, metavar="JSON",
        help="benchmarks/pass_cost.py's table from this machine (the large model's pass over k positions)",
    )  # fmt: skip
    parser.add_argument("--max-sentence-tokens", type=int, default=64, help="cap on a trial sentence")
    parser.set_defaults(func=run_calibrate)


def run_calibrate(args: argparse.Namespace) -> int:
    from transformers.utils import logging as hf_logging

    from ..calibrate.margins import Trace, calibrate, plot_margins, tokenizer_hash, trace_candidates, write_profile
    from ..engine import RelayEngine

    hf_logging.disable_progress_bar()
    console = Console()
    verified = _verified_inputs(args)  # bad flags fail before any model loads
    engine = RelayEngine.from_pretrained(args.large, args.small, cues="none", dtype=args.dtype, verify=None)
    records = load_gsm8k(args.data)[: args.n]
    traces: list[Trace] = []
    if args.traces and args.traces.exists():
        lines = [line for line in args.traces.read_text().splitlines() if line.strip()]
        traces = [Trace(**json.loads(line)) for line in lines][: args.n]
        console.print(f"reusing {len(traces)} traces from {args.traces}")
    # Traces are saved one at a time, so an interrupted run keeps what it generated and a rerun (or a larger --n)
    # only generates the missing ones.
    missing = records[len(traces) :]
    if missing:
        sink = None
        if args.traces:
            args.traces.parent.mkdir(parents=True, exist_ok=True)
            sink = args.traces.open("a", encoding="utf-8")
        for record in track(missing, description="large-model traces", console=console):
            prompt_ids = engine.encode_messages(math_messages(record["question"]))
            result = engine.generate_ids(prompt_ids, max_new_tokens=args.max_new_tokens, mode="large")
            traces.append(Trace(prompt_ids, result.completion_ids, result.text))
            if sink is not None:
                sink.write(json.dumps(traces[-1].__dict__, ensure_ascii=False) + "\n")
                sink.flush()
        if sink is not None:
            sink.close()
    margins = [
        engine.backend.token_margins("small", t.prompt_ids, t.completion_ids)
        for t in track(traces, description="small-model margins", console=console)
    ]
    proposed = [] if args.no_propose else trace_candidates(t.text for t in traces)
    result = calibrate(
        traces,
        margins,
        engine.tokenizer,
        PAPER_CANDIDATES,
        proposed,
        args.threshold,
        args.min_occurrences,
        args.min_traces,
    )
    pair = {"large": engine.large_name, "small": engine.small_name, "tokenizer_hash": tokenizer_hash(engine.tokenizer)}
    settings = {"data": str(args.data), "n": len(traces), "max_new_tokens": args.max_new_tokens, "dtype": args.dtype,
                "threshold": args.threshold, "min_occurrences": args.min_occurrences,
                "min_traces": args.min_traces}  # fmt: skip
    extra: dict[str, object] = {}
    if verified is not None:
        extra = _run_verified(args, engine, traces, proposed, result, verified, console)
    write_profile(args.out, result, pair, settings, **extra)
    plot_margins(args.out.with_suffix(".png"), result)

    table = Table(title=f"cue calibration (overall mean margin {result.overall_mean_margin:.3f})")
    for column in ("cue", "source", "occurrences", "traces", "tokens", "mean margin", "delta", "selected"):
        table.add_column(column)
    for row in result.table:
        if row.occurrences:
            table.add_row(repr(row.cue), row.source, str(row.occurrences), str(row.traces), str(row.tokens),
                          f"{row.mean_margin:.3f}", f"{row.delta:+.3f}", "✓" if row.selected else "")  # fmt: skip
    console.print(table)
    selected = extra.get("selected_cues", result.selected)
    console.print(f"selected {len(selected)} cues: {selected}\nwrote {args.out}")
    return 0


def _verified_inputs(args: argparse.Namespace) -> tuple[Any, Any] | None:
    """(rule, costs) for verified calibration, or None with ``--verify off``; checked before loading."""
    from ..calibrate.verified import costs_from_runs
    from ..engine.core.pairs import known_pair
    from ..engine.local.weights import pick_pair_weights

    if args.verify == "off":
        return None
    if args.costs is None or args.pass_cost is None:
        raise SystemExit("relaygen calibrate: verified calibration needs --costs BENCH_DIR and --pass-cost JSON "
                         "measured on this machine (or --verify off for the margin test alone)")  # fmt: skip
    pair = known_pair(args.large, args.small)
    shipped_rule = PairConfiguration.shipped(pair).verify
    rule = VerifyRule.parse(shipped_rule or "greedy") if args.verify == "auto" else None
    try:
        rule = rule or VerifyRule.parse(args.verify)
        import torch

        device = torch.device("cpu")
        large_format = pick_pair_weights(pair_formats(pair, device.type, args.dtype), device).large.name
        bench = json.loads((args.costs / "results.json").read_text())
        costs = costs_from_runs(bench, json.loads(args.pass_cost.read_text()), large_format, args.costs_mode)
    except (ValueError, OSError) as exc:
        raise SystemExit(f"relaygen calibrate: {exc}") from exc
    return rule, costs


def _run_verified(args, engine, traces, proposed, margins, verified, console) -> dict[str, object]:  # type: ignore[no-untyped-def]
    from rich.progress import Progress

    from ..calibrate.verified import plot_verified, run_trials, verified_calibrate, verified_profile_entry

    rule, costs = verified
    runners = engine.backend.runners
    with Progress(console=console) as progress:
        task = progress.add_task("small sentences, large-model verdicts", total=None)

        def run(positions: dict[int, set[int]]) -> dict:
            progress.update(task, total=sum(len(p) for p in positions.values()))
            advance = lambda n: progress.advance(task, n)  # noqa: E731
            return run_trials(traces, positions, runners["small"], runners["large"], engine.tokenizer, rule,
                              engine.eos_ids, args.max_sentence_tokens, advance)  # fmt: skip

        result = verified_calibrate(
            traces, engine.tokenizer, list(dict.fromkeys([*PAPER_CANDIDATES, *proposed])), run, costs, rule,
            margins, args.min_occurrences, args.min_traces,
        )  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)  # the profile is written after this, the plot first
    plot_verified(args.out.with_name(args.out.stem + "-verified.png"), result)
    table = Table(title=f"verified calibration ({result.rule}; ms per small token {costs.small_token_ms:.0f}, "
                  f"per baseline token {costs.baseline_token_ms:.0f})")  # fmt: skip
    for column in (
        "cue",
        "occurrences",
        "written",
        "kept",
        "rejected",
        "ms saved / occurrence",
        "margin Δ",
        "selected",
    ):
        table.add_column(column)
    for row in result.table:
        if row.written:
            table.add_row(repr(row.cue), str(row.occurrences), str(row.written), str(row.kept),
                          f"{row.rejected_share:.0%}", f"{row.saved_ms_per_occurrence:+.0f}",
                          "" if row.delta is None else f"{row.delta:+.3f}", "✓" if row.selected else "")  # fmt: skip
    console.print(table)
    sources = {"costs": str(args.costs), "pass_cost": str(args.pass_cost), "dtype": args.dtype}
    return {"verified": verified_profile_entry(result, sources), "selected_cues": result.selected}
