"""``python tests/tiny_server.py PORT``: ``relaygen serve``'s app over the tiny random-weight pair, in a process of its
own, so that a test's client threads (and their GIL) cannot slow the server down or hide its stalls."""

from __future__ import annotations

import sys
from pathlib import Path

from transformers import AutoTokenizer

sys.path.insert(0, str(Path(__file__).parent))

from fixture_tokenizer import fixture_tokenizer_dir
from helpers import tiny_qwen2

from relaygen_integrations import RelayEngine
from relaygen_integrations.serve.app import create_app
from relaygen_integrations.serve.http import run_server

if __name__ == "__main__":
    tokenizer = AutoTokenizer.from_pretrained(fixture_tokenizer_dir())
    pair = tiny_qwen2(tokenizer, seed=1, hidden=32, layers=1), tiny_qwen2(tokenizer, seed=2, hidden=32, layers=1)
    engine = RelayEngine.from_models(*pair, tokenizer, cues=["the"])
    run_server(create_app(engine), port=int(sys.argv[1]), log_level="warning")  # as `relaygen serve` runs it
