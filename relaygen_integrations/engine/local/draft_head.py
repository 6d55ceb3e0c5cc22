"""A reduced output projection for the drafting small model: logits over the tokens a draft is likely to hold.

A decode step ends in a projection of the last hidden state onto the whole vocabulary: for the demo pair's small
model 152k rows, 136 M of its 494 M weights. A self-speculative draft only proposes - the large model decides in its
verify pass - so a draft step may score a subset of the vocabulary and stay lossless (the idea of FR-Spec,
arXiv 2502.14856):

* greedy: a token outside the subset is never proposed; where the large model writes one, the draft is rejected
  there and the verify pass supplies the large model's own token, exactly as for any other mismatch;
* sampling: the acceptance rule (``min(1, p/q)``, else resample from ``max(0, p - q)``) leaves the large model's
  distribution unchanged for *any* draft distribution ``q``, including one that is zero outside the subset.

The subset: the ``n`` lowest ids (a byte-level BPE tokenizer numbers its tokens in merge order, which follows their
frequency in its training text; on the demo pair's GSM8K traces the first 32k ids cover 94 % of the large model's
tokens), the tokenizer's special and added tokens, and - per request - every token of the prompt (the names and
numbers a reasoning trace copies: 97 % together). A caller with a domain's own frequency list passes the ids instead.

Only the small model's drafts use it. When the small model writes a segment itself (relay) its logits come from the
full projection: that text is its own choice, not a proposal.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..core.settings import GenerationError

DraftVocab = int | Sequence[int] | None
"""``None``: the full vocabulary; an int ``n``: the ``n`` lowest token ids (plus special and prompt tokens); a
sequence: exactly those ids (plus special and prompt tokens)."""

# Config entries that make a model's logits more than ``output_embeddings(hidden)``: a projection that skipped them
# would score differently from the model itself.
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")


class DraftHeadError(GenerationError):
    """``draft_vocab`` names ids outside the vocabulary, or the model's output layer cannot be restricted."""

    def __init__(self, message: str) -> None:
        super().__init__(message, field="draft_vocab")


def draft_vocab_ids(spec: DraftVocab, tokenizer: PreTrainedTokenizerBase, vocab_size: int) -> torch.Tensor | None:
    """The sorted ids a draft may propose, before a request's prompt tokens are added; None for the full vocabulary
    (``spec`` None, or a subset that would hold every id anyway)."""
    if spec is None:
        return None
    if isinstance(spec, bool) or not isinstance(spec, (int, Sequence)) or isinstance(spec, str):
        raise DraftHeadError(f"draft_vocab must be None, a token count or a list of token ids, got {spec!r}")
    if isinstance(spec, int):
        if spec < 1:
            raise DraftHeadError(f"draft_vocab must be a positive token count, got {spec}")
        chosen: Iterable[int] = range(min(spec, vocab_size))
    else:
        bad = [i for i in spec if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < vocab_size]
        if bad or not spec:
            shown = repr(bad[0]) if bad else "an empty list"
            raise DraftHeadError(f"draft_vocab ids must be token ids in [0, {vocab_size}); got {shown}")
        chosen = spec
    special = [i for i in tokenizer.all_special_ids if i is not None and 0 <= i < vocab_size]
    special += [i for i in tokenizer.added_tokens_decoder if 0 <= i < vocab_size]
    ids = torch.tensor(sorted(set(chosen) | set(special)), dtype=torch.long)
    return None if len(ids) >= vocab_size else ids


