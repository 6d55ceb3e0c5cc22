from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerBase

sys.path.insert(0, str(Path(__file__).parent))
# The offline embedding shared by the examples and the end-to-end tests.
sys.path.insert(1, str(Path(__file__).parent.parent / "examples"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never reach a model hub
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tokenizer() -> PreTrainedTokenizerBase:
    """The demo pair's tokenizer, from the small committed fixture."""
    from fixture_tokenizer import fixture_tokenizer_dir

    return AutoTokenizer.from_pretrained(fixture_tokenizer_dir())
