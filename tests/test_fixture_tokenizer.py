"""The committed tokenizer fixture: small, loads offline, tokenizes exactly like the real demo tokenizer."""

from __future__ import annotations

import pytest
from fixture_tokenizer import COMPRESSED, FIXTURE_DIR, fixture_tokenizer_dir
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from relaygen_integrations import registry as reg

TEXTS = [
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May.",
    "def fib(n: int) -> int:\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "  leading spaces, trailing tabs\t\t\nand\r\nCRLF",
    "naïve café 你好世界 🙂 Ωmega ﬁ Ｆｕｌｌwidth ½ e\u0301",  # NFC-sensitive input on purpose
    "<|im_start|>user\nWhat is 7*8?<|im_end|>\n<|im_start|>assistant\n56<|im_end|><|endoftext|>",
    "",
]
MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is 7*8?"},
]


@pytest.fixture(scope="module")
def fixture_tokenizer() -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(fixture_tokenizer_dir(), local_files_only=True)


def test_fixture_is_small() -> None:
    assert (FIXTURE_DIR / COMPRESSED).stat().st_size <= 2 * 1024 * 1024


def test_fixture_dir_is_reused() -> None:
    first = fixture_tokenizer_dir()
    fixture_tokenizer_dir.cache_clear()  # the on-disk copy, not the in-process cache, must be found again
    assert fixture_tokenizer_dir() == first
    assert (first / "tokenizer.json").stat().st_size > 10_000_000


def test_fixture_loads_and_round_trips(fixture_tokenizer: PreTrainedTokenizerBase) -> None:
    tok = fixture_tokenizer
    assert len(tok) == 151_936
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == 151_645
    assert tok.pad_token == "<|endoftext|>" and tok.pad_token_id == 151_643
    assert tok.convert_tokens_to_ids("<|im_start|>") == 151_644
    for text in TEXTS[:3]:
        ids = tok(text).input_ids
        assert tok.decode(ids) == text
    ids = tok("<|im_start|>user\nhi<|im_end|>").input_ids
    assert ids[0] == 151_644 and ids[-1] == 151_645  # special tokens are single ids
    prompt = tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>assistant\n")
    assert "<|im_start|>system\nYou are terse.<|im_end|>" in prompt


@pytest.mark.real_pair
def test_fixture_matches_the_real_demo_tokenizer(fixture_tokenizer: PreTrainedTokenizerBase) -> None:
    paths = reg.pair_paths("demo") or reg.fetch_pair("demo")
    real = AutoTokenizer.from_pretrained(paths.large, local_files_only=True)
    assert real.get_vocab() == fixture_tokenizer.get_vocab()
    for text in TEXTS:
        assert fixture_tokenizer(text).input_ids == real(text).input_ids, text
    for add in (False, True):
        assert fixture_tokenizer.apply_chat_template(
            MESSAGES, tokenize=False, add_generation_prompt=add
        ) == real.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=add)
    assert fixture_tokenizer.all_special_tokens == real.all_special_tokens
