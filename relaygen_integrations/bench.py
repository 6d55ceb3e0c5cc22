"""Benchmark harness: speed, small-model share, ideal vs measured speed-up and accuracy, all modes in one run.

Modes run on the same prompts with the same sampling, interleaved per problem (with the order rotated) so machine
drift hits every mode alike. Outputs: ``results.json`` (every run), ``report.md`` (table + machine),
``speed_accuracy.png`` and ``traces.html`` (relay answers coloured by model, trigger and tokens on hover).
"""

from __future__ import annotations

import html
import json
import os
import platform
import re
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, Field
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .engine.engine import GenerationError, RelayEngine
from .engine.settings import merge_settings
from .prompts import MATH_SYSTEM_PROMPT, gsm8k_reference_answer, load_gsm8k, math_messages

RELAY_MODES = ("relay", "reprompt", "relay-spec")


def is_relay_mode(mode: str) -> bool:
    """``relay`` and ``reprompt``, also with a cue set: ``relay@generic``, ``relay@all-candidates``."""
    return mode.split("@", 1)[0] in RELAY_MODES


class BenchConfig(BaseModel):
    data: Path | None = None
    n: int = Field(20, ge=1)
    modes: list[str] = Field(default_factory=lambda: ["large", "small", "relay", "reprompt", "hf-large", "assisted"])
    large: str = "demo"
    small: str = "demo"
    cues: str | list[str] = "auto"
    dtype: str = "bf16"
    max_new_tokens: int = Field(768, ge=1)
    temperature: float = 0.0
    seed: int | None = 0
    out: Path = Path("benchmarks/results/latest")
    resume: bool = False  # keep the complete problems of a saved run in ``out`` and run only the missing ones


@dataclass
class Run:
    """One mode on one problem."""

    problem: int
    mode: str
    seconds: float
    completion_tokens: int
    finish_reason: str
    text: str
    predicted: str | None
    reference: str
    correct: bool
    small_tokens: int = 0
    switches: int = 0
    catchup_tokens: int = 0
    speculative_rounds: int = 0
    draft_tokens: int = 0
    accepted_draft_tokens: int = 0
    large_forward_seconds: float = 0.0  # time inside each model's forward passes (engine modes only)
    small_forward_seconds: float = 0.0
    spans: list[dict[str, Any]] = field(default_factory=list)


# -- grading ---------------------------------------------------------------------------------------------------------
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def _last_boxed(text: str) -> str | None:
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 1, start + len("\\boxed{")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j]
    return text[i:]


def extract_answer(text: str) -> str | None:
    """The final number: the last ``\\boxed{}``, else what follows "####", else the last number in the text."""
    for candidate in (_last_boxed(text), text.rsplit("####", 1)[1] if "####" in text else None, text):
        if candidate:
            numbers = _NUMBER.findall(candidate)
            if numbers:
                return numbers[-1 if candidate is text else 0].replace(",", "")
    return None


def answers_match(predicted: str | None, reference: str) -> bool:
    if predicted is None:
        return False
    try:
        return abs(float(predicted) - float(reference.replace(",", ""))) < 1e-6
    except ValueError:
        return False


# -- modes -------------------------------------------------------------------------------------------------------------
ModeFn = Callable[[list[dict[str, str]]], tuple[str, int, str, dict[str, Any]]]


