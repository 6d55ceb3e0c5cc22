"""Verified relay: the large model checks each small segment in its catch-up pass and rewrites from the first token
it rejects. Exact cuts on scripted models (large writes lower case; the small model's text differs where chosen),
losslessness of the greedy rule on a tiny random-weight fp32 pair, and the rules themselves on hand-made logits."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from helpers import PROMPT, scripted_engine, tiny_qwen2

from relaygen_integrations import FinalEvent, RelayEngine, SwitchEvent, TextEvent
from relaygen_integrations.engine import GenerationError, SettingsError, merge_settings
from relaygen_integrations.engine.core.configuration import PairConfiguration
from relaygen_integrations.engine.core.shipped import shipped_profile
from relaygen_integrations.engine.core.verify import VerifyRule

REPO = Path(__file__).resolve().parents[1]  # the benchmark data the shipped profile cites
LARGE = "We add two and three. So the answer is five. Then we are done."
WRONG = "We add two and three. So the answer is nine. Then we are done."  # one wrong word, of the same length


def spans(result) -> list[tuple[str, str, str]]:
    return [(s.model, s.trigger, s.text) for s in result.spans]


def check_invariants(result, tokenizer) -> None:
    assert "".join(s.text for s in result.spans) == result.text == tokenizer.decode(result.completion_ids)
    assert sum(s.token_count for s in result.spans) == result.usage.completion_tokens == len(result.completion_ids)
    assert result.usage.large_tokens + result.usage.small_tokens == result.usage.completion_tokens


def test_a_wrong_token_mid_segment_is_cut_and_the_large_model_writes_from_there(tokenizer):
    engine, _, _ = scripted_engine(tokenizer, LARGE, small_text=WRONG)
    plain = engine.generate(PROMPT, max_new_tokens=100)
    assert plain.text == WRONG
    verified = engine.generate(PROMPT, max_new_tokens=100, verify="greedy")
    assert verified.text == LARGE
    assert spans(verified) == [
        ("large", "start", "We add two and three. So"),
        ("small", "cue:So ", " the answer is"),
        ("large", "rejected", " five. Then we are done."),
    ]
    usage = verified.usage
    assert usage.rejected_tokens >= 1 and usage.verified_tokens == 3  # " the", " answer", " is" passed the check
    assert usage.small_tokens == 3 and usage.switches == 2
    check_invariants(verified, tokenizer)


def test_a_wholly_rejected_segment_leaves_one_large_span(tokenizer):
    engine, _, _ = scripted_engine(tokenizer, LARGE)  # the small model writes upper case: its first token differs
    result = engine.generate(PROMPT, max_new_tokens=100, verify="prob:0.05")
    assert result.text == LARGE and spans(result) == [("large", "start", LARGE)]
    assert result.usage.small_tokens == 0 and result.usage.switches == 0 and result.usage.rejected_tokens > 0
    check_invariants(result, tokenizer)


def test_agreeing_segments_pass_untouched(tokenizer):
    engine, _, _ = scripted_engine(tokenizer, LARGE, small_text=LARGE)
    plain = engine.generate(PROMPT, max_new_tokens=100)
    verified = engine.generate(PROMPT, max_new_tokens=100, verify="ratio:0.5")
    assert spans(verified) == spans(plain) and verified.completion_ids == plain.completion_ids
    assert verified.usage.rejected_tokens == 0 and verified.usage.verified_tokens == plain.usage.small_tokens > 0


def test_the_stream_never_shows_rejected_text(tokenizer):
    engine, _, _ = scripted_engine(tokenizer, LARGE, small_text=WRONG)
    events = list(engine.stream(PROMPT, max_new_tokens=100, verify="greedy"))
    result = events[-1].result
    assert isinstance(events[-1], FinalEvent) and result.text == LARGE
    texts = [e for e in events if isinstance(e, TextEvent)]
    assert "".join(e.text for e in texts) == result.text and not any("nine" in e.text for e in texts)
    # Each piece is tagged with the span that holds it; each switch is announced before its span's first text.
    for event in texts:
        assert event.text in result.spans[event.span_index].text
    switches = [(e.from_model, e.to_model, e.trigger) for e in events if isinstance(e, SwitchEvent)]
    assert switches == [("large", "small", "cue:So "), ("small", "large", "rejected")]


def test_a_stop_sequence_inside_a_rejected_tail_no_longer_ends_the_text(tokenizer):
    engine, _, _ = scripted_engine(tokenizer, LARGE, small_text=WRONG)
    stopped = engine.generate(PROMPT, max_new_tokens=100, stop="nine")
    assert stopped.text == "We add two and three. So the answer is " and stopped.finish_reason == "stop_sequence"
    verified = engine.generate(PROMPT, max_new_tokens=100, stop="nine", verify="greedy")
    assert verified.text == LARGE and verified.finish_reason == "stop"
    # A stop sequence the verified text does contain still ends it, across the cut.
    cut = engine.generate(PROMPT, max_new_tokens=100, stop="five", verify="greedy")
    assert cut.text == "We add two and three. So the answer is " and cut.finish_reason == "stop_sequence"
    assert "".join(s.text for s in cut.spans) == cut.text and cut.spans[-1].trigger == "rejected"


def test_the_budget_ending_inside_a_small_run_is_checked_too(tokenizer):
    engine, _, _ = scripted_engine(tokenizer, LARGE, small_text=WRONG)
    reference = engine.generate(PROMPT, max_new_tokens=100, verify="greedy")
    budget = len(reference.completion_ids) - 4
    capped = engine.generate(PROMPT, max_new_tokens=budget, verify="greedy")
    assert capped.finish_reason == "length" and capped.completion_ids == reference.completion_ids[:budget]


def test_speculation_and_verification_together(tokenizer):
    engine, _, _ = scripted_engine(tokenizer, LARGE, small_text=WRONG)
    result = engine.generate(PROMPT, max_new_tokens=100, verify="greedy", speculative=4)
    assert result.text == LARGE and result.usage.rejected_tokens >= 1 and result.usage.speculative_rounds > 0
    check_invariants(result, tokenizer)


def test_the_answer_stage_is_checked_only_when_asked(tokenizer):
    text = "<think>We add. So it is five.</think>The answer is five."
    wrong = "<think>We add. So it is five.</think>The answer is nine."
    engine, _, _ = scripted_engine(tokenizer, text, small_text=wrong, reasoning_end="</think>")
    assert engine.generate(PROMPT, max_new_tokens=100, verify="greedy").text == wrong
    checked = engine.generate(PROMPT, max_new_tokens=100, verify="greedy+answer")
    assert checked.text == text and checked.spans[-1].model == "large" and checked.spans[-1].trigger == "rejected"
    check_invariants(checked, tokenizer)


@pytest.fixture(scope="module")
def pair(tokenizer):
    return tiny_qwen2(tokenizer, seed=1, hidden=64, layers=2), tiny_qwen2(tokenizer, seed=2, hidden=32, layers=1)


@pytest.mark.parametrize("speculative", [False, 4])
def test_greedy_verification_writes_the_large_models_greedy_text_on_an_fp32_pair(tokenizer, pair, speculative):
    messages = [{"role": "user", "content": "Count the apples: two and three. So how many?"}]
    probe = RelayEngine.from_models(*pair, tokenizer, cues=[])
    large = probe.generate(messages, max_new_tokens=48, mode="large")
    # Cues from the large model's own greedy text are sure to fire on random weights.
    cues = sorted(set(re.findall(r"(?<![\w])[A-Za-z]{2,}(?![\w])", large.text)))
    engine = RelayEngine.from_models(
        *pair, tokenizer, cues=cues, policy={"min_large_tokens": 1, "max_small_tokens": 4}, draft_confidence=0.0
    )
    relay = engine.generate(messages, max_new_tokens=48)
    verified = engine.generate(messages, max_new_tokens=48, verify="greedy", speculative=speculative)
    assert relay.usage.small_tokens > 0 and relay.completion_ids != large.completion_ids  # the relay does differ
    assert verified.completion_ids == large.completion_ids
    assert verified.usage.verified_tokens + verified.usage.rejected_tokens > 0
    check_invariants(verified, tokenizer)


def test_rules_on_hand_made_logits():
    logits = torch.log(torch.tensor([[0.6, 0.3, 0.1], [0.5, 0.45, 0.05], [0.9, 0.05, 0.05]]))
    assert VerifyRule.parse("greedy").first_rejected(logits, [0, 1, 0]) == 1
    assert VerifyRule.parse("prob:0.2").first_rejected(logits, [1, 1, 1]) == 2
    assert VerifyRule.parse("ratio:0.6").first_rejected(logits, [1, 1, 0]) == 0  # 0.3 < 0.6 * 0.6
    assert VerifyRule.parse("ratio:0.4").first_rejected(logits, [1, 1, 0]) is None
    assert (
        VerifyRule.parse("prob:0.05+answer").answer and VerifyRule.parse("prob:0.05+answer").spec == "prob:0.05+answer"
    )


@pytest.mark.parametrize("value", ["sometimes", "prob", "prob:1.5", "greedy:0.1", "ratio:x", "prob:0.1+all", 3])
def test_bad_verify_settings_are_refused_before_any_work(value):
    with pytest.raises(SettingsError, match="verify"):
        merge_settings({"verify": value})
    assert merge_settings({"verify": "off"}).verify is False
    assert merge_settings({"verify": True}).verify.rule == "greedy"
    assert merge_settings({}).verify is None  # unset: the engine's default


def test_verification_is_for_the_relay_and_local_models_only(tokenizer):
    engine, _, _ = scripted_engine(tokenizer, LARGE, small_text=WRONG)
    alone = engine.generate(PROMPT, max_new_tokens=100, mode="small", verify="greedy")
    assert alone.text == WRONG and alone.usage.verified_tokens == 0  # one model alone has no one to check it
    assert isinstance(GenerationError("x"), ValueError)


def test_both_adapters_and_the_cli_carry_the_setting(tokenizer, monkeypatch, capsys):
    from relaygen_integrations.cli.main import main
    from relaygen_integrations.langchain import RelayChatModel
    from relaygen_integrations.llama_index import RelayLLM

    engine, _, _ = scripted_engine(tokenizer, LARGE, small_text=WRONG)
    assert RelayChatModel(engine=engine).invoke("Solve it.").content == WRONG
    message = RelayChatModel(engine=engine, verify="greedy").invoke("Solve it.")
    assert message.content == LARGE and message.response_metadata["relaygen"]["usage"]["rejected_tokens"] >= 1
    assert RelayChatModel(engine=engine).invoke("Solve it.", verify="greedy").content == LARGE  # per call too
    assert RelayLLM(engine=engine, verify="greedy").complete("Solve it.").text == LARGE
    monkeypatch.setattr(RelayEngine, "shared", classmethod(lambda cls, *args, **kwargs: engine))
    assert main(["generate", "Solve it.", "--json", "--cues", "So ,Now", "--verify", "greedy"]) == 0
    assert json.loads(capsys.readouterr().out)["text"] == LARGE


def test_the_engine_default_rule_applies_to_requests_that_leave_verify_unset(tokenizer):
    scripted, _, _ = scripted_engine(tokenizer, LARGE, small_text=WRONG)
    engine = RelayEngine(scripted.backend, tokenizer, scripted.cues, verify="greedy")
    assert engine.verify == VerifyRule(rule="greedy")
    assert engine.generate(PROMPT, max_new_tokens=100).text == LARGE  # unset: the engine's rule checks "nine"
    assert engine.generate(PROMPT, max_new_tokens=100, verify="off").text == WRONG  # "off" wins over the default
    assert engine.generate(PROMPT, max_new_tokens=100, verify=False).text == WRONG
    assert scripted.generate(PROMPT, max_new_tokens=100).text == WRONG  # an engine built without a rule: off
    with pytest.raises(SettingsError, match="verify"):
        RelayEngine(scripted.backend, tokenizer, scripted.cues, verify="prob:2")


def test_the_demo_pair_ships_the_rule_its_benchmark_chose():
    """The rule the demo pair gets is read from its benchmark's results, not from the profile that names it: of the
    rules the benchmark ran, the one run on every problem the large model ran that solves as many (the others lost
    problems and were stopped early, docs/benchmarks.md#verified-relay)."""
    profile = shipped_profile("demo").data
    benchmark = profile["verify"]["benchmark"]
    assert benchmark.startswith("benchmarks/data/")  # where the choice is measured
    summary = json.loads((REPO / benchmark / "results.json").read_text(encoding="utf-8"))["summary"]
    large = summary["large"]
    keeping = [
        mode.removeprefix("relay+verify@")
        for mode, row in summary.items()
        if mode.startswith("relay+verify@") and row["n"] == large["n"] and row["accuracy"] >= large["accuracy"]
    ]
    rule = PairConfiguration.shipped("demo").verify
    assert len(keeping) == 1 and rule == keeping[0], (keeping, rule)
    assert VerifyRule.parse(rule).spec == rule
    assert PairConfiguration.shipped(None).verify is None and PairConfiguration.shipped("no-such-pair").verify is None
