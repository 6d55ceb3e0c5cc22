"""`relaygen bench`: every mode side by side on GSM8K, in one interleaved run."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console


def add_bench_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("bench", help="benchmark relay against large/small/reprompt/hf-large/assisted")
    parser.add_argument("--data", type=Path, default=None, help="GSM8K jsonl (default: the five shipped problems)")
    parser.add_argument("--n", type=int, default=20, help="number of problems")
    parser.add_argument(
        "--modes",
        default="large,small,relay,reprompt,hf-large,assisted",
        help="comma-separated: large, small, relay, reprompt, relay-spec, large-spec, hf-large, assisted; a cue set as"
        " relay@<cues> / reprompt@<cues>; verified relay as relay+verify@<rule> / relay-spec+verify@<rule>, the rule"
        " greedy, prob:TAU or ratio:TAU, optionally +answer (e.g. relay+verify@prob:0.05); drafts copied from the"
        " context as large+lookup (alone) / large-spec+lookup (the small model's where none fits)",
    )
    parser.add_argument("--large", default="demo")
    parser.add_argument("--small", default="demo")
    parser.add_argument("--cues", default="auto")
    parser.add_argument(
        "--dtype",
        default="bf16",
        help="bf16 | fp32 | int8 (CPU: int8 linear layers) | gguf (CPU: the GGUF's 4-bit tensors as int4) | fast "
        "(int8 on a CPU) | auto (the pair's shipped formats); LARGE/SMALL gives each model its own (bf16/int8); "
        "a mode may name its own as MODE#FORMATS",
    )
    parser.add_argument("--kv-cache", choices=("auto", "dynamic", "static"), default="auto", help="KV cache layout")
    parser.add_argument("--compile", action="store_true", help="compile the one-token decode steps (static cache)")
    parser.add_argument(
        "--draft-vocab", type=int, default=None, metavar="N",
        help="speculative drafts score the N most frequent tokens only (+ special and prompt tokens); lossless in "
        "exact arithmetic (in bf16/int8 texts can part at near-ties)",
    )  # fmt: skip
    # Hand-written, not built from GenerationSettings: a benchmark fixes only what every mode shares (budget,
    # temperature, the draft vocabulary), with defaults of its own; the other settings (speculation, verify, cues,
    # reprefill) are what its modes differ in, so --modes names them (relay-spec, relay+verify@RULE, relay@CUES).
    parser.add_argument("--max-new-tokens", type=int, default=768)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/latest"))
    parser.add_argument("--quick", action="store_true", help="smoke test: 1 problem, 32 tokens, every mode")
    parser.add_argument("--resume", action="store_true", help="keep the finished problems of the run in --out")
    parser.add_argument(
        "--endpoints",
        nargs=2,
        metavar=("LARGE_URL", "SMALL_URL"),
        default=None,
        help="run over two OpenAI-compatible completion servers (e.g. http://127.0.0.1:8701/v1 ...); --large names "
        "their tokenizer (default: the demo pair's); engine modes only",
    )
    parser.add_argument(
        "--concurrency", type=int, default=1, help="requests in flight at once (remote: the servers batch them)"
    )
    parser.add_argument(
        "--rerender", type=Path, default=None, metavar="DIR", help="recompute the report of a saved run in DIR"
    )
    parser.add_argument(
        "--compare",
        nargs=2,
        type=Path,
        default=None,
        metavar=("DIR_A", "DIR_B"),
        help="compare one mode of two saved runs (e.g. int8 against bf16) on the problems both ran",
    )
    parser.add_argument(
        "--compare-mode",
        default="large",
        metavar="MODE[,MODE_B]",
        help="the mode to compare (default: large); MODE,MODE_B pairs MODE of DIR_A with MODE_B of DIR_B",
    )
    parser.set_defaults(func=run_bench)


def run_bench(args: argparse.Namespace) -> int:
    from ..bench.run import BenchConfig, rerender, run_benchmark

    console = Console()
    if args.compare is not None:
        from ..bench.compare import compare_saved

        mode_a, _, mode_b = args.compare_mode.partition(",")
        print(compare_saved(args.compare[0], args.compare[1], mode_a.strip(), mode_b.strip() or mode_a.strip()))
        return 0
    if args.rerender is not None:
        rerender(args.rerender)
        console.print((args.rerender / "report.md").read_text())
        return 0
    config = BenchConfig(
        data=args.data,
        n=1 if args.quick else args.n,
        modes=[m.strip() for m in args.modes.split(",") if m.strip()],
        large=args.large,
        small=args.small,
        cues=[c for c in args.cues.split(",") if c] if "," in args.cues else args.cues,
        dtype=args.dtype,
        kv_cache=args.kv_cache,
        compile=args.compile,
        draft_vocab=args.draft_vocab,
        max_new_tokens=32 if args.quick else args.max_new_tokens,
        temperature=args.temperature,
        out=args.out,
        resume=args.resume,
        endpoints=tuple(args.endpoints) if args.endpoints else None,
        concurrency=args.concurrency,
    )
    run_benchmark(config, console)
    console.print((config.out / "report.md").read_text())
    console.print(f"wrote {config.out}/results.json, report.md, speed_accuracy.png, traces.html")
    return 0