class _Rows:
    """An output layer's weight, readable by rows. An int8 layer's weight is held prepacked by fbgemm and unpacking
    it takes about a second, so it is unpacked once, here, and its integers and scales kept (one byte a weight)."""

    def __init__(self, head: nn.Module) -> None:
        if isinstance(head, nn.Linear):
            self.weight, bias = head.weight.detach(), head.bias
        else:
            self.weight, bias = head._weight_bias()  # the int8 layer's own unpacking, done once (weight() and
            # bias() each unpack anew)
        self.bias = None if bias is None else bias.detach()
        self.layer_type = type(head)  # an int8 layer's class (per-token or per-pass activation scales)
        self.quantized = self.weight.is_quantized
        if self.quantized:
            quantized, self.ints = self.weight, self.weight.int_repr()
            self.per_tensor = quantized.qscheme() == torch.per_tensor_affine
            if self.per_tensor:
                self.scale, self.zero_point = quantized.q_scale(), quantized.q_zero_point()
                self.scales, self.zero_points = torch.tensor([self.scale]), torch.tensor([float(self.zero_point)])
            else:
                self.scales, self.zero_points = quantized.q_per_channel_scales(), quantized.q_per_channel_zero_points()
            self.weight = self.ints  # the integers are all that is kept: no second copy of the quantized tensor

    def float_rows(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Weight rows ``rows`` and their biases as float32 (dequantized for an int8 layer)."""
        bias = None if self.bias is None else self.bias[rows].float()
        if not self.quantized:
            return self.weight[rows].float(), bias
        scales = (self.scales if self.per_tensor else self.scales[rows]).float()[:, None]
        zero_points = (self.zero_points if self.per_tensor else self.zero_points[rows]).float()[:, None]
        return (self.ints[rows].float() - zero_points) * scales, bias

    def restricted(self, rows: torch.Tensor) -> nn.Module:
        """A layer computing outputs ``rows`` only, of the same kind. An int8 layer keeps its integer weights and
        scales, so each kept logit is the one the full layer computes."""
        bias = None if self.bias is None else self.bias[rows].contiguous()
        if not self.quantized:
            weight = self.weight[rows]
            layer = nn.Linear(weight.shape[1], len(rows), bias=bias is not None, dtype=weight.dtype,
                              device=weight.device)  # fmt: skip
            with torch.no_grad():
                layer.weight.copy_(weight)
                if bias is not None:
                    layer.bias.copy_(bias)
            return layer.requires_grad_(False).eval()
        ints = self.ints[rows].contiguous()
        if self.per_tensor:
            kept = torch._make_per_tensor_quantized_tensor(ints, self.scale, self.zero_point)
        else:
            kept = torch._make_per_channel_quantized_tensor(ints, self.scales[rows], self.zero_points[rows], 0)
        layer = self.layer_type(ints.shape[1], len(rows), dtype=torch.qint8)  # the full layer's own kind
        layer.set_weight_bias(kept, bias)
        return layer


class DraftHead:
    """The small model's output layer restricted to a subset of the vocabulary (plus each request's prompt tokens).

    :meth:`logits` returns full-width logits (``-inf`` outside the subset), so samplers, logits processors and the
    acceptance rule read them as they read any logits."""

    def __init__(self, model: PreTrainedModel, ids: torch.Tensor) -> None:
        head = model.get_output_embeddings()
        config = model.config.get_text_config(decoder=True)
        transforms = [name for name in _LOGIT_TRANSFORMS if getattr(config, name, None) not in (None, 1.0)]
        if transforms:
            raise DraftHeadError(
                f"{type(model).__name__} transforms its logits ({', '.join(transforms)}): a reduced draft vocabulary "
                "would score differently from the model; leave draft_vocab unset"
            )
        if not isinstance(head, nn.Linear) and not hasattr(head, "set_weight_bias"):
            raise DraftHeadError(
                f"{type(model).__name__}'s output layer ({type(head).__name__}) is not a linear layer; leave "
                "draft_vocab unset"
            )
        self.rows = _Rows(head)
        self.vocab_size = int(head.out_features)
        self.device = model.device
        self.base_ids = ids.to(self.device)
        self.base = self.rows.restricted(ids)
        self.in_base = torch.zeros(self.vocab_size, dtype=torch.bool)
        self.in_base[ids] = True
        self.extra_ids = torch.empty(0, dtype=torch.long, device=self.device)
        self.extra_weight: torch.Tensor | None = None  # float32 rows of the request's prompt tokens outside the base
        self.extra_bias: torch.Tensor | None = None

    @property
    def size(self) -> int:
        """How many ids the current request's drafts can propose."""
        return len(self.base_ids) + len(self.extra_ids)

    @torch.inference_mode()
    def begin_request(self, prompt_ids: Sequence[int]) -> None:
        """Adds the request's prompt tokens that the base subset lacks (a few rows, float32: no quantization)."""
        prompt = torch.tensor(sorted({i for i in prompt_ids if 0 <= i < self.vocab_size}), dtype=torch.long)
        extra = prompt[~self.in_base[prompt]] if len(prompt) else prompt
        self.extra_ids = extra.to(self.device)
        if not len(extra):
            self.extra_weight = self.extra_bias = None
            return
        self.extra_weight, self.extra_bias = self.rows.float_rows(self.extra_ids)

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Full-width float32 logits for hidden states ``(k, hidden_size)`` -> ``(k, vocab_size)``, ``-inf`` outside
        the subset."""
        rows = hidden.shape[0]
        out = torch.full((rows, self.vocab_size), float("-inf"), dtype=torch.float32, device=hidden.device)
        out[:, self.base_ids] = self.base(hidden).float()
        if self.extra_weight is not None:
            extra = hidden.float() @ self.extra_weight.T
            out[:, self.extra_ids] = extra if self.extra_bias is None else extra + self.extra_bias
        return out


def build_draft_head(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, spec: DraftVocab) -> DraftHead | None:
    """The drafting model's reduced output layer for ``spec``; None when drafts score the whole vocabulary."""
    if spec is None:
        return None
    head = model.get_output_embeddings()
    vocab_size = getattr(head, "out_features", None)
    if not isinstance(vocab_size, int):
        raise DraftHeadError(f"{type(model).__name__} has no linear output layer to restrict; leave draft_vocab unset")
    ids = draft_vocab_ids(spec, tokenizer, vocab_size)
    return DraftHead(model, ids) if ids is not None else None
