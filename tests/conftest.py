from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerBase

sys.path.insert(0, str(Path(__file__).parent))
# The offline embedding shared by the examples and the end-to-end tests.
sys.path.insert(1, str(Path(__file__).parent.parent / "examples"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never reach a model hub
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The suite checks what each configuration does, on whatever CPU CI lands: engines built with every setting at "auto"
# run the profile's shipped configuration instead of measuring this machine (tests/test_tune.py tests the tuner).
os.environ.setdefault("RELAYGEN_TUNE", "off")


@pytest.fixture(scope="session")
def tokenizer() -> PreTrainedTokenizerBase:
    """The demo pair's tokenizer, from the small committed fixture."""
    from fixture_tokenizer import fixture_tokenizer_dir

    return AutoTokenizer.from_pretrained(fixture_tokenizer_dir())


@pytest.fixture(scope="module")
def pair(tokenizer: PreTrainedTokenizerBase) -> tuple[Any, Any]:
    """A tiny random-weight fp32 pair of the demo pair's family (large: 64 hidden, 2 layers; small: 32, 1), one per
    test module: tests read it, none changes its weights."""
    from helpers import tiny_qwen2

    return tiny_qwen2(tokenizer, seed=1, hidden=64, layers=2), tiny_qwen2(tokenizer, seed=2, hidden=32, layers=1)


@pytest.fixture
def collector() -> Iterator[Any]:
    """Records every LlamaIndex instrumentation event while a test runs (attached to the root dispatcher)."""
    from llama_index.core.instrumentation import get_dispatcher
    from llama_index_events import Collector

    root = get_dispatcher()
    handler = Collector()
    handler.events.clear()
    root.add_event_handler(handler)
    try:
        yield handler
    finally:
        root.event_handlers.remove(handler)
