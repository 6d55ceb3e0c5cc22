"""Benchmark harness: speed, small-model share, ideal vs measured speed-up and accuracy, all modes in one run.

Modes run on the same prompts with the same sampling, interleaved per problem (with the order rotated) so machine
drift hits every mode alike. This module holds the configuration, the modes, the run and resuming; the summary is in
``bench_summary``, the outputs (``results.json``, ``report.md``, ``speed_accuracy.png``, ``traces.html``) in
``bench_report``. Their public names are importable from here too.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, Field
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ..engine.core.configuration import pair_formats
from ..engine.core.pairs import known_pair
from ..engine.core.settings import merge_settings
from ..engine.engine import GenerationError, RelayEngine
from ..engine.local.cpu import cpu_model_and_flags, isa_limits
from ..engine.local.kv import CacheOptions, KVCacheKind
from ..engine.local.weights import pick_pair_weights
from ..prompts import answers_match as answers_match
from ..prompts import extract_answer as extract_answer
from ..prompts import gsm8k_reference_answer, load_gsm8k, math_messages
from .predicted import AUTO_MODES, auto_modes, machine_pass_costs, predicted_rows
from .report import plot_speed_accuracy as plot_speed_accuracy
from .report import render_markdown as render_markdown
from .report import render_traces as render_traces
from .report import write_outputs as write_outputs
from .summary import LOOKUP_MODES, LOOKUP_SUFFIX, split_format
from .summary import RELAY_MODES as RELAY_MODES
from .summary import VERIFY_MODES as VERIFY_MODES
from .summary import VERIFY_SUFFIX as VERIFY_SUFFIX
from .summary import Run as Run
from .summary import is_relay_mode as is_relay_mode
from .summary import is_verify_mode as is_verify_mode
from .summary import summarize as summarize


class BenchConfig(BaseModel):
    data: Path | None = None
    n: int = Field(20, ge=1)
    modes: list[str] = Field(default_factory=lambda: ["large", "small", "relay", "reprompt", "hf-large", "assisted"])
    large: str = "demo"
    small: str = "demo"
    cues: str | list[str] = "auto"
    dtype: str = "bf16"
    kv_cache: KVCacheKind = "auto"  # the engine's KV cache: dynamic (default), static; compile implies static
    compile: bool = False  # compiled one-token decode steps (engine/local/kv.py)
    draft_vocab: int | None = Field(
        None, ge=1
    )  # speculative drafts score this many tokens (engine/local/draft_head.py)
    max_new_tokens: int = Field(768, ge=1)
    temperature: float = 0.0
    seed: int | None = 0
    out: Path = Path("benchmarks/results/latest")
    resume: bool = False  # keep the complete problems of a saved run in ``out`` and run only the missing ones
    # Two completion servers (large, small base URLs) instead of local models; ``large`` then names the tokenizer.
    endpoints: tuple[str, str] | None = None
    # Requests in flight at once: problems run in groups of this size, each mode's group concurrently (a remote
    # backend's servers batch them); a run's ``seconds`` is then its group's wall time over the group's size.
    concurrency: int = Field(1, ge=1)


# -- grading ---------------------------------------------------------------------------------------------------------


# -- modes -------------------------------------------------------------------------------------------------------------
DEFAULT_MODE = "default"  # the engine's own configuration for the pair on this machine (what a user gets)
ModeFn = Callable[[list[dict[str, str]]], tuple[str, int, str, dict[str, Any]]]


def make_modes(engine: RelayEngine, config: BenchConfig) -> dict[str, ModeFn]:
    """Every mode maps messages -> (text, completion tokens, finish reason, relay details)."""
    common = {"max_new_tokens": config.max_new_tokens, "temperature": config.temperature, "seed": config.seed}

    def through_engine(mode: str | None, **extra: Any) -> ModeFn:
        # Unverified and unspeculated unless the mode says so, whatever the engine's defaults: "relay" is plain
        # RelayGen. ``None``: the engine's own defaults for the pair (mode "default", what a user gets).
        plain = {} if mode is None else {"mode": mode, "verify": "off", "speculative": False}
        settings = merge_settings(common, plain, extra)  # a bad mode fails up front

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
                "lookup_draft_tokens": usage.lookup_draft_tokens,
                "lookup_accepted_tokens": usage.lookup_accepted_tokens,
                "verified_tokens": usage.verified_tokens,
                "rejected_tokens": usage.rejected_tokens,
                "large_forward_seconds": usage.large_forward_seconds,
                "small_forward_seconds": usage.small_forward_seconds,
                "time_split": usage.time_split,
                "passes": {role: {str(k): n for k, n in by_k.items()} for role, by_k in usage.passes.items()},
                "pass_seconds": {
                    role: {str(k): round(t, 6) for k, t in by_k.items()} for role, by_k in usage.pass_seconds.items()
                },
                "prompt_tokens": usage.prompt_tokens,
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
        "default": lambda: through_engine(None),
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
        base, _, arg = name.partition("@")
        if base in LOOKUP_MODES:
            # "large+lookup[@N]": drafts copied from the context only; "large-spec+lookup[@N]": copied first, the
            # small model's where none fits (``engine/local/prompt_lookup.py``); N a draft vocabulary as above.
            if arg and not arg.isdigit():
                raise ValueError(f"benchmark mode {name!r}: {base} takes a draft vocabulary size, not {arg!r}")
            extra = {"draft_vocab": int(arg)} if arg else {}
            spec = base == "large-spec" + LOOKUP_SUFFIX
            modes[name] = through_engine("large", speculative=spec, prompt_lookup=True, **extra)
        elif base.endswith(VERIFY_SUFFIX) and base.removesuffix(VERIFY_SUFFIX) in VERIFY_MODES:
            # "relay+verify@<rule>" / "relay-spec+verify@<rule>": verified relay under a verify spec ("greedy",
            # "prob:0.05", "ratio:0.1+answer"), so rules are compared with plain relay in one interleaved run.
            speculative = base.removesuffix(VERIFY_SUFFIX) == "relay-spec"
            try:
                modes[name] = through_engine("relay", speculative=speculative, verify=arg)  # validates the rule
            except ValueError as exc:  # SettingsError
                raise ValueError(f"benchmark mode {name!r}: {exc}") from exc
        elif arg and base in ("relay-spec", "large-spec"):
            # "relay-spec@<N>" / "large-spec@<N>": drafts over a reduced vocabulary of N tokens (draft_vocab), so it
            # is compared with full-vocabulary drafts in one run; "relay-spec@<cues>": speculation with another cue set.
            extra: dict[str, Any] = {"draft_vocab": int(arg)} if arg.isdigit() else {"cues": arg}
            try:
                if base == "large-spec" and "cues" in extra:
                    raise GenerationError("large-spec takes a draft vocabulary size (large-spec@32768), not cues")
                engine.plan([0], **extra)  # validates the value before any problem runs
            except GenerationError as exc:
                raise ValueError(f"benchmark mode {name!r}: {exc}") from exc
            modes[name] = through_engine(base.removesuffix("-spec"), speculative=True, **extra)
        elif arg and base in RELAY_MODES:
            # "relay@<cues>" / "reprompt@<cues>": the same mode with another cue set (preset, "all-candidates",
            # profile path), so cue sets are compared on one loaded pair in one interleaved run.
            try:
                engine.plan([0], cues=arg)  # validates the cue spec before any problem runs
            except GenerationError as exc:
                raise ValueError(f"benchmark mode {name!r}: {exc}") from exc
            modes[name] = through_engine("relay", reprefill_segments=base == "reprompt", cues=arg)
        elif name in builders:
            modes[name] = builders[name]()
    return modes


def modes_over_formats(
    engine: RelayEngine, config: BenchConfig, configurations: dict[str, Any] | None = None
) -> dict[str, ModeFn]:
    """:func:`make_modes` for every mode, a mode named ``MODE#FORMATS`` (``large#int8``,
    ``large-spec#bf16/int8``) over the same pair loaded in those per-model formats: so formats are compared in one
    interleaved run (each distinct combination loaded once; one equal to the run's own reuses its engine). Mode
    ``default`` runs in an engine loaded with nothing given: the configuration a user gets on this machine (tuned,
    else the profile's), which it records in ``configurations``."""
    groups: dict[str | None, list[str]] = {}
    own = weights_name(config.dtype, config)
    for name in config.modes:
        formats = split_format(name)[1]
        if name == DEFAULT_MODE:
            # What a user gets: the engine's own configuration for this machine (tuned, or the profile's), whatever
            # the run's --dtype / --draft-vocab say, in an engine of its own.
            groups.setdefault(DEFAULT_MODE, []).append(name)
            continue
        try:  # a bad format fails here, before any weights load
            if formats is not None and weights_name(formats, config) == own:
                formats = None
        except ValueError as exc:
            raise ValueError(f"benchmark mode {name!r}: {exc}") from exc
        groups.setdefault(formats, []).append(name)
    modes: dict[str, ModeFn] = {}
    for formats, names in groups.items():
        if formats is not None and engine.backend.kind != "local":
            raise ValueError(f"benchmark modes {names}: a weight format per mode needs local models")
        if formats == DEFAULT_MODE:
            if engine.backend.kind != "local":
                modes[DEFAULT_MODE] = make_modes(engine, config.model_copy(update={"modes": names}))[DEFAULT_MODE]
                continue
            mode_engine = RelayEngine.from_pretrained(
                config.large, config.small, cues=config.cues, kv_cache=config.kv_cache, compile=config.compile
            )
        else:
            mode_engine = engine if formats is None else RelayEngine.from_pretrained(
                config.large, config.small, cues=config.cues, dtype=formats, kv_cache=config.kv_cache,
                compile=config.compile, draft_vocab=config.draft_vocab,
            )  # fmt: skip
        if formats == DEFAULT_MODE and mode_engine.configuration is not None and configurations is not None:
            configurations[DEFAULT_MODE] = mode_engine.configuration.describe()
        bases = list(dict.fromkeys(split_format(name)[0] for name in names))
        built = make_modes(mode_engine, config.model_copy(update={"modes": bases}))
        # "large" and "large#bfloat16" (the run's own formats) are one mode under two names: one function.
        modes |= {name: built[split_format(name)[0]] for name in names if split_format(name)[0] in built}
    return modes


# -- the run ----------------------------------------------------------------------------------------------------
def run_benchmark(config: BenchConfig, console: Console | None = None, engine: RelayEngine | None = None) -> dict:
    console = console or Console()
    records = load_gsm8k(config.data)[: config.n]
    if not records:
        raise ValueError(f"no problems to run in {config.data}")
    if engine is None and config.endpoints is not None:
        engine = RelayEngine.from_endpoints(*config.endpoints, tokenizer=config.large, cues=config.cues, timeout=600)
    engine = engine or RelayEngine.from_pretrained(
        config.large, config.small, cues=config.cues, dtype=config.dtype, kv_cache=config.kv_cache,
        compile=config.compile, draft_vocab=config.draft_vocab,
    )  # fmt: skip
    if AUTO_MODES in config.modes:  # the tuner's top candidates on this machine, beside large
        auto = auto_modes(config.large, config.small)
        expanded = [m for name in config.modes for m in (auto if name == AUTO_MODES else [name])]
        config = config.model_copy(update={"modes": list(dict.fromkeys(expanded))})
        console.print(f"--modes auto: {', '.join(config.modes)}")
    if config.concurrency > 1 and engine.backend.serialized:
        raise ValueError(f"concurrency={config.concurrency}: the {engine.backend.kind} backend runs one request at "
                         "a time; concurrent requests need a remote backend (endpoints)")  # fmt: skip
    configurations: dict[str, Any] = {}
    modes = modes_over_formats(engine, config, configurations)
    if configurations:
        console.print(f"default: {configurations[DEFAULT_MODE]}")
    unknown = [m for m in config.modes if m not in modes]
    if unknown:
        raise ValueError(f"unknown benchmark modes {unknown}; known: {sorted(modes)}")
    runs, saved_modes = load_completed_runs(config) if config.resume else ([], [])
    done = {(r.problem, r.mode) for r in runs}
    report_modes = list(dict.fromkeys([*saved_modes, *config.modes]))
    tuned = {"pass_costs": machine_pass_costs(config.large, config.small), "configurations": configurations}
    report: dict[str, Any] = make_report(config, runs, report_modes, tuned) if runs else {}
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("benchmark", total=len(records) * len(config.modes))
        progress.advance(task, sum(r.mode in config.modes for r in runs))
        size = config.concurrency
        for first in range(0, len(records), size):
            group = list(range(first, min(first + size, len(records))))
            shift = (first // size) % len(config.modes)
            rotated = config.modes[shift:] + config.modes[:shift]  # rotate so no mode always runs first
            for mode in rotated:
                todo = [index for index in group if (index, mode) not in done]
                if not todo:
                    continue
                label = f"problem {todo[0] + 1}" + (f"-{todo[-1] + 1}" if len(todo) > 1 else "")
                progress.update(task, description=f"{label}/{len(records)} · {mode}")
                for run in _run_group(modes[mode], mode, [(i, records[i]) for i in todo]):
                    runs.append(run)
                    progress.console.print(
                        f"[dim]#{run.problem + 1:<3}[/dim] {mode:<9} {run.seconds:6.1f} s {run.completion_tokens:4d}"
                        f" tok {'✓' if run.correct else '✗'} pred={run.predicted} ref={run.reference}"
                        f" finish={run.finish_reason}"
                    )
                    progress.advance(task)
                # Outputs are rewritten after every run: an interrupted benchmark keeps everything it measured.
                report = make_report(config, runs, report_modes, tuned)
                write_outputs(report, config.out)
    return report


def _run_group(mode_fn: ModeFn, mode: str, problems: list[tuple[int, dict[str, Any]]]) -> list[Run]:
    """One mode on a group of problems, all at once (one alone: just that run). Each run's ``seconds`` is the group's
    wall time over its size, so tokens over seconds summed is the group's throughput."""
    start = time.perf_counter()
    if len(problems) == 1:  # in this thread, as the local engine's sequential runs always were
        outputs = [mode_fn(math_messages(problems[0][1]["question"]))]
    else:
        with ThreadPoolExecutor(max_workers=len(problems)) as pool:
            outputs = list(pool.map(lambda item: mode_fn(math_messages(item[1]["question"])), problems))
    seconds = (time.perf_counter() - start) / len(problems)
    runs = []
    for (index, record), (text, tokens, finish, details) in zip(problems, outputs, strict=True):
        predicted, reference = extract_answer(text), gsm8k_reference_answer(record)
        runs.append(Run(index, mode, seconds, tokens, finish, text, predicted, reference,
                        answers_match(predicted, reference), **details))  # fmt: skip
    return runs


def load_completed_runs(config: BenchConfig) -> tuple[list[Run], list[str]]:
    """The finished runs of a saved run in ``config.out`` (a run is saved only once its generation ends, so an
    interrupted one is simply missing and runs again), and the saved run's modes. The other settings must match; the
    mode list may change: a dropped mode (e.g. a slow baseline with enough problems) keeps the problems it has in the
    report, and an added one runs on the saved problems too."""
    path = config.out / "results.json"
    if not path.exists():
        return [], []
    saved = json.loads(path.read_text())
    ignored = {"n", "resume", "out", "modes"}
    # Settings added since the run was saved count as their defaults (what the saved run used).
    old = {k: v for k, v in json.loads(BenchConfig(**saved["config"]).model_dump_json()).items() if k not in ignored}
    new = {k: v for k, v in json.loads(config.model_dump_json()).items() if k not in ignored}
    if old != new:
        changed = sorted(k for k in new if old.get(k) != new[k])
        raise ValueError(f"cannot resume {path}: its settings differ in {changed}")
    # Seconds are only comparable on one machine: a run resumed on another CPU (sessions change CPUs) would mix
    # them silently. Start a new --out there instead.
    here, there = machine_info(config), saved.get("machine", {})
    # Only what the saved run recorded (older runs lack flags and caps; a remote run has no dtype).
    differs = sorted(k for k in ("cpu", "cpu_flags", "isa_limits", "dtype") if k in there and there[k] != here.get(k))
    if differs:
        raise ValueError(f"cannot resume {path} on this machine: it was measured on {there.get('cpu')} and its "
                         f"{differs} differ here ({here['cpu']}); run into a new --out")  # fmt: skip
    runs = [Run(**run) for run in saved["runs"]]
    return [r for r in runs if r.problem < config.n], list(saved["config"]["modes"])


def make_report(
    config: BenchConfig, runs: list[Run], modes: list[str] | None = None, tuned: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The saved report. ``tuned``: this machine's pass costs (``pass_costs``) and the default's configuration
    (``configurations``), when the tuner measured this machine: each mode's predicted seconds per token is then
    reported beside the measured (``predicted.py``)."""
    modes = [m for m in (modes or config.modes) if any(r.mode == m for r in runs)]
    summary = summarize(runs, modes)
    report = {
        "config": json.loads(config.model_dump_json()) | {"modes": modes},
        "machine": machine_info(config),
        "summary": summary,
        "problems_done": len({r.problem for r in runs}),
        "runs": [asdict(r) for r in runs],
    }
    if tuned and tuned.get("pass_costs"):
        configurations = tuned.get("configurations") or {}
        formats = weights_name(config.dtype, config)
        report |= {
            "pass_costs": tuned["pass_costs"],
            "configurations": configurations,
            "predicted": predicted_rows(runs, modes, tuned["pass_costs"], formats, configurations),
        }
    return report


def rerender(out: Path) -> dict[str, Any]:
    """Recomputes the summary, report, plot and traces page from a saved ``results.json`` (e.g. after a change to
    the summary, or for a run that was interrupted)."""
    saved = json.loads((out / "results.json").read_text())
    config = BenchConfig(**saved["config"])
    runs = [Run(**run) for run in saved["runs"]]
    tuned = {key: saved[key] for key in ("pass_costs", "configurations") if key in saved}
    report = make_report(config, runs, tuned=tuned)
    report["machine"] = saved["machine"]  # the machine that measured, not the one re-rendering
    write_outputs(report, out)
    return report


def resolved_dtype(dtype: str, large: str = "", small: str = "") -> str:
    """What ran, one canonical name per combination (``bf16``, ``bf16/int8``): ``auto`` is the known pair's shipped
    formats for the device (else bf16), ``fast`` int8 on a CPU; the spec given follows in parentheses."""
    resolved = _canonical_weights(dtype, large, small)
    return resolved if resolved == dtype else f"{resolved} ({dtype})"


def weights_name(dtype: str, config: BenchConfig) -> str:
    """The canonical per-model formats ``dtype`` loads for the run's pair on this device (``bf16/int8``)."""
    return _canonical_weights(dtype, config.large, config.small)


def _canonical_weights(dtype: str, large: str, small: str) -> str:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return pick_pair_weights(pair_formats(known_pair(large, small), device.type, dtype), device).name


def machine_info(config: BenchConfig) -> dict[str, Any]:
    cpu, flags = cpu_model_and_flags()
    info = {"cpu": cpu, "cores": os.cpu_count(), "threads": torch.get_num_threads(), "torch": torch.__version__,
            "cpu_flags": list(flags), "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "dtype": resolved_dtype(config.dtype, config.large, config.small),
            "kv_cache": CacheOptions(kv_cache=config.kv_cache, compile=config.compile).label,
            "draft_vocab": config.draft_vocab or "full", "isa_limits": isa_limits(),
            "device": "cuda" if torch.cuda.is_available() else "cpu"}  # fmt: skip
    if config.endpoints is not None:
        # The servers' own settings (dtype, threads, cache) are theirs; this records where they were and the load.
        info |= {"backend": "remote", "endpoints": list(config.endpoints), "concurrency": config.concurrency}
        info.pop("dtype"), info.pop("kv_cache"), info.pop("draft_vocab")
    return info
