"""How the engine's int8 layer maps each activation row before quantizing it, measured: agreement with fp32.

``RowScaledInt8Linear`` (``engine/local/weights.py``) quantizes each activation row on its own. Three mappings:

- ``per-pass-step``: the row divided by its absolute maximum, then fbgemm's dynamic quantization, whose step comes
  from the whole pass's min/max (so a row's integers depend on the other rows in its pass);
- ``fixed-step`` (the engine's): the same scaled row at one fixed step (1/127 of [-1, 1]): row-exact, but a row
  whose values are mostly of one sign (after SiLU) uses about half the levels;
- ``centred``: the row mapped onto [-1, 1] by its own centre and half-range, at the fixed step, and the centre put
  back through the weights' row sums: row-exact and every row uses all levels, at more small ops per layer.

For each, one teacher-forced pass of the demo pair's small model (or ``--role large``) over GSM8K test_dev prompts
with their reference answers, against the fp32 model: the share of positions whose top token agrees and the mean
absolute logit error.

    python benchmarks/int8_row_mapping.py --problems 2 --out benchmarks/data/int8-row-mapping/small.json
"""

from __future__ import annotations

import argparse
import json
import platform
from collections.abc import Callable
from pathlib import Path

import torch

from relaygen_integrations.engine.core.pairs import resolve_reference
from relaygen_integrations.engine.local.loading import load_causal_lm, load_tokenizer
from relaygen_integrations.engine.local.weights import RowScaledInt8Linear, quantize_linear_int8
from relaygen_integrations.prompts import math_messages
from relaygen_integrations.tune.machine import this_machine

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "gsm8k" / "test_dev.jsonl"


def _unscaled(layer: RowScaledInt8Linear, product: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    bias = layer.float_bias  # the kernel added it too: take it out, scale, put it back
    return product * scale if bias is None else (product - bias) * scale + bias


def per_pass_step(layer: RowScaledInt8Linear, x: torch.Tensor) -> torch.Tensor:
    scale = x.abs().amax(dim=-1, keepdim=True).clamp_min(1e-12)
    product = torch.ops.quantized.linear_dynamic(x / scale, layer._packed_params._packed_params, False)
    return _unscaled(layer, product, scale)


def fixed_step(layer: RowScaledInt8Linear, x: torch.Tensor) -> torch.Tensor:
    scale = x.abs().amax(dim=-1, keepdim=True).clamp_min(1e-12)
    product = torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32(
        x / scale, 1.0 / 127, 128, layer._packed_params._packed_params
    )
    return _unscaled(layer, product, scale)


def centred(layer: RowScaledInt8Linear, x: torch.Tensor) -> torch.Tensor:
    low, high = torch.aminmax(x, dim=-1, keepdim=True)
    centre, half = (high + low) / 2, ((high - low) / 2).clamp_min(1e-12)
    product = torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32(
        (x - centre) * half.reciprocal(), 1.0 / 127, 128, layer._packed_params._packed_params
    )
    sums = getattr(layer, "row_sums", None)
    if sums is None:
        sums = layer.row_sums = layer.weight().dequantize().sum(dim=1)  # W 1: puts the centre back
    return _unscaled(layer, product, half) + centre * sums


MAPPINGS: dict[str, Callable[[RowScaledInt8Linear, torch.Tensor], torch.Tensor]] = {
    "per-pass-step": per_pass_step,
    "fixed-step": RowScaledInt8Linear.forward,
    "centred": centred,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--role", default="small", choices=("small", "large"))
    parser.add_argument("--problems", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    reference, _ = resolve_reference("demo", args.role, "bf16")
    tokenizer = load_tokenizer(reference)
    records = [json.loads(line) for line in DATA.read_text(encoding="utf-8").splitlines()[: args.problems]]
    texts = [
        tokenizer.apply_chat_template(math_messages(r["question"]), add_generation_prompt=True, tokenize=False)
        + r["answer"]
        for r in records
    ]
    sequences = [tokenizer(text)["input_ids"] for text in texts]
    with torch.inference_mode():
        fp32 = load_causal_lm(reference, torch.bfloat16, torch.device("cpu")).float()
        gold = [fp32(input_ids=torch.tensor([ids])).logits[0] for ids in sequences]
        del fp32
        model = quantize_linear_int8(load_causal_lm(reference, torch.bfloat16, torch.device("cpu")))
        results = {}
        for name, mapping in MAPPINGS.items():
            RowScaledInt8Linear.forward = mapping  # type: ignore[method-assign]
            agree = positions = 0
            error = 0.0
            for ids, reference_logits in zip(sequences, gold, strict=True):
                logits = model(input_ids=torch.tensor([ids])).logits[0]
                agree += int((logits.argmax(-1) == reference_logits.argmax(-1)).sum())
                error += float((logits - reference_logits).abs().mean()) * len(ids)
                positions += len(ids)
            results[name] = {"top1_agreement": round(agree / positions, 4), "logit_mae": round(error / positions, 4)}
            print(name, results[name])
    report = {
        "role": args.role,
        "problems": args.problems,
        "positions": sum(len(ids) for ids in sequences),
        "machine": this_machine(torch.device("cpu")).to_json() | {"python": platform.python_version()},
        "torch": torch.__version__,
        "mappings": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
