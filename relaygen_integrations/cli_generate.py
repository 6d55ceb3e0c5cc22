"""`relaygen generate` and `relaygen demo`: stream a relay generation, coloured by model, then a stats line."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console

from .engine.settings import MODES
from .prompts import gsm8k_reference_answer, load_gsm8k, math_messages


def _add_engine_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--large", default="demo", help="known pair name, hub id or local dir (default: demo)")
    parser.add_argument("--small", default="demo", help="known pair name, hub id or local dir (default: demo)")
    parser.add_argument("--cues", default="auto", help="auto | qwen3 | r1 | generic | none | comma list | profile.json")
    parser.add_argument("--dtype", default="auto", help="auto (bf16) | bf16 | fp32")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--mode", default="relay", choices=list(MODES))
    parser.add_argument("--max-new-tokens", type=int, default=512)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=None)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--stop", action="append", default=None, help="stop sequence (repeatable)")
    parser.add_argument(
        "--speculative",
        nargs="?",
        const=True,
        default=False,
        type=int,
        metavar="K",
        help="the small model drafts for the large model's tokens (lossless); optional maximum draft length K",
    )
    parser.add_argument(
        "--verify",
        default=None,
        metavar="RULE",
        help="verified relay: the large model checks the small model's tokens and rewrites from the first it rejects "
        "(greedy | prob:TAU | ratio:TAU, optionally +answer; default off)",
    )
    parser.add_argument("--json", action="store_true", help="print {text, spans, usage, finish_reason} as JSON")


def add_generate_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("generate", help="relay-generate an answer to a prompt")
    parser.add_argument("prompt", help="the user message")
    parser.add_argument("--system", default=None, help="optional system message")
    _add_engine_options(parser)
    parser.set_defaults(func=run_generate)


def add_demo_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("demo", help="relay-generate the answer to a GSM8K question, coloured by model")
    parser.add_argument("--data", type=Path, default=None, help="GSM8K jsonl (default: five shipped test problems)")
    parser.add_argument("--index", type=int, default=0, help="which problem")
    _add_engine_options(parser)
    parser.set_defaults(func=run_demo)


def _cues_arg(value: str) -> str | list[str]:
    return [c for c in value.split(",") if c] if "," in value and not value.endswith(".json") else value


def _run(args: argparse.Namespace, messages: list[dict[str, str]], console: Console) -> int:
    # Heavy imports (torch, transformers) only once a command really runs: `relaygen models ...` stays instant.
    from transformers.utils import logging as hf_logging

    from .engine import RelayEngine
    from .engine.settings import merge_settings
    from .render import legend, print_stream, stats_line

    hf_logging.disable_progress_bar()  # the per-tensor "Loading weights" bars would drown the coloured answer

    with console.status("loading the model pair (first use fetches it) ..."):
        engine = RelayEngine.shared(args.large, args.small, device=args.device, dtype=args.dtype)
    settings = merge_settings(
        {
            "max_new_tokens": args.max_new_tokens, "temperature": args.temperature, "top_p": args.top_p,
            "top_k": args.top_k, "seed": args.seed, "stop": args.stop, "mode": args.mode,
            "speculative": args.speculative, "cues": _cues_arg(args.cues), "verify": args.verify,
        }
    )  # fmt: skip
    if args.json:
        result = engine.generate(messages, settings=settings)
        print(json.dumps(result.to_dict(), ensure_ascii=False, indent=2))
        return 0
    console.print(legend(engine.large_name, engine.small_name))
    result = print_stream(engine.stream(messages, settings=settings), console)
    console.print(stats_line(result), soft_wrap=True)
    return 0


def run_generate(args: argparse.Namespace) -> int:
    console = Console(stderr=args.json)
    messages = ([{"role": "system", "content": args.system}] if args.system else []) + [
        {"role": "user", "content": args.prompt}
    ]
    return _run(args, messages, console)


def run_demo(args: argparse.Namespace) -> int:
    console = Console(stderr=args.json)
    records = load_gsm8k(args.data)
    if not 0 <= args.index < len(records):
        console.print(f"[red]--index {args.index} is out of range: the data has {len(records)} problems[/red]")
        return 2
    record = records[args.index]
    if not args.json:
        console.rule("GSM8K question")
        console.print(record["question"], highlight=False)
        console.rule(f"relay answer (reference: {gsm8k_reference_answer(record)})")
    code = _run(args, math_messages(record["question"]), console)
    sys.stdout.flush()
    return code
