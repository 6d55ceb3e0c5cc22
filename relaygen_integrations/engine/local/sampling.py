"""Next-token selection: greedy, or seeded sampling through transformers' logits processors."""

from __future__ import annotations

import torch
from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from ..core.settings import SamplingParams

__all__ = ["Sampler", "SamplingParams", "token_logprobs"]


class Sampler:
    """Turns one position's logits into a token id. One sampler per request: it owns the request's RNG, so a seed
    reproduces the run regardless of what other requests did before."""

    def __init__(self, params: SamplingParams) -> None:
        self.params = params
        self.processors = LogitsProcessorList()
        self.generator: torch.Generator | None = None
        if not params.greedy:
            self.processors.append(TemperatureLogitsWarper(params.temperature))
            if params.top_k is not None:
                self.processors.append(TopKLogitsWarper(params.top_k))
            if params.top_p < 1.0:
                self.processors.append(TopPLogitsWarper(params.top_p))
            self.generator = torch.Generator(device="cpu")
            if params.seed is not None:
                self.generator.manual_seed(params.seed)
            else:
                self.generator.seed()

    def probabilities(self, logits: torch.Tensor, ids: list[int]) -> torch.Tensor:
        """The distribution sampling draws from (after temperature / top-k / top-p), as float32 on the CPU."""
        input_ids = torch.tensor([ids], dtype=torch.long)
        scores = self.processors(input_ids, logits.detach().float().cpu()[None, :])
        return torch.softmax(scores, dim=-1)[0]

    def row_probabilities(self, logits: torch.Tensor, ids: list[int]) -> torch.Tensor:
        """:meth:`probabilities` for every row of 2-D ``logits`` in one call (a speculative check's rows). The
        warpers used here (temperature, top-k, top-p) read no context, so the rows need not carry their own."""
        input_ids = torch.tensor([ids], dtype=torch.long).expand(logits.shape[0], -1)
        scores = self.processors(input_ids, logits.detach().float().cpu())
        return torch.softmax(scores, dim=-1)

    def __call__(self, logits: torch.Tensor, ids: list[int]) -> int:
        if self.params.greedy:
            return int(torch.argmax(logits))
        probs = self.probabilities(logits, ids)
        return int(torch.multinomial(probs, num_samples=1, generator=self.generator))


def token_logprobs(rows: torch.Tensor, tokens: list[int], top: int) -> list[tuple[float, list[tuple[int, float]]]]:
    """For each row of 2-D ``rows`` (one position's logits each) and the token chosen there: the token's log
    probability (float32 log-softmax of the raw logits: the model's distribution, before temperature, top-k and
    top-p) and the ``top`` most likely tokens with theirs. All rows in one call and one host transfer (a
    speculative round's rows); only requests that ask for log probabilities pay it."""
    logprobs = torch.log_softmax(rows[: len(tokens)].detach().float(), dim=-1)
    chosen = logprobs.gather(1, torch.tensor(tokens, device=logprobs.device)[:, None])[:, 0].tolist()
    if not top:
        return [(value, []) for value in chosen]
    values, ids = logprobs.topk(top, dim=-1)
    return [
        (value, list(zip(row_ids, row_values, strict=True)))
        for value, row_ids, row_values in zip(chosen, ids.tolist(), values.tolist(), strict=True)
    ]
