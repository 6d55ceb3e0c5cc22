#!/usr/bin/env python
"""Regenerate ``tests/fixtures/qwen2_tokenizer/`` from the cached demo pair's tokenizer.

Usage: ``.venv/bin/python scripts/make_tokenizer_fixture.py [--fetch]`` (``--fetch`` downloads the demo
pair first when it is not cached). Writes ``tokenizer.json.xz`` and ``tokenizer_config.json`` (chat template
inline, so the fixture is two files), then checks the fixture tokenizes samples exactly like the real one.
"""

from __future__ import annotations

import argparse
import json
import lzma
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "tests" / "fixtures" / "qwen2_tokenizer"
MAX_XZ_BYTES = 2 * 1024 * 1024  # keep the repository small; ~1.4 MB today
# Keys transformers records about *how* the source was loaded, not what the tokenizer is.
DROP_KEYS = ("is_local", "local_files_only", "name_or_path", "_commit_hash")

SAMPLES = [
    "Hello, world! Natalia sold clips to 48 of her friends in April.",
    "def add(a, b):\n    return a + b  # 2+3=5\n\n\tindented\r\n",
    "Unicode: naïve café, 你好世界, emoji 🙂, Ωmega, ﬁ ligature, Ｆｕｌｌwidth",
    "<|im_start|>user\nWhat is 7*8?<|im_end|>\n<|im_start|>assistant\n",
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fetch", action="store_true", help="fetch the demo pair first if it is not cached")
    args = parser.parse_args(argv)

    sys.path.insert(0, str(REPO))
    sys.path.insert(0, str(REPO / "tests"))
    from relaygen_integrations.registry import fetch_pair, pair_paths

    paths = pair_paths("demo") or (fetch_pair("demo") if args.fetch else None)
    if paths is None:
        print("the demo pair is not cached; run `relaygen models fetch demo` (or pass --fetch)", file=sys.stderr)
        return 1
    source = paths.large

    config = json.loads((source / "tokenizer_config.json").read_text())
    for key in DROP_KEYS:
        config.pop(key, None)
    template = source / "chat_template.jinja"
    if template.exists():  # transformers 5 saves it beside the config; inline it so the fixture is 2 files
        config["chat_template"] = template.read_text()
    if not config.get("chat_template"):
        print(f"{source} has no chat template", file=sys.stderr)
        return 1

    OUT.mkdir(parents=True, exist_ok=True)
    raw = (source / "tokenizer.json").read_bytes()
    xz = lzma.compress(raw, preset=9 | lzma.PRESET_EXTREME)
    if len(xz) > MAX_XZ_BYTES:
        print(f"compressed tokenizer is {len(xz)} bytes, over the {MAX_XZ_BYTES} budget", file=sys.stderr)
        return 1
    (OUT / "tokenizer.json.xz").write_bytes(xz)
    (OUT / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    print(f"wrote {OUT}: tokenizer.json {len(raw):,} B -> tokenizer.json.xz {len(xz):,} B")

    from fixture_tokenizer import fixture_tokenizer_dir
    from transformers import AutoTokenizer

    real = AutoTokenizer.from_pretrained(source, local_files_only=True)
    fixture = AutoTokenizer.from_pretrained(fixture_tokenizer_dir(), local_files_only=True)
    messages = [{"role": "user", "content": "What is 7*8?"}]
    same = real.get_vocab() == fixture.get_vocab() and all(real(s).input_ids == fixture(s).input_ids for s in SAMPLES)
    same = same and real.apply_chat_template(messages, tokenize=False) == fixture.apply_chat_template(
        messages, tokenize=False
    )
    if not same:
        print("the fixture does not tokenize like the real tokenizer", file=sys.stderr)
        return 1
    print("checked: fixture tokenizes the samples and renders the chat template like the real one")
    return 0


if __name__ == "__main__":
    sys.exit(main())
