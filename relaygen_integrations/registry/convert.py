"""Turning a GGUF into what ``from_pretrained`` loads fast: a dequantized safetensors checkpoint, and the
tokenizer embedded in the GGUF as ordinary tokenizer files.

torch and transformers are imported inside the functions: they take seconds to import, and `relaygen models
list/path` need neither.
"""

from __future__ import annotations

import contextlib
import gc
from pathlib import Path
from typing import Any

from .specs import DType

__all__ = ["convert_gguf_to_safetensors", "extract_tokenizer"]


def convert_gguf_to_safetensors(gguf_path: Path, out_dir: Path, dtype: DType) -> None:
    """Dequantize a GGUF into a plain transformers checkpoint (``config.json`` + ``model.safetensors``).

    Loads in float32 (the GGUF dequantizer's native precision), casts to ``dtype`` and saves. Runs one
    model at a time; the caller collects garbage afterwards so the next conversion starts low.
    """
    # Imported here: torch + transformers take seconds to import and `relaygen models list/path` need neither.
    import torch
    from transformers import AutoModelForCausalLM, GgufConfig

    target = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf_path.parent),
        gguf_file=gguf_path.name,
        # Force plain dense weights: with the optional `kernels` package installed, transformers would
        # otherwise keep them packed in GGUF blocks (GgufLinear), which cannot be saved as a checkpoint.
        quantization_config=GgufConfig(dequantize=True),
        dtype=torch.float32,
        local_files_only=True,
    )
    try:
        # The loader attaches a GGUF quantizer, and save_pretrained refuses models whose quantizer is not
        # serializable. The weights are already dense, so detaching it (and its config entry) is truthful.
        model.hf_quantizer = None
        config = model.config
        with contextlib.suppress(AttributeError):
            del config.quantization_config
        if getattr(config, "quantization_config", None) is not None:
            config.quantization_config = None
        # The loader derives tie_word_embeddings from whether the GGUF stores an output head; Qwen2.5
        # GGUFs do, and it differs from the embedding, so it must stay untied when reloaded.
        out_emb = model.get_output_embeddings()
        in_emb = model.get_input_embeddings()
        if out_emb is not None and out_emb.weight.data_ptr() != in_emb.weight.data_ptr():
            config.tie_word_embeddings = False
        model.to(target)
        config.dtype = target  # `torch_dtype` is the deprecated alias in transformers 5; this writes "dtype"
        _fix_generation_config(model)
        # transformers 5 always writes safetensors; it no longer takes `safe_serialization`.
        model.save_pretrained(str(out_dir))
    finally:
        del model
        gc.collect()


def _fix_generation_config(model: Any) -> None:
    """Make generation stop on both end tokens, as the upstream Qwen2.5 instruct generation_config does.

    GGUF metadata has a single eos id (``<|im_end|>``); a chat model that emits ``<|endoftext|>``
    instead would otherwise run on to max_new_tokens.
    """
    gen = getattr(model, "generation_config", None)
    if gen is None:
        return
    eos = gen.eos_token_id if gen.eos_token_id is not None else model.config.eos_token_id
    eos_ids: list[int] = [eos] if isinstance(eos, int) else list(eos or [])
    extra = [t for t in (model.config.eos_token_id, model.config.bos_token_id, gen.pad_token_id) if t is not None]
    # Qwen's <|endoftext|> doubles as pad/bos in these files; it is also a legitimate stop token.
    for tok in extra:
        if isinstance(tok, int) and tok not in eos_ids:
            eos_ids.append(tok)
    if eos_ids:
        gen.eos_token_id = eos_ids if len(eos_ids) > 1 else eos_ids[0]
    if gen.pad_token_id is None and getattr(model.config, "pad_token_id", None) is not None:
        gen.pad_token_id = model.config.pad_token_id


def extract_tokenizer(gguf_path: Path, out_dir: Path) -> None:
    """Save the tokenizer embedded in a GGUF as ordinary tokenizer files (tokenizer.json + config)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name, local_files_only=True)
    tokenizer.save_pretrained(str(out_dir))
