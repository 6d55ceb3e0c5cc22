"""Prompts shared by the demo, the CLI and the benchmark (one system prompt for every mode)."""

from __future__ import annotations

import json
import re
from importlib import resources
from pathlib import Path
from typing import Any

MATH_SYSTEM_PROMPT = "Reason step by step in plain sentences (no code), then give the final answer as \\boxed{N}."


def math_messages(question: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": MATH_SYSTEM_PROMPT}, {"role": "user", "content": question}]


def load_gsm8k(path: str | Path | None = None) -> list[dict[str, Any]]:
    """GSM8K records (``question``, ``answer``); the five shipped demo problems when no path is given."""
    if path is None:
        text = (resources.files("relaygen_integrations") / "data" / "gsm8k_demo.jsonl").read_text(encoding="utf-8")
    else:
        text = Path(path).read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def gsm8k_reference_answer(record: dict[str, Any]) -> str:
    """The number after '####' in a GSM8K answer."""
    return str(record["answer"]).rsplit("####", 1)[-1].strip().replace(",", "")


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
