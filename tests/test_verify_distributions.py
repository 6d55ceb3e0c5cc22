"""Verification rules on real distributions: the tiny fp32 pair's large model scores a small-model run, and the
engine must cut exactly where an independent forward pass of the large model says the rule rejects.

The scripted models of ``test_verify.py`` put all their mass on one token, so there ``prob:TAU`` and ``ratio:TAU``
cut where ``greedy`` does. Here the large model's softmax is a real one (its top probability ranges from 0.1 to 0.99
on this prompt), and the cut of each rule is recomputed from one full, cache-free forward pass over the prompt and
the unverified relay text, by the rule's definition (``engine/core/verify.py``): ``prob`` rejects ``p(x) < TAU``,
``ratio`` rejects ``p(x) < TAU * max(p)``.

The fixture's own small model is an independent random model: the large model gives each of its tokens a
probability of about 0, so every rule rejects its first token. A second drafter - a copy of the large model with
noise on its output head - agrees with it often but not always, so the rules cut at different places.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from relaygen_integrations import RelayEngine

MESSAGES = [{"role": "user", "content": "Count the apples: two and three. So how many?"}]
CUE = "deploy"  # the large model's first token on this prompt is ".deploy": the small model takes over after it
CAP = 8  # the small run ends at its cap (min_large_tokens=1: the cue fires after one large token)
SPECS = ["greedy", "prob:0.005", "prob:0.1", "prob:0.5", "prob:0.7", "ratio:0.01", "ratio:0.2", "ratio:0.5"]


@pytest.fixture(scope="module")
def drafters(pair) -> dict[str, Any]:
    large, small = pair
    noisy = copy.deepcopy(large)
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        weight = noisy.lm_head.weight
        weight.add_(torch.randn(weight.shape, generator=generator) * weight.std() * 0.5)
    return {"fixture small": small, "noisy copy": noisy}


@pytest.fixture(scope="module")
def engines(pair, tokenizer, drafters) -> dict[str, RelayEngine]:
    policy = {"min_large_tokens": 1, "max_small_tokens": CAP}
    return {
        name: RelayEngine.from_models(pair[0], d, tokenizer, cues=[CUE], policy=policy) for name, d in drafters.items()
    }


def small_run(engine: RelayEngine) -> tuple[list[int], list[int], int]:
    """The unverified relay's ids (prompt + completion), where its first small run starts in the completion, and
    how long it is."""
    plain = engine.generate(MESSAGES, max_new_tokens=48, verify="off")
    spans = [(s.model, s.trigger, s.token_count) for s in plain.spans]
    assert spans[:2] == [("large", "start", 1), ("small", f"cue:{CUE}", CAP)], spans
    return engine.encode_messages(MESSAGES), plain.completion_ids, 1


def independent_scores(large, ids: list[int], first: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The large model's probability of each of ``ids[first:first + count]`` and its top probability there, from
    one full forward pass with no cache (row ``first + j - 1`` predicts ``ids[first + j]``)."""
    with torch.no_grad():
        logits = large(torch.tensor([ids[: first + count]])).logits[0, first - 1 : first + count - 1]
    probs = torch.softmax(logits.float(), dim=-1)
    chosen = probs.gather(1, torch.tensor(ids[first : first + count])[:, None])[:, 0]
    return chosen, probs.max(dim=-1).values


def expected_cut(spec: str, chosen: torch.Tensor, top: torch.Tensor) -> int | None:
    """The first rejected index by the rule's definition, or None; each bound must be clear of rounding."""
    if spec == "greedy":
        rejected = [bool(c < t) for c, t in zip(chosen.tolist(), top.tolist(), strict=True)]
    else:
        name, tau = spec.split(":")
        bounds = [float(tau) * (t if name == "ratio" else 1.0) for t in top.tolist()]
        for c, b in zip(chosen.tolist(), bounds, strict=True):
            assert abs(c - b) > 1e-4 * b, f"p={c} is too close to the bound {b} for an unambiguous test"
        rejected = [c < b for c, b in zip(chosen.tolist(), bounds, strict=True)]
    return rejected.index(True) if True in rejected else None


@pytest.mark.parametrize("budget", [1 + CAP, 48], ids=["run-ends-at-budget", "catch-up-mid-generation"])
@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("drafter", ["fixture small", "noisy copy"])
def test_the_engine_cuts_where_an_independent_pass_says_the_rule_rejects(pair, engines, drafter, spec, budget):
    large, engine = pair[0], engines[drafter]
    prompt_ids, plain, start = small_run(engine)
    first = len(prompt_ids) + start
    chosen, top = independent_scores(large, prompt_ids + plain, first, CAP)
    cut = expected_cut(spec, chosen, top)

    verified = engine.generate(MESSAGES, max_new_tokens=budget, verify=spec)
    usage = verified.usage
    spans = [(s.model, s.trigger, s.token_count) for s in verified.spans]
    kept = start + (CAP if cut is None else cut)
    assert verified.completion_ids[:kept] == plain[:kept]  # everything before the cut is the small run's own
    if cut is None:
        assert usage.rejected_tokens == 0 and usage.verified_tokens == CAP
        return
    assert usage.rejected_tokens == CAP - cut and usage.verified_tokens == cut
    # At the cut the large model writes its own (greedy) choice from the row that rejected the small token (under
    # prob:0.7 that is the very token it rejected: its own top choice, at p = 0.63 < 0.7).
    with torch.no_grad():
        row = large(torch.tensor([prompt_ids + plain[: start + cut]])).logits[0, -1]
    assert verified.completion_ids[start + cut] == int(torch.argmax(row))
    if cut == 0:  # the whole run rejected: one large span
        assert spans == [("large", "start", budget)]
    else:
        assert spans == [
            ("large", "start", start),
            ("small", f"cue:{CUE}", cut),
            ("large", "rejected", budget - start - cut),
        ]
    assert usage.small_tokens == cut and len(verified.completion_ids) == budget


def test_the_rules_cut_at_different_places_on_these_distributions(pair, engines):
    """Not greedy in disguise: on the noisy drafter's run the rules' cuts differ from each other and from greedy's,
    and the fixture's own small model has every token rejected (p ~ 0 under the large model)."""
    cuts = {}
    for name, engine in engines.items():
        prompt_ids, plain, start = small_run(engine)
        chosen, top = independent_scores(pair[0], prompt_ids + plain, len(prompt_ids) + start, CAP)
        cuts[name] = {spec: expected_cut(spec, chosen, top) for spec in SPECS}
    assert set(cuts["fixture small"].values()) == {0}
    noisy = cuts["noisy copy"]
    assert len(set(noisy.values())) >= 3, noisy
    assert any(noisy[s] != noisy["greedy"] for s in SPECS if s.startswith("prob:")), noisy
    assert any(noisy[s] != noisy["greedy"] for s in SPECS if s.startswith("ratio:")), noisy
