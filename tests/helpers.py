"""Test models: tiny random-weight Qwen2 models and a scripted model whose output is fixed text.

The scripted model makes switch points exact and readable: each model "writes" its own reference text from the
current character offset of the completion, so with a large reference in lower case and a small reference in upper
case, the relay output shows in its letters which model wrote every character.
"""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from transformers import DynamicCache, GenerationConfig, PreTrainedTokenizerBase, Qwen2Config, Qwen2ForCausalLM

from relaygen_integrations import RelayEngine


def tiny_qwen2(tokenizer: PreTrainedTokenizerBase, seed: int, hidden: int = 64, layers: int = 2) -> Qwen2ForCausalLM:
    """A random-weight model of the demo pair's architecture family, small enough to build in well under a second."""
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
    )
    model = Qwen2ForCausalLM(config).eval()
    # Random init gives near-uniform logits; widen the head so greedy choices are not decided by rounding noise.
    with torch.no_grad():
        model.lm_head.weight.mul_(40.0)
    model.generation_config = GenerationConfig(eos_token_id=config.eos_token_id, pad_token_id=config.bos_token_id)
    return model


class ScriptedLM(torch.nn.Module):
    """Writes ``reference[len(completion_text):]`` one token at a time, then ends with <|im_end|>.

    The cache is a real DynamicCache whose single layer stores the token ids themselves, so the model always knows
    the whole sequence it was fed - including after ``DynamicCache.crop`` - and the engine's catch-up logic is
    exercised exactly as with a real model. ``fed`` records every forward pass's token count.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        reference: str,
        prompt_len: int | None = None,
        after_result: str | None = None,
    ) -> None:
        super().__init__()
        self.tokenizer = tokenizer
        self.reference = reference
        self.prompt_len = prompt_len
        # The reply of a turn whose prompt holds a tool's result (an agent's second turn), if it differs.
        self.after_result = after_result
        self.eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.im_start = tokenizer.convert_tokens_to_ids("<|im_start|>")
        self.header = tokenizer.encode("<|im_start|>assistant\n", add_special_tokens=False)
        self.config = Qwen2Config(
            vocab_size=len(tokenizer), num_hidden_layers=1, max_position_embeddings=4096, hidden_size=8,
            num_attention_heads=1, num_key_value_heads=1,
        )  # fmt: skip
        self.generation_config = GenerationConfig(eos_token_id=self.eos)
        self.fed: list[int] = []
        self._anchor = torch.nn.Parameter(torch.zeros(1), requires_grad=False)

    @property
    def device(self) -> torch.device:
        return self._anchor.device

    def next_token(self, sequence: list[int]) -> int:
        start = self._completion_start(sequence)
        written = self.tokenizer.decode(sequence[start:], skip_special_tokens=False)
        rest = self._reference(sequence[:start])[len(written) :]
        if not rest:
            return self.eos
        return self.tokenizer.encode(rest, add_special_tokens=False)[0]

    def _reference(self, prompt: list[int]) -> str:
        if self.after_result is not None and "<tool_response>" in self.tokenizer.decode(prompt):
            return self.after_result
        return self.reference

    def _completion_start(self, sequence: list[int]) -> int:
        """Fixed, or (prompt_len=None) right after the last "<|im_start|>assistant\n": then the reference is the whole
        assistant turn, including any prefill the engine was given (e.g. a forced "<tool_call>")."""
        if self.prompt_len is not None:
            return self.prompt_len
        start = len(sequence) - 1 - sequence[::-1].index(self.im_start)
        return start + len(self.header)

    def forward(
        self, input_ids: torch.Tensor, cache: DynamicCache, logits_to_keep: int = 1, **_: object
    ) -> SimpleNamespace:
        ids = input_ids.to(torch.float32).view(1, 1, -1, 1)
        keys, _values = cache.update(ids, ids, 0)
        sequence = [int(v) for v in keys.view(-1).tolist()]
        self.fed.append(input_ids.shape[1])
        # One row per kept position (speculative verification keeps several), each predicting the next token.
        logits = torch.zeros(1, logits_to_keep, self.config.vocab_size)
        for row in range(logits_to_keep):
            logits[0, row, self.next_token(sequence[: len(sequence) - logits_to_keep + 1 + row])] = 20.0
        return SimpleNamespace(logits=logits)


PROMPT = [{"role": "user", "content": "Solve it."}]


def scripted_engine(
    tokenizer: PreTrainedTokenizerBase,
    large_text: str,
    small_text: str | None = None,
    cues: list[str] | str = ("So", "So,", "So ", "Therefore", "Now"),  # type: ignore[assignment]
    **policy: object,
) -> tuple[RelayEngine, ScriptedLM, ScriptedLM]:
    """An engine over two scripted models; by default the small model writes the upper-cased large text."""
    prompt_ids = tokenizer.encode(
        tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True, tokenize=False), add_special_tokens=False
    )
    large = ScriptedLM(tokenizer, large_text, len(prompt_ids))
    small_reference = small_text if small_text is not None else large_text.upper()
    small = ScriptedLM(tokenizer, small_reference, len(prompt_ids))
    engine = RelayEngine.from_models(large, small, tokenizer, cues=list(cues), policy=dict(policy))  # type: ignore[arg-type]
    return engine, large, small


def chat_engine(
    tokenizer: PreTrainedTokenizerBase, reply: str, cues: list[str] | None = None, after_result: str | None = None
) -> RelayEngine:
    """A scripted engine for any chat (tools, prefills): the large model writes ``reply`` as its assistant turn (or
    ``after_result`` once the chat holds a tool's result), the small model the same in upper case."""
    large = ScriptedLM(tokenizer, reply, after_result=after_result)
    small = ScriptedLM(tokenizer, reply.upper(), after_result=after_result.upper() if after_result else None)
    return RelayEngine.from_models(large, small, tokenizer, cues=list(cues or ["So"]))  # type: ignore[arg-type]


class PassGate:
    """Counts the forward passes of ``models`` and holds pass number ``hold_at`` on whichever thread runs it, until
    the test calls :meth:`release`: the test then knows a generation is mid-way, and that it cancels (or its client
    leaves) while no pass can run - so the passes after the cancel are counted, not timed.

    After the release at most ``allowed`` more passes may start; the next one raises (so a generation that ignores
    its cancel fails fast instead of running its whole budget) and sets ``overran``. :meth:`remove` detaches the
    hooks, before the test's next request."""

    def __init__(self, *models: torch.nn.Module, hold_at: int, allowed: int = 1, timeout: float = 60.0) -> None:
        self.hold_at, self.allowed, self.timeout = hold_at, allowed, timeout
        self.passes = 0
        self.overran = False
        self.held = threading.Event()  # pass hold_at has started and waits
        self._released = threading.Event()
        self._count = threading.Lock()
        self.thread: threading.Thread | None = None  # the thread that ran the held pass (a generation's worker)
        self._handles = [model.register_forward_pre_hook(self._hook) for model in models]

    def _hook(self, *_args: object) -> None:
        with self._count:
            self.passes += 1
            number = self.passes
        if number == self.hold_at:
            self.thread = threading.current_thread()
            self.held.set()
            if not self._released.wait(self.timeout):
                raise AssertionError(f"pass {number} was held for {self.timeout} s and never released")
        elif number > self.hold_at + self.allowed:
            self.overran = True
            raise RuntimeError(f"forward pass {number} ran after the cancel (held at {self.hold_at})")

    def wait_held(self) -> None:
        assert self.held.wait(self.timeout), f"the generation never reached forward pass {self.hold_at}"

    def release(self) -> None:
        self._released.set()

    def after_release(self) -> int:
        """Passes that started after the held one."""
        return self.passes - self.hold_at

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()


async def cancel_while_held(gate: PassGate, task: asyncio.Task[Any]) -> int:
    """Cancels ``task`` (an awaitable running one generation) while its worker is held at ``gate``'s pass, lets the
    worker go on, waits for it to end and returns how many forward passes started after the cancel."""
    try:
        await asyncio.to_thread(gate.wait_held)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        gate.release()
        worker = gate.thread
        assert worker is not None
        await asyncio.to_thread(worker.join, 60)
        assert not worker.is_alive(), "the cancelled generation's worker still runs a minute later"
    finally:
        gate.release()
        gate.remove()
    assert not gate.overran, f"{gate.after_release()} forward passes ran after the cancel"
    return gate.after_release()
