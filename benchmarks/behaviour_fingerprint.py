"""What the engine writes, with the time taken out: a fingerprint to compare two commits of a refactor.

For the demo pair, greedy, on GSM8K test_dev problems: the text, the token ids, the spans and every usage field that
is not a time, for relay, relay with speculation, the large model with speculation, verified relay (the pair's
shipped rule), a stop-sequence case and a tool turn under the grammar (LangChain's ``bind_tools``: the call, its
arguments and the relay metadata). It uses the public API only (``RelayEngine``, ``RelayChatModel``), so the same
file runs on a commit before a refactor and on one after it; two outputs that differ name the first field that
differs.

    .venv/bin/python benchmarks/behaviour_fingerprint.py --out before.json          # on the old commit
    .venv/bin/python benchmarks/behaviour_fingerprint.py --out after.json --compare before.json
"""

from __future__ import annotations

import argparse
import json
import platform
from dataclasses import asdict
from pathlib import Path
from typing import Any

from relaygen_integrations import RelayEngine
from relaygen_integrations.prompts import load_gsm8k, math_messages

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "gsm8k" / "test_dev.jsonl"

# name -> per-request settings; the stop case ends at the first sentence that starts with "So".
CASES: dict[str, dict[str, Any]] = {
    "relay": {"mode": "relay", "speculative": False, "verify": False},
    "relay-spec": {"mode": "relay", "speculative": True, "verify": False},
    "large-spec": {"mode": "large", "speculative": True, "verify": False},
    "relay+verify": {"mode": "relay", "speculative": False, "verify": None},  # None: the engine's shipped rule
    "stop": {"mode": "relay", "speculative": False, "verify": False, "stop": ["So "]},
    "tool": {"mode": "relay", "speculative": True, "verify": None},  # through LangChain, with a tool to call
}


def add(a: float, b: float) -> float:
    """Adds two numbers.

    Args:
        a: the first number
        b: the second number
    """
    return a + b


def tool_turn(engine: RelayEngine, question: str, settings: dict[str, Any], max_new_tokens: int) -> dict[str, Any]:
    """One tool turn under the grammar (``constrain`` on by default): the model must call ``add``."""
    from relaygen_integrations.langchain import RelayChatModel

    model = RelayChatModel(engine=engine, max_new_tokens=max_new_tokens, **settings)
    message = model.bind_tools([add], tool_choice="add").invoke(question)
    return {"text": message.content, "tool_calls": [{k: call[k] for k in ("name", "args")} for call in
            message.tool_calls], "relaygen": _timeless(message.response_metadata.get("relaygen"))}  # fmt: skip


def _timeless(value: Any) -> Any:
    """Drops every field that measures time (seconds, time splits, elapsed)."""
    if isinstance(value, dict):
        return {
            k: _timeless(v)
            for k, v in value.items()
            if not any(word in str(k) for word in ("seconds", "time", "elapsed", "per_second", "duration"))
        }
    if isinstance(value, list):
        return [_timeless(v) for v in value]
    return value


def fingerprint(engine: RelayEngine, problems: list[dict[str, Any]], max_new_tokens: int) -> dict[str, Any]:
    runs: dict[str, Any] = {}
    for number, problem in enumerate(problems, start=1):
        for name, settings in CASES.items():
            if name == "tool":
                runs[f"{number}/{name}"] = tool_turn(engine, problem["question"], settings, max_new_tokens)
                print(f"problem {number} {name}: {runs[f'{number}/{name}']['tool_calls']}", flush=True)
                continue
            result = engine.generate(math_messages(problem["question"]), max_new_tokens=max_new_tokens, **settings)
            runs[f"{number}/{name}"] = {
                "text": result.text,
                "ids": list(result.completion_ids),
                "finish_reason": result.finish_reason,
                "spans": [_timeless(asdict(span)) for span in result.spans],
                "usage": _timeless(asdict(result.usage)),
            }
            print(f"problem {number} {name}: {len(result.completion_ids)} tokens, {result.finish_reason}", flush=True)
    return runs


def first_difference(a: Any, b: Any, where: str = "") -> str | None:
    if type(a) is not type(b):
        return f"{where}: {type(a).__name__} vs {type(b).__name__}"
    if isinstance(a, dict):
        for key in sorted(set(a) | set(b)):
            if key not in a or key not in b:
                return f"{where}/{key}: only in {'the second' if key not in a else 'the first'}"
            found = first_difference(a[key], b[key], f"{where}/{key}")
            if found:
                return found
        return None
    if isinstance(a, list):
        if len(a) != len(b):
            return f"{where}: {len(a)} vs {len(b)} items"
        for index, (x, y) in enumerate(zip(a, b, strict=True)):
            found = first_difference(x, y, f"{where}[{index}]")
            if found:
                return found
        return None
    return None if a == b else f"{where}: {a!r} vs {b!r}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", default="fp32")
    parser.add_argument("--problems", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=160)
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--compare", type=Path, help="a fingerprint to compare with (exit 1 when they differ)")
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated names of the cases to run")
    parser.add_argument("--stop", help="the stop case's stop sequences, separated by '|' (default: 'So ')")
    more = "switch cues for every case (a preset such as 'generic'); default: the engine's, which may not fire early"
    parser.add_argument("--cues", help=more)
    args = parser.parse_args()
    if args.stop:
        CASES["stop"]["stop"] = args.stop.split("|")
    for name in set(CASES) - set(args.cases.split(",")):
        del CASES[name]
    if args.cues:
        for settings in CASES.values():
            settings["cues"] = args.cues
    engine = RelayEngine.from_pretrained(dtype=args.dtype, draft_vocab=32768)
    runs = fingerprint(engine, load_gsm8k(args.data)[: args.problems], args.max_new_tokens)
    report = {"machine": platform.processor() or platform.machine(), "dtype": args.dtype, "runs": runs}
    args.out.write_text(json.dumps(report, indent=1))
    if args.compare:
        difference = first_difference(json.loads(args.compare.read_text())["runs"], json.loads(json.dumps(runs)))
        print("identical" if difference is None else f"differs at {difference}")
        raise SystemExit(0 if difference is None else 1)


if __name__ == "__main__":
    main()