def make_modes(engine: RelayEngine, config: BenchConfig) -> dict[str, ModeFn]:
    """Every mode maps messages -> (text, completion tokens, finish reason, relay details)."""
    common = {"max_new_tokens": config.max_new_tokens, "temperature": config.temperature, "seed": config.seed}

    def through_engine(mode: str, **extra: Any) -> ModeFn:
        settings = merge_settings(common, {"mode": mode}, extra)  # a bad mode or cue spec fails before any problem

        def run(messages: list[dict[str, str]]) -> tuple[str, int, str, dict[str, Any]]:
            result = engine.generate(messages, settings=settings)
            usage = result.usage
            details = {
                "small_tokens": usage.small_tokens,
                "switches": usage.switches,
                "catchup_tokens": usage.large_catchup_tokens + usage.small_catchup_tokens,
                "speculative_rounds": usage.speculative_rounds,
                "draft_tokens": usage.draft_tokens,
                "accepted_draft_tokens": usage.accepted_draft_tokens,
                "large_forward_seconds": usage.large_forward_seconds,
                "small_forward_seconds": usage.small_forward_seconds,
                "spans": [s.to_dict() for s in result.spans],
            }
            return result.text, usage.completion_tokens, result.finish_reason, details

        return run

    def hf(assistant: bool) -> ModeFn:
        # transformers' own generate needs the weights in this process: a remote backend says so here.
        large = engine.backend.local_model("large")
        small = engine.backend.local_model("small") if assistant else None

        def run(messages: list[dict[str, str]]) -> tuple[str, int, str, dict[str, Any]]:
            prompt = torch.tensor([engine.encode_messages(messages)], device=large.device)
            kwargs: dict[str, Any] = {"max_new_tokens": config.max_new_tokens, "eos_token_id": sorted(engine.eos_ids)}
            if config.temperature > 0:
                kwargs.update(do_sample=True, temperature=config.temperature)
            else:
                kwargs.update(do_sample=False)
            if small is not None:
                kwargs["assistant_model"] = small
            with torch.inference_mode():
                output = large.generate(prompt, **kwargs)[0, prompt.shape[1] :].tolist()
            ended = bool(output) and output[-1] in engine.eos_ids
            ids = output[:-1] if ended else output
            return engine.tokenizer.decode(ids), len(ids), "stop" if ended else "length", {}

        return run

    # Built only for the modes the run uses: "hf-large"/"assisted" need the weights in this process.
    builders: dict[str, Callable[[], ModeFn]] = {
        "large": lambda: through_engine("large"),
        "small": lambda: through_engine("small"),
        "relay": lambda: through_engine("relay"),
        "reprompt": lambda: through_engine("relay", reprefill_segments=True),
        # Self-speculative: the small model drafts for the large model's tokens (lossless; adaptive draft length).
        "relay-spec": lambda: through_engine("relay", speculative=True),
        "large-spec": lambda: through_engine("large", speculative=True),
        "hf-large": lambda: hf(assistant=False),
        "assisted": lambda: hf(assistant=True),
    }
    modes: dict[str, ModeFn] = {}
    for name in config.modes:
        # "relay@<cues>" / "reprompt@<cues>": the same mode with another cue set (preset, "all-candidates", profile
        # path), so cue sets are compared on one loaded pair in one interleaved run.
        base, _, cues = name.partition("@")
        if cues and base in RELAY_MODES:
            try:
                engine.plan([0], cues=cues)  # validates the cue spec before any problem runs
            except GenerationError as exc:
                raise ValueError(f"benchmark mode {name!r}: {exc}") from exc
            modes[name] = through_engine("relay", reprefill_segments=base == "reprompt", cues=cues)
        elif name in builders:
            modes[name] = builders[name]()
    return modes


# -- the run ----------------------------------------------------------------------------------------------------
def run_benchmark(config: BenchConfig, console: Console | None = None, engine: RelayEngine | None = None) -> dict:
    console = console or Console()
    records = load_gsm8k(config.data)[: config.n]
    if not records:
        raise ValueError(f"no problems to run in {config.data}")
    engine = engine or RelayEngine.from_pretrained(config.large, config.small, cues=config.cues, dtype=config.dtype)
    modes = make_modes(engine, config)
    unknown = [m for m in config.modes if m not in modes]
    if unknown:
        raise ValueError(f"unknown benchmark modes {unknown}; known: {sorted(modes)}")
    runs, saved_modes = load_completed_runs(config) if config.resume else ([], [])
    done = {r.problem for r in runs}
    report_modes = list(dict.fromkeys([*saved_modes, *config.modes]))
    report: dict[str, Any] = make_report(config, runs, report_modes) if runs else {}
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("benchmark", total=len(records) * len(config.modes))
        progress.advance(task, sum(r.mode in config.modes for r in runs))
        for index, record in enumerate(records):
            if index in done:
                continue
            messages = math_messages(record["question"])
            reference = gsm8k_reference_answer(record)
            shift = index % len(config.modes)
            for mode in config.modes[shift:] + config.modes[:shift]:  # rotate so no mode always runs first
                progress.update(task, description=f"problem {index + 1}/{len(records)} · {mode}")
                start = time.perf_counter()
                text, tokens, finish, details = modes[mode](messages)
                seconds = time.perf_counter() - start
                predicted = extract_answer(text)
                run = Run(index, mode, seconds, tokens, finish, text, predicted, reference,
                          answers_match(predicted, reference), **details)  # fmt: skip
                runs.append(run)
                progress.console.print(
                    f"[dim]#{index + 1:<3}[/dim] {mode:<9} {seconds:6.1f} s {tokens:4d} tok "
                    f"{'✓' if run.correct else '✗'} pred={predicted} ref={reference} finish={finish}"
                )
                progress.advance(task)
            # Outputs are rewritten after every problem: an interrupted run keeps everything it measured.
            report = make_report(config, runs, report_modes)
            write_outputs(report, config.out)
    return report


