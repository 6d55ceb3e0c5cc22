"""The engine's int8 format against torchao's int8 (issue 44): what a pass costs, and how far each moves the logits.

The engine's ``int8`` (``engine/local/weights.py``) quantizes every linear layer with torch's eager dynamic
quantization (fbgemm kernels), subclassed to give each token its own activation scale (``RowScaledInt8Linear``).
torch marks that API deprecated in favour of torchao, whose ``Int8DynamicActivationInt8WeightConfig`` has per-token
activation scales natively. ``int8-per-tensor`` is the engine's int8 before it kept per-channel weight scales and 8-bit
activations (one weight scale per tensor, fbgemm's 7-bit activations). Before moving, this measures them on this
machine, the way ``relaygen tune`` measures a
format (``tune/measure.py``: one pass over k new positions on a cached context of 300 random keys and values, the
one-token step the median of three), for each model of the demo pair, and each format's logits on a real GSM8K prompt
and answer (one teacher-forced pass) against the fp32 model's: the share of positions whose top token agrees and the
mean absolute logit error.

torchao is not a dependency: run it where it is installed beside the engine's torch, e.g. a virtualenv that reads
the project's site-packages through a ``.pth`` file, with ``pip install --no-deps torchao``:

    python benchmarks/int8_kernels.py --out benchmarks/results/int8_kernels.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
import warnings
from pathlib import Path
from typing import Any

import torch

from relaygen_integrations.engine.core.pairs import resolve_reference
from relaygen_integrations.engine.local.loading import load_causal_lm
from relaygen_integrations.engine.local.weights import RowScaledInt8Linear, quantize_linear_int8
from relaygen_integrations.tune.machine import this_machine
from relaygen_integrations.tune.measure import ModelPassTimer, measure_pass_costs

FORMATS = ("int8", "int8-per-tensor", "torchao-int8", "bf16")
POSITIONS = (1, 2, 4, 8, 16, 32)
DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "gsm8k" / "test_dev.jsonl"


def load(role: str, fmt: str) -> torch.nn.Module:
    reference, _ = resolve_reference("demo", role, "bf16")  # type: ignore[arg-type]
    model = load_causal_lm(reference, torch.bfloat16, torch.device("cpu"))
    if fmt == "bf16":
        return model
    if fmt == "fp32":
        return model.float()
    if fmt == "int8":
        return quantize_linear_int8(model)
    if fmt == "int8-per-tensor":
        return per_tensor_int8(model)
    if fmt == "torchao-int8":
        from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_

        model = model.float()  # fp32 activations, as the engine's int8 computes
        quantize_(model, Int8DynamicActivationInt8WeightConfig())
        return model
    raise ValueError(fmt)


class PerTensorInt8Linear(RowScaledInt8Linear):
    """The engine's int8 layer before: per-token activation scales, but fbgemm's 7-bit activations."""

    reduce_range = True


def per_tensor_int8(model: torch.nn.Module) -> torch.nn.Module:
    """``quantize_linear_int8`` as it was: the default dynamic qconfig (one weight scale per tensor)."""
    from torch.ao.quantization import quantize_dynamic

    for name in [n for n, m in model.named_modules() if type(m) is torch.nn.Linear]:
        layer = model.get_submodule(name).float()
        bias = None if layer.bias is None else layer.bias.detach().clone()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            quantized = quantize_dynamic(torch.nn.Sequential(layer), {torch.nn.Linear}, dtype=torch.qint8)[0]
        quantized.__class__ = PerTensorInt8Linear
        quantized.float_bias = bias
        model.set_submodule(name, quantized)
    return model.float()


def text_ids() -> list[int]:
    from transformers import AutoTokenizer

    reference, _ = resolve_reference("demo", "large", "bf16")  # type: ignore[arg-type]
    tokenizer = AutoTokenizer.from_pretrained(reference)
    problem = json.loads(DATA.read_text(encoding="utf-8").splitlines()[0])
    messages = [{"role": "user", "content": problem["question"]}]
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer(prompt + problem["answer"])["input_ids"]


@torch.inference_mode()
def logits_of(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    return model(torch.tensor([ids]), use_cache=False).logits[0].float()


def agreement(role: str, ids: list[int], formats: list[str]) -> dict[str, dict[str, float]]:
    reference = logits_of(load(role, "fp32"), ids)
    result: dict[str, dict[str, float]] = {}
    for fmt in formats:
        started = time.perf_counter()
        model = load(role, fmt)
        loaded = time.perf_counter() - started
        logits = logits_of(model, ids)
        result[fmt] = {
            "top1_agreement": float((logits.argmax(-1) == reference.argmax(-1)).float().mean()),
            "mean_abs_logit_error": float((logits - reference).abs().mean()),
            "load_seconds": loaded,
        }
        del model
    return result


@torch.inference_mode()
def interleaved_steps(role: str, rounds: int = 8) -> dict[str, dict[str, float]]:
    """``int8`` against ``int8-per-tensor`` in one process, alternating which goes first: median ms of a pass over
    1 and 4 new positions on a 300-token random context (the sweep above measures one format after the other, and
    this host's speed drifts by more than their difference)."""
    torch.manual_seed(0)
    models = {"int8": load(role, "int8"), "int8-per-tensor": load(role, "int8-per-tensor")}
    context = torch.randint(0, 30000, (1, 300))
    caches = {name: model(context, use_cache=True).past_key_values for name, model in models.items()}
    times: dict[tuple[str, int], list[float]] = {(name, k): [] for name in models for k in (1, 4)}
    for index in range(rounds):
        for k in (1, 4):
            order = list(models.items()) if index % 2 == 0 else list(models.items())[::-1]
            for name, model in order:
                ids = torch.randint(0, 30000, (1, k))
                started = time.perf_counter()
                model(ids, past_key_values=caches[name], use_cache=True)
                times[(name, k)].append(time.perf_counter() - started)
                caches[name].crop(-k)
    return {name: {str(k): 1000 * statistics.median(times[(name, k)]) for k in (1, 4)} for name in models}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/int8_kernels.json"))
    parser.add_argument("--roles", default="small,large")
    parser.add_argument("--formats", default=",".join(FORMATS), help="of: " + ", ".join(FORMATS))
    parser.add_argument("--interleaved", action="store_true", help="only int8 against int8-per-tensor, alternating")
    args = parser.parse_args()
    if args.interleaved:
        steps = {role: interleaved_steps(role) for role in args.roles.split(",")}
        report = {"machine": this_machine(torch.device("cpu")).to_json(), "torch": torch.__version__, "ms": steps}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        print(json.dumps(steps, indent=2))
        return
    formats = args.formats.split(",")
    unknown = sorted(set(formats) - set(FORMATS))
    if unknown:
        parser.error(f"--formats: unknown {unknown}; known: {', '.join(FORMATS)}")
    versions = {"torch": torch.__version__}
    if "torchao-int8" in formats:
        import torchao

        versions["torchao"] = torchao.__version__
    roles = args.roles.split(",")
    plan = [(role, fmt) for role in roles for fmt in formats]
    table = measure_pass_costs(ModelPassTimer(load), plan, positions=POSITIONS, budget_seconds=1800)
    ids = text_ids()
    report: dict[str, Any] = {
        "machine": this_machine(torch.device("cpu")).to_json() | {"python": platform.python_version()},
        **versions,
        "context": table.context,
        "seconds": table.to_json()["seconds"],
        "logits_positions": len(ids),
        "logits_vs_fp32": {role: agreement(role, ids, formats) for role in roles},
    }
    for role in roles:
        costs = table.costs[role]
        for other in (f for f in formats if f != "int8" and "int8" in f and "int8" in formats):
            ratios = {str(k): costs[other].seconds[k] / costs["int8"].seconds[k] for k in sorted(costs["int8"].seconds)}
            report.setdefault(f"{other}_over_int8", {})[role] = ratios | {"median": statistics.median(ratios.values())}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(
        json.dumps({k: v for k, v in report.items() if k in ("seconds", "logits_vs_fp32") or "_over_" in k}, indent=2)
    )


if __name__ == "__main__":
    main()
