"""`relaygen generate` and `relaygen demo`: stream a generation (the pair's default mode, or ``--mode``), coloured by
model, then a stats line; the demo also runs the large model alone on the same question and compares answers and
the time to the answer."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from ..engine.core.settings import GenerationSettings, merge_settings
from ..engine.core.spans import MODES, RelayResult
from ..prompts import answers_match, extract_answer, gsm8k_reference_answer, load_gsm8k, math_messages
from .render import comparison_table, legend, print_stream, speedup_sentence, stats_line

if TYPE_CHECKING:
    from ..engine import RelayEngine


def _add_engine_options(parser: argparse.ArgumentParser) -> None:
    # The setting flags stay hand-written, unlike the adapters' and the server's fields (built from
    # GenerationSettings): a flag has a command's own default (512 tokens here, "auto" cues), argparse forms
    # GenerationSettings does not describe (--speculative with an optional K, a repeatable --stop, a comma list of
    # cues) and help text for a terminal. Their values still go through merge_settings, which checks every one.
    parser.add_argument("--large", default="demo", help="known pair name, hub id or local dir (default: demo)")
    parser.add_argument("--small", default="demo", help="known pair name, hub id or local dir (default: demo)")
    parser.add_argument("--cues", default="auto", help="auto | qwen3 | r1 | generic | none | comma list | profile.json")
    parser.add_argument(
        "--dtype",
        default="auto",
        help="auto (the pair's shipped formats, else bf16) | fast (int8 on a CPU, bf16 on CUDA) | bf16 | fp32 | int8 "
        "| gguf (CPU: the GGUF's own 4-bit weights)"
        " (CPU); LARGE/SMALL gives each model its own, e.g. bf16/int8",
    )
    parser.add_argument("--device", default="auto")
    parser.add_argument(
        "--compile",
        action="store_true",
        help="compile the one-token decode steps (static KV cache; GPU: CUDA graphs)",
    )
    parser.add_argument(
        "--mode", default=None, choices=list(MODES), help="who writes (default: the pair profile's choice, else relay)"
    )
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
        default=None,
        type=int,
        metavar="K",
        help="the small model drafts for the large model's tokens (lossless in exact arithmetic; in bf16/int8 a "
        "multi-position verify pass rounds differently, so texts can part at near-ties); optional maximum draft "
        "length K; 0 turns it off (default: the pair's shipped choice)",
    )
    parser.add_argument(
        "--draft-vocab",
        type=int,
        default=None,
        metavar="N",
        help="with --speculative: drafts score only the N most frequent tokens (+ special, prompt tokens); lossless "
        "in exact arithmetic, but in bf16/int8 other drafts split the verify passes differently, so texts can part",
    )
    parser.add_argument(
        "--verify",
        default=None,
        metavar="RULE",
        help="verified relay: the large model checks the small model's tokens and rewrites from the first it rejects "
        "(greedy | prob:TAU | ratio:TAU, optionally +answer, or off; default: the pair's shipped rule, if any)",
    )
    parser.add_argument("--json", action="store_true", help="print {text, spans, usage, finish_reason} as JSON")


def add_generate_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "generate", help="generate an answer to a prompt (the pair's default mode, or --mode relay)"
    )
    parser.add_argument("prompt", help="the user message")
    parser.add_argument("--system", default=None, help="optional system message")
    _add_engine_options(parser)
    parser.set_defaults(func=run_generate)


def add_demo_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "demo",
        help="a GSM8K question answered by the large model alone and by the pair's default (or --mode), coloured by "
        "model, compared",
    )
    parser.add_argument("--data", type=Path, default=None, help="GSM8K jsonl (default: five shipped test problems)")
    parser.add_argument("--index", type=int, default=0, help="which problem")
    parser.add_argument(
        "--no-compare",
        dest="compare",
        action="store_false",
        help="skip the large-model-alone run that relay is compared with",
    )
    _add_engine_options(parser)
    parser.set_defaults(func=run_demo)


def cues_arg(value: str) -> str | list[str]:
    """``--cues``: a preset, a profile path, or a comma-separated list of cues."""
    return [c for c in value.split(",") if c] if "," in value and not value.endswith(".json") else value


def _load(args: argparse.Namespace, console: Console) -> tuple[Any, GenerationSettings]:
    """The shared engine and the command's settings. Heavy imports (torch, transformers) only once a command really
    runs: ``relaygen models ...`` stays instant."""
    from transformers.utils import logging as hf_logging

    from ..engine import RelayEngine

    hf_logging.disable_progress_bar()  # the per-tensor "Loading weights" bars would drown the coloured answer
    # Settings first: a bad flag is an error before minutes of model loading.
    settings = merge_settings(
        {
            "max_new_tokens": args.max_new_tokens, "temperature": args.temperature, "top_p": args.top_p,
            "top_k": args.top_k, "seed": args.seed, "stop": args.stop, "mode": args.mode,
            "speculative": args.speculative, "cues": cues_arg(args.cues), "verify": args.verify,
            "draft_vocab": args.draft_vocab,
        }
    )  # fmt: skip
    with console.status("loading the model pair (first use fetches it) ..."):
        engine = RelayEngine.shared(args.large, args.small, device=args.device, dtype=args.dtype, compile=args.compile)
    if _small_bf16_on_cpu(engine):
        console.print(
            "[dim]the small model in bf16 on a CPU: --dtype bf16/int8 (the demo pair's default) makes its step about 2x"
            " cheaper; as a drafter its format changes no greedy answer (docs/benchmarks.md)[/dim]"
        )
    return engine, settings


def _small_bf16_on_cpu(engine: Any) -> bool:
    """Whether this engine's small model computes in bf16 on a CPU (where int8 was measured 2.3x faster per step;
    the large model stays bf16 by default: in int8 it lost problems, docs/benchmarks.md)."""
    import torch

    if engine.backend.kind != "local" or "small" not in engine.backend.roles:
        return False
    model = engine.backend.local_model("small")
    return getattr(model, "dtype", None) == torch.bfloat16 and model.device.type == "cpu"


def _show(engine: Any, messages: list[dict[str, str]], settings: GenerationSettings, console: Console) -> RelayResult:
    result = print_stream(engine.stream(messages, settings=settings), console)
    console.print(stats_line(result), soft_wrap=True)
    return result


def _run(args: argparse.Namespace, messages: list[dict[str, str]], console: Console) -> int:
    engine, settings = _load(args, console)
    if args.json:
        result = engine.generate(messages, settings=settings)
        print(json.dumps(result.to_dict(), ensure_ascii=False, indent=2))
        return 0
    console.print(legend(engine.large_name, engine.small_name))
    _show(engine, messages, settings, console)
    return 0


def run_generate(args: argparse.Namespace) -> int:
    console = Console(stderr=args.json)
    messages = ([{"role": "system", "content": args.system}] if args.system else []) + [
        {"role": "user", "content": args.prompt}
    ]
    return _run(args, messages, console)


def describe_mode(engine: RelayEngine, settings: GenerationSettings) -> str:
    """How a run's header names what ran: the mode (the request's or the engine's default), plus verification (the
    request's rule or the engine's default) and speculation when on."""
    mode = settings.mode or engine.mode
    parts = [mode]
    verify = engine.verify if settings.verify is None else settings.verify
    if mode == "relay" and verify:
        parts.append(f"verified ({verify.spec})")
    if engine.speculative if settings.speculative is None else settings.speculative:
        parts.append("self-speculative")
    return ", ".join(parts)


def run_demo(args: argparse.Namespace) -> int:
    """One GSM8K question, answered by the large model alone and then with the command's mode and settings (by default
    the pair's: for the demo pair the large model with the small one drafting): both answers, checked against the
    reference, and the time to the answer against the large model's."""
    console = Console(stderr=args.json)
    records = load_gsm8k(args.data)
    if not 0 <= args.index < len(records):
        console.print(f"[red]--index {args.index} is out of range: the data has {len(records)} problems[/red]")
        return 2
    record, reference = records[args.index], gsm8k_reference_answer(records[args.index])
    messages = math_messages(record["question"])
    engine, settings = _load(args, console)
    alone = settings.model_copy(update={"mode": "large", "verify": False, "speculative": False})
    runs = [("large alone", alone)] if args.compare else []
    speculates = engine.speculative if settings.speculative is None else settings.speculative
    if not (args.compare and (settings.mode or engine.mode) == "large" and not speculates):
        runs.append((describe_mode(engine, settings), settings))
    if args.json:
        results = {name: engine.generate(messages, settings=run) for name, run in runs}
        print(json.dumps(_demo_json(results, reference), ensure_ascii=False, indent=2))
        return 0
    console.rule("GSM8K question")
    console.print(record["question"], highlight=False)
    console.print(legend(engine.large_name, engine.small_name))
    if engine.configuration is not None and engine.configuration.source == "tuned":
        predicted = engine.configuration.predicted_speedup
        console.print(f"[dim]configuration tuned for this machine: {engine.configuration.candidate} (predicted "
                      f"{predicted:.2f}x the large model alone; relaygen tune --explain says why)[/dim]")  # fmt: skip
    shown: dict[str, RelayResult] = {}
    for name, run in runs:
        console.rule(f"{name} (reference answer: {reference})")
        shown[name] = _show(engine, messages, run, console)
    if len(shown) > 1:
        console.rule(f"{runs[-1][0]} against the large model alone on this question")
        console.print(comparison_table(shown, reference))
        console.print(speedup_sentence(shown), soft_wrap=True)
    sys.stdout.flush()
    return 0


def _demo_json(results: dict[str, RelayResult], reference: str) -> dict[str, Any]:
    runs = {}
    for name, result in results.items():
        answer = extract_answer(result.text)
        runs[name] = result.to_dict() | {"answer": answer, "correct": answers_match(answer, reference)}
    return {"reference": reference, "runs": runs}