def load_completed_runs(config: BenchConfig) -> tuple[list[Run], list[str]]:
    """The runs of problems a saved run in ``config.out`` finished in every one of ``config.modes`` (a problem is
    the unit that runs interleaved, so a half-finished one is run again whole), and the saved run's modes. The other
    settings must match; the mode list may shrink (e.g. to drop a slow baseline once it has enough problems) — the
    saved runs of dropped modes stay in the report with the problems they have."""
    path = config.out / "results.json"
    if not path.exists():
        return [], []
    saved = json.loads(path.read_text())
    ignored = {"n", "resume", "out", "modes"}
    old = {k: v for k, v in saved["config"].items() if k not in ignored}
    new = {k: v for k, v in json.loads(config.model_dump_json()).items() if k not in ignored}
    if old != new:
        changed = sorted(k for k in new if old.get(k) != new[k])
        raise ValueError(f"cannot resume {path}: its settings differ in {changed}")
    runs = [Run(**run) for run in saved["runs"]]
    complete = {p for p in {r.problem for r in runs} if {r.mode for r in runs if r.problem == p} >= set(config.modes)}
    return [r for r in runs if r.problem in complete and r.problem < config.n], list(saved["config"]["modes"])


def make_report(config: BenchConfig, runs: list[Run], modes: list[str] | None = None) -> dict[str, Any]:
    modes = [m for m in (modes or config.modes) if any(r.mode == m for r in runs)]
    summary = summarize(runs, modes)
    return {
        "config": json.loads(config.model_dump_json()) | {"modes": modes},
        "machine": machine_info(config),
        "summary": summary,
        "problems_done": len({r.problem for r in runs}),
        "runs": [asdict(r) for r in runs],
    }


def summarize(runs: list[Run], modes: list[str]) -> dict[str, dict[str, Any]]:
    by_mode = {m: [r for r in runs if r.mode == m] for m in modes}
    summary: dict[str, dict[str, Any]] = {}
    for mode, mode_runs in by_mode.items():
        seconds = [r.seconds for r in mode_runs]
        tokens = sum(r.completion_tokens for r in mode_runs)
        summary[mode] = {
            "n": len(mode_runs),
            "accuracy": sum(r.correct for r in mode_runs) / len(mode_runs),
            "mean_s": statistics.mean(seconds),
            "median_s": statistics.median(seconds),
            "mean_tokens": tokens / len(mode_runs),
            "tok_per_s": tokens / sum(seconds) if sum(seconds) else 0.0,
            "s_per_token": sum(seconds) / tokens if tokens else 0.0,
            "cap_hits": sum(r.finish_reason == "length" for r in mode_runs),
        }
    large, small = summary.get("large"), summary.get("small")
    r = small["s_per_token"] / large["s_per_token"] if large and small and large["s_per_token"] else None
    for mode in summary:
        if not is_relay_mode(mode):
            continue
        mode_runs, entry = by_mode[mode], summary[mode]
        total = sum(x.completion_tokens for x in mode_runs)
        f = sum(x.small_tokens for x in mode_runs) / total if total else 0.0
        entry.update(
            small_share=f,
            switches_per_problem=sum(x.switches for x in mode_runs) / len(mode_runs),
            catchup_tokens_per_problem=sum(x.catchup_tokens for x in mode_runs) / len(mode_runs),
        )
        if r is not None and large is not None:
            ideal = 1.0 / ((1 - f) + f * r)
            measured = large["s_per_token"] / entry["s_per_token"] if entry["s_per_token"] else 0.0
            entry.update(r=r, ideal_speedup=ideal, measured_speedup=measured, efficiency=measured / ideal)
    for mode, entry in summary.items():
        mode_runs = by_mode[mode]
        rounds = sum(x.speculative_rounds for x in mode_runs)
        drafted = sum(x.draft_tokens for x in mode_runs)
        if drafted:
            entry.update(
                acceptance_rate=sum(x.accepted_draft_tokens for x in mode_runs) / drafted,
                mean_draft_length=drafted / rounds,
            )
        large_forward = sum(x.large_forward_seconds for x in mode_runs)
        small_forward = sum(x.small_forward_seconds for x in mode_runs)
        tokens = sum(x.completion_tokens for x in mode_runs)
        if (large_forward or small_forward) and tokens:
            # Where the time goes, per generated token: inside the large model, inside the small one, and the rest
            # (sampling, detokenizing, policy, Python). Speculation adds the verify-pass cost per large forward.
            entry.update(
                large_forward_ms_per_token=1000 * large_forward / tokens,
                small_forward_ms_per_token=1000 * small_forward / tokens,
                other_ms_per_token=1000 * (sum(x.seconds for x in mode_runs) - large_forward - small_forward) / tokens,
            )
            if rounds and drafted:
                entry.update(
                    ms_per_verify_pass=1000 * large_forward / rounds,
                    # Every drafted token and every token the small model writes itself costs it one decode step.
                    ms_per_small_token=1000 * small_forward / (drafted + sum(x.small_tokens for x in mode_runs)),
                    tokens_per_verify_pass=sum(x.completion_tokens - x.small_tokens for x in mode_runs) / rounds,
                )
    if large is not None:
        large_by_problem = {r.problem: r for r in by_mode["large"]}
        for mode, entry in summary.items():
            entry["speedup_vs_large"] = large["s_per_token"] / entry["s_per_token"] if entry["s_per_token"] else 0.0
            # Robust to a few disturbed runs (another process on the machine): the median over problems of the
            # per-problem ratio of seconds per token, each pair measured minutes apart on the same problem.
            ratios = [
                (large_by_problem[r.problem].seconds / large_by_problem[r.problem].completion_tokens)
                / (r.seconds / r.completion_tokens)
                for r in by_mode[mode]
                if r.problem in large_by_problem
                and r.completion_tokens
                and large_by_problem[r.problem].completion_tokens
            ]
            entry["median_speedup_vs_large"] = statistics.median(ratios) if ratios else 0.0
    return summary


