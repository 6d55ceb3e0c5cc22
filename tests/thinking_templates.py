"""Chat templates with and without a thinking switch, for the tiny random-weight pair (a template is data).

Each is the demo tokenizer's ChatML with one change that matters to reasoning, written from the public templates:

* ``SWITCH``: Qwen3's switch - ``enable_thinking`` false closes an empty ``<think>`` block in the generation prompt -
  with the block opened otherwise (as QwQ's and DeepSeek-R1's generation prompts do), so a random-weight model's
  output lands in the reasoning when thinking is on and in the answer when it is off. An assistant turn renders its
  ``reasoning_content`` inside ``<think>`` as Qwen3's does.
* ``THINKING_FLAG``: DeepSeek-V3.1's / Granite 3.2's switch, ``thinking``, off unless given.
* ``ALWAYS_THINKS``: the block is always opened (DeepSeek-R1): no switch.
* ``SYSTEM_FIRST_ONLY``: a system message after the first turn is refused (Gemma's and Mistral's templates raise).
"""

from __future__ import annotations

from transformers import AutoTokenizer, PreTrainedTokenizerBase

_TURNS = (
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if message.reasoning_content %}"
    "{{- '<think>\\n' + message.reasoning_content + '\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{{- message.content + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
)
SWITCH = (
    _TURNS + "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- else %}{{- '<think>\\n' }}{%- endif %}{%- endif %}"
)
THINKING_FLAG = (
    _TURNS + "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if thinking is defined and thinking %}{{- '<think>\\n' }}{%- endif %}{%- endif %}"
)
ALWAYS_THINKS = _TURNS + "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}"
SYSTEM_FIRST_ONLY = (
    "{%- for message in messages %}{%- if message.role == 'system' and not loop.first %}"
    "{{- raise_exception('System role only supported at the beginning of the conversation') }}{%- endif %}"
    "{%- endfor %}" + SWITCH
)


def templated(tokenizer: PreTrainedTokenizerBase, template: str) -> PreTrainedTokenizerBase:
    """A fresh copy of ``tokenizer`` (the session fixture stays as it is) that renders with ``template``."""
    copy = AutoTokenizer.from_pretrained(tokenizer.name_or_path)
    copy.chat_template = template
    return copy
