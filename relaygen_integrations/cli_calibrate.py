"""`relaygen calibrate`: find a model pair's switch cues from data and write a profile."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console
from rich.progress import track
from rich.table import Table


def add_calibrate_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("calibrate", help="calibrate switch cues for a model pair (probability-margin test)")
    parser.add_argument("--large", default="demo")
    parser.add_argument("--small", default="demo")
    parser.add_argument("--data", type=Path, required=True, help="GSM8K-style jsonl (use a train split)")
    parser.add_argument("--n", type=int, default=40, help="problems to trace")
    parser.add_argument("--max-new-tokens", type=int, default=512)
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--traces", type=Path, default=None, help="reuse (or, if missing, save) traces here")
    parser.add_argument("--threshold", type=float, default=0.0, help="select cues with delta above this")
    parser.add_argument("--min-occurrences", type=int, default=3)
    parser.add_argument("--min-traces", type=int, default=3, help="distinct traces a selected cue must occur in")
    parser.add_argument("--no-propose", action="store_true", help="score only the paper's candidate list")
    parser.add_argument("--out", type=Path, required=True, help="profile JSON to write (a PNG is written beside it)")
    parser.set_defaults(func=run_calibrate)


def run_calibrate(args: argparse.Namespace) -> int:
    from transformers.utils import logging as hf_logging

    from .engine import RelayEngine
    from .engine.calibrate import (
        Trace,
        calibrate,
        plot_margins,
        tokenizer_hash,
        trace_candidates,
        write_profile,
    )
    from .engine.cues import PAPER_CANDIDATES
    from .prompts import load_gsm8k, math_messages

    hf_logging.disable_progress_bar()
    console = Console()
    engine = RelayEngine.from_pretrained(args.large, args.small, cues="none", dtype=args.dtype)
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
    write_profile(args.out, result, pair, settings)
    plot_margins(args.out.with_suffix(".png"), result)

    table = Table(title=f"cue calibration (overall mean margin {result.overall_mean_margin:.3f})")
    for column in ("cue", "source", "occurrences", "traces", "tokens", "mean margin", "delta", "selected"):
        table.add_column(column)
    for row in result.table:
        if row.occurrences:
            table.add_row(repr(row.cue), row.source, str(row.occurrences), str(row.traces), str(row.tokens),
                          f"{row.mean_margin:.3f}", f"{row.delta:+.3f}", "✓" if row.selected else "")  # fmt: skip
    console.print(table)
    console.print(f"selected {len(result.selected)} cues: {result.selected}\nwrote {args.out}")
    return 0