def rerender(out: Path) -> dict[str, Any]:
    """Recomputes the summary, report, plot and traces page from a saved ``results.json`` (e.g. after a change to
    the summary, or for a run that was interrupted)."""
    saved = json.loads((out / "results.json").read_text())
    config = BenchConfig(**saved["config"])
    runs = [Run(**run) for run in saved["runs"]]
    report = make_report(config, runs)
    report["machine"] = saved["machine"]  # the machine that measured, not the one re-rendering
    write_outputs(report, out)
    return report


def machine_info(config: BenchConfig) -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as info:
            cpu = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), cpu)
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "threads": torch.get_num_threads(), "torch": torch.__version__,
            "dtype": config.dtype, "device": "cuda" if torch.cuda.is_available() else "cpu"}  # fmt: skip


# -- outputs ----------------------------------------------------------------------------------------------------
def write_outputs(report: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(report, indent=2, ensure_ascii=False))
    (out / "report.md").write_text(render_markdown(report))
    (out / "traces.html").write_text(render_traces(report))
    plot_speed_accuracy(report, out / "speed_accuracy.png")


def render_markdown(report: dict[str, Any]) -> str:
    config, machine, summary = report["config"], report["machine"], report["summary"]
    lines = [
        f"# Benchmark: {config['large']} + {config['small']} on GSM8K ({summary[next(iter(summary))]['n']} problems)",
        "",
        f"Machine: {machine['cpu']}, {machine['cores']} cores, {machine['threads']} torch threads, torch "
        f"{machine['torch']}, {machine['dtype']} on {machine['device']}. "
        f"{'Greedy' if not config['temperature'] else 'T=' + str(config['temperature'])}, "
        f"max {config['max_new_tokens']}"
        f' new tokens, cues `{config["cues"]}`. System prompt: "{MATH_SYSTEM_PROMPT}"',
        "",
        "| mode | accuracy | mean s | median s | mean tokens | tok/s | speed-up vs large | median speed-up | cap hits"
        " | f | switches | ideal | efficiency | drafts accepted |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for mode, s in summary.items():
        cells = [
            mode, f"{s['accuracy']:.0%}", f"{s['mean_s']:.1f}", f"{s['median_s']:.1f}", f"{s['mean_tokens']:.0f}",
            f"{s['tok_per_s']:.2f}", f"{s.get('speedup_vs_large', 0):.2f}×",
            f"{s.get('median_speedup_vs_large', 0):.2f}×", str(s["cap_hits"]),
        ]  # fmt: skip
        cells += [f"{s['small_share']:.2f}", f"{s['switches_per_problem']:.1f}"] if "small_share" in s else ["", ""]
        cells += [f"{s['ideal_speedup']:.2f}×", f"{s['efficiency']:.2f}"] if "ideal_speedup" in s else ["", ""]
        if "acceptance_rate" in s:
            cells.append(f"{s['acceptance_rate']:.0%} (mean k {s['mean_draft_length']:.1f})")
        else:
            cells.append("")
        lines.append("| " + " | ".join(cells) + " |")
    if "relay" in summary and "r" in summary["relay"]:
        lines += ["", f"r (small/large cost per token, measured in this run) = {summary['relay']['r']:.3f}; "
                  "ideal speed-up = 1/((1−f)+f·r); speed-ups compare seconds per token."]  # fmt: skip
    split = {mode: s for mode, s in summary.items() if "large_forward_ms_per_token" in s}
    if split:
        lines += [
            "",
            "Where the time goes, per generated token (ms): inside the large model's forward passes, inside the small"
            " model's, and the rest (sampling, detokenizing, policy, Python). Speculative modes: cost of one verify"
            " pass, of one small-model token (drafted, or written in its own segment), and large-model tokens gained"
            " per verify pass.",
            "",
            "| mode | large fwd | small fwd | other | total | ms per verify pass | ms per small-model token"
            " | large tokens per verify pass |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for mode, s in split.items():
            total = s["large_forward_ms_per_token"] + s["small_forward_ms_per_token"] + s["other_ms_per_token"]
            cells = [mode, f"{s['large_forward_ms_per_token']:.0f}", f"{s['small_forward_ms_per_token']:.0f}",
                     f"{s['other_ms_per_token']:.0f}", f"{total:.0f}"]  # fmt: skip
            if "ms_per_verify_pass" in s:
                cells += [f"{s['ms_per_verify_pass']:.0f}", f"{s['ms_per_small_token']:.0f}",
                          f"{s['tokens_per_verify_pass']:.2f}"]  # fmt: skip
            else:
                cells += ["", "", ""]
            lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "![speed vs accuracy](speed_accuracy.png)", ""]
    return "\n".join(lines)


def render_traces(report: dict[str, Any]) -> str:
    parts = [
        "<!doctype html><meta charset='utf-8'><title>relay traces</title>",
        "<style>body{font:14px/1.5 system-ui;max-width:60em;margin:2em auto}pre{white-space:pre-wrap}"
        "span.large{color:#1f6feb}span.small{color:#c026d3;background:#fdf4ff}</style>",
        "<h1>Relay traces</h1><p><span class='large'>large model</span> · <span class='small'>small model</span>"
        " — hover a span for its trigger and token count.</p>",
    ]
    for run in report["runs"]:
        if not is_relay_mode(run["mode"]):
            continue
        verdict = "✓" if run["correct"] else "✗"
        heading = (
            f"#{run['problem'] + 1} {run['mode']} {verdict} (pred {run['predicted']}, ref {run['reference']}, "
            f"{run['completion_tokens']} tokens, {run['seconds']:.1f} s)"
        )
        parts.append(f"<h2>{html.escape(heading)}</h2><pre>")
        for span in run["spans"]:
            title = html.escape(f"{span['model']} · {span['trigger']} · {span['token_count']} tokens")
            parts.append(f"<span class='{span['model']}' title='{title}'>{html.escape(span['text'])}</span>")
        parts.append("</pre>")
    return "".join(parts)


def plot_speed_accuracy(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = report["summary"]
    fig, ax = plt.subplots(figsize=(6, 4))
    for mode, s in summary.items():
        ax.scatter(s["mean_s"], s["accuracy"] * 100, s=60)
        ax.annotate(mode, (s["mean_s"], s["accuracy"] * 100), textcoords="offset points", xytext=(5, 5))
    ax.set_xlabel("mean seconds per problem")
    ax.set_ylabel("accuracy (%)")
    ax.set_title(
        f"GSM8K, {report['config']['large']} + {report['config']['small']}, n={summary[next(iter(summary))]['n']}"
    )
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
