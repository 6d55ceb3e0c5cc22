"""Tokenizers of other chat-template families for the fast tests: the demo pair's tokenizer with a family's chat
template (``fixtures/chat_templates/``) and its control tokens added as special tokens, as the family's own tokenizer
has them (Llama 3's ``<|eot_id|>``, Mistral's ``[TOOL_CALLS]``); and a tiny random-weight pair over it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from fixture_tokenizer import fixture_tokenizer_dir
from helpers import tiny_qwen2
from transformers import AutoTokenizer, PreTrainedTokenizerBase, Qwen2ForCausalLM

TEMPLATES = Path(__file__).parent / "fixtures" / "chat_templates"


@dataclass(frozen=True)
class Family:
    template: str  # file under fixtures/chat_templates
    bos: str
    eos: str
    control: tuple[str, ...]  # further control tokens the family's tokenizer has


FAMILIES = {
    "llama3_json": Family(
        "llama3.1_json_tools.jinja", "<|begin_of_text|>", "<|eot_id|>",
        ("<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|python_tag|>"),
    ),
    "mistral": Family(
        "mistral_v0.3_tools.jinja", "<s>", "</s>",
        ("[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]",
         "[/TOOL_RESULTS]"),
    ),
    "mistral_v11": Family(
        "mistral_v11_tools.jinja", "<s>", "</s>",
        ("[INST]", "[/INST]", "[TOOL_CALLS]", "[ARGS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]",
         "[/TOOL_RESULTS]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[IMG]"),
    ),
}  # fmt: skip


def template_text(family: str) -> str:
    return (TEMPLATES / FAMILIES[family].template).read_text()


@functools.cache
def family_tokenizer(family: str) -> PreTrainedTokenizerBase:
    """The demo pair's tokenizer as ``family``'s: its template, and its control tokens as special tokens. Shared
    by the tests that read it (none changes it; a test that sets attributes loads its own)."""
    return load_family_tokenizer(family)


def load_family_tokenizer(family: str) -> PreTrainedTokenizerBase:
    spec = FAMILIES[family]
    tokenizer = AutoTokenizer.from_pretrained(fixture_tokenizer_dir())
    tokenizer.add_special_tokens(
        {"bos_token": spec.bos, "eos_token": spec.eos, "additional_special_tokens": list(spec.control)}
    )
    tokenizer.chat_template = template_text(family)
    return tokenizer


def family_pair(tokenizer: PreTrainedTokenizerBase) -> tuple[Qwen2ForCausalLM, Qwen2ForCausalLM]:
    """The fast tests' tiny random-weight pair (``conftest.pair``'s sizes) over ``tokenizer``'s vocabulary, ending
    its turns with the family's end token."""
    pair = tiny_qwen2(tokenizer, seed=1, hidden=64, layers=2), tiny_qwen2(tokenizer, seed=2, hidden=32, layers=1)
    for model in pair:
        model.config.eos_token_id = model.generation_config.eos_token_id = tokenizer.eos_token_id
    return pair
