"""Exact switch points, driven by scripted models (large writes lower case, small writes upper case)."""

from __future__ import annotations

import pytest
from helpers import PROMPT, scripted_engine

from relaygen_integrations import FinalEvent, SwitchEvent, TextEvent

BASIC = "We add two and three. So the answer is five. Then we are done."


def summary(result) -> list[tuple[str, str, str]]:
    return [(s.model, s.trigger, s.text) for s in result.spans]


def check_invariants(result, tokenizer) -> None:
    assert "".join(s.text for s in result.spans) == result.text
    assert result.text == tokenizer.decode(result.completion_ids)
    assert sum(s.token_count for s in result.spans) == result.usage.completion_tokens == len(result.completion_ids)
    assert result.usage.large_tokens + result.usage.small_tokens == result.usage.completion_tokens
    for a, b in zip(result.spans, result.spans[1:], strict=False):
        assert a.end == b.start and a.model != b.model


def test_cue_hands_sentence_to_small_and_back(tokenizer):
    engine, _, _ = scripted_engine(tokenizer, BASIC)
    result = engine.generate(PROMPT, max_new_tokens=100)
    assert summary(result) == [
        ("large", "start", "We add two and three. So"),
        ("small", "cue:So ", " THE ANSWER IS FIVE."),
        ("large", "sentence_end", " Then we are done."),
    ]
    assert result.finish_reason == "stop"
    assert result.usage.switches == 2
    # Both look-ahead tokens (" the" after "So", " Then" after "FIVE.") were rolled back, not kept.
    assert result.usage.rolled_back_tokens == 2
    check_invariants(result, tokenizer)


def test_comma_variant_keeps_the_comma_with_the_large_model(tokenizer):
    engine, _, _ = scripted_engine(tokenizer, "We add two and three. So, the answer is five. Done.", cues=["So,"])
    result = engine.generate(PROMPT, max_new_tokens=100)
    assert summary(result)[:2] == [
        ("large", "start", "We add two and three. So,"),
        ("small", "cue:So,", " THE ANSWER IS FIVE."),
    ]
    check_invariants(result, tokenizer)


def test_longest_cue_wins_over_its_bare_word(tokenizer):
    engine, _, _ = scripted_engine(
        tokenizer, "We add two and three. Therefore, the answer is five. Done.", cues=["Therefore", "Therefore,"]
    )
    result = engine.generate(PROMPT, max_new_tokens=100)
    assert summary(result)[1][:2] == ("small", "cue:Therefore,")


def test_bare_word_cue_rolls_back_the_punctuation(tokenizer):
    engine, _, _ = scripted_engine(
        tokenizer, "We add two and three. Therefore, the answer is five. Done.", cues=["Therefore"]
    )
    result = engine.generate(PROMPT, max_new_tokens=100)
    assert summary(result)[:2] == [
        ("large", "start", "We add two and three. Therefore"),
        ("small", "cue:Therefore", ", THE ANSWER IS FIVE."),
    ]


@pytest.mark.parametrize(
    "text",
    [
        "I know the rule here. Also it holds. Nowhere does it fail. Done.",  # "now" in "know", "so" in "Also"
        "First we check all cases. Sometimes it is hard. Done.",  # "So" must not fire inside "Sometimes"
    ],
)
def test_cues_respect_word_boundaries(tokenizer, text):
    engine, _, _ = scripted_engine(tokenizer, text, cues=["now", "so", "Now", "So"])
    result = engine.generate(PROMPT, max_new_tokens=100)
    assert summary(result) == [("large", "start", text)]


def test_lowercase_cue_fires_at_a_real_boundary(tokenizer):
    engine, _, _ = scripted_engine(tokenizer, "I know the rule here and now we finish it. Done.", cues=["now"])
    result = engine.generate(PROMPT, max_new_tokens=100)
    assert summary(result)[:2] == [
        ("large", "start", "I know the rule here and now"),
        ("small", "cue:now", " WE FINISH IT."),
    ]


def test_decimal_point_and_abbreviation_do_not_end_a_sentence(tokenizer):
    text = "Look at the numbers. So the value is 3.14 and e.g. more. Then we stop here. Done."
    engine, _, _ = scripted_engine(tokenizer, text)
    result = engine.generate(PROMPT, max_new_tokens=100)
    assert summary(result)[1] == ("small", "cue:So ", " THE VALUE IS 3.14 AND E.G. MORE.")
    assert summary(result)[2][0:2] == ("large", "sentence_end")


def test_list_marker_does_not_end_a_sentence(tokenizer):
    text = "Look at the steps. So we do this:\n1. add them up\n2. divide it. Then done. End."
    engine, _, _ = scripted_engine(tokenizer, text)
    result = engine.generate(PROMPT, max_new_tokens=100)
    assert summary(result)[1] == ("small", "cue:So ", " WE DO THIS:\n1. ADD THEM UP\n2. DIVIDE IT.")


def test_paragraph_break_ends_a_small_sentence(tokenizer):
    text = "Look at the numbers. So the sum is\n\n\\[ 2 + 3 \\]\n\nThen we stop here. Done."
    engine, _, _ = scripted_engine(tokenizer, text)
    result = engine.generate(PROMPT, max_new_tokens=100)
    small = summary(result)[1]
    assert small[0] == "small" and small[2].startswith(" THE SUM IS\n\n")
    assert summary(result)[2][:2] == ("large", "sentence_end")


@pytest.mark.parametrize(("min_tokens", "first_small_at"), [(0, "So"), (5, "We add two. So")])
def test_min_large_tokens_blocks_an_early_cue(tokenizer, min_tokens, first_small_at):
    engine, _, _ = scripted_engine(
        tokenizer, "So we start. We add two. So the answer is five. Done.", min_large_tokens=min_tokens
    )
    result = engine.generate(PROMPT, max_new_tokens=100)
    assert result.spans[0].text.endswith(first_small_at)
    assert result.spans[1].model == "small"


def test_cap_hands_back_to_the_large_model(tokenizer):
    text = "Look at this. So " + " ".join(["word"] * 30) + ". Done."
    engine, _, _ = scripted_engine(tokenizer, text, max_small_tokens=8)
    result = engine.generate(PROMPT, max_new_tokens=200)
    assert [(s.model, s.trigger) for s in result.spans][:3] == [
        ("large", "start"),
        ("small", "cue:So "),
        ("large", "cap"),
    ]
    assert result.spans[1].token_count == 8
    check_invariants(result, tokenizer)


def test_answer_marker_hands_the_rest_to_the_answer_model(tokenizer):
    text = "We think about it for a while. Answer: five is right. So it is. Yes."
    engine, _, _ = scripted_engine(tokenizer, text, cues=["So"], answer_marker="Answer:")
    result = engine.generate(PROMPT, max_new_tokens=100)
    assert summary(result) == [
        ("large", "start", "We think about it for a while. Answer:"),
        ("small", "reasoning_end", " FIVE IS RIGHT. SO IT IS. YES."),
    ]


def test_think_end_starts_the_answer_stage(tokenizer):
    text = "<think>We reason here. So the sum is 5. Fine.</think>The answer is 5."
    engine, _, _ = scripted_engine(tokenizer, text, reasoning_end="</think>")
    result = engine.generate(PROMPT, max_new_tokens=100)
    assert [(s.model, s.trigger) for s in result.spans] == [
        ("large", "start"), ("small", "cue:So "), ("large", "sentence_end"), ("small", "reasoning_end")
    ]  # fmt: skip
    # "</think>" is plain text to this tokenizer, so the token completing it may carry a letter of the next word.
    assert "</think>" in result.spans[-2].text
    assert result.spans[-1].text.endswith("ANSWER IS 5.") and result.spans[-1].text.isupper()


def test_stop_sequence_across_a_switch(tokenizer):
    engine, _, _ = scripted_engine(tokenizer, BASIC)
    events = list(engine.stream(PROMPT, max_new_tokens=100, stop=["So THE"]))
    result = events[-1].result
    assert result.finish_reason == "stop_sequence"
    assert result.text == "We add two and three. "
    assert summary(result) == [("large", "start", "We add two and three. ")]
    streamed = "".join(e.text for e in events if isinstance(e, TextEvent))
    assert streamed == result.text


def test_stop_sequence_inside_one_span(tokenizer):
    engine, _, _ = scripted_engine(tokenizer, BASIC)
    result = engine.generate(PROMPT, max_new_tokens=100, stop=["FIVE", "never"])
    assert result.text == "We add two and three. So THE ANSWER IS "
    assert result.finish_reason == "stop_sequence"
    assert summary(result)[-1] == ("small", "cue:So ", " THE ANSWER IS ")


def test_length_limit(tokenizer):
    engine, _, _ = scripted_engine(tokenizer, BASIC)
    result = engine.generate(PROMPT, max_new_tokens=9)
    assert result.finish_reason == "length"
    assert result.usage.completion_tokens == 9
    check_invariants(result, tokenizer)


def test_stream_events_match_the_result(tokenizer):
    engine, _, _ = scripted_engine(tokenizer, BASIC)
    events = list(engine.stream(PROMPT, max_new_tokens=100))
    assert isinstance(events[-1], FinalEvent)
    result = events[-1].result
    texts = [e for e in events if isinstance(e, TextEvent)]
    switches = [e for e in events if isinstance(e, SwitchEvent)]
    assert "".join(e.text for e in texts) == result.text
    for event in texts:
        assert event.model == result.spans[event.span_index].model
    assert [(s.from_model, s.to_model, s.trigger, s.char_offset) for s in switches] == [
        ("large", "small", "cue:So ", 24),
        ("small", "large", "sentence_end", 44),
    ]
    # Switch events come right before the text of the span they open.
    first_small = next(
        i for i, e in enumerate(events) if getattr(e, "model", None) == "small" and isinstance(e, TextEvent)
    )
    assert isinstance(events[first_small - 1], SwitchEvent)


def test_each_model_forwards_each_token_once(tokenizer):
    engine, large, small = scripted_engine(tokenizer, BASIC)
    result = engine.generate(PROMPT, max_new_tokens=100)
    usage = result.usage
    large_span, small_span, _ = result.spans
    # The small model reads the prompt up to its last token in one pass (as every cold request does), then catches
    # up in one: the last prompt token plus every large token so far (incl. "So").
    assert small.fed[:2] == [usage.prompt_tokens - 1, 1 + large_span.token_count]
    assert usage.small_prefill_tokens == usage.prompt_tokens
    assert usage.small_catchup_tokens == large_span.token_count
    # The large model catches up on the small sentence in one pass, and never re-reads the prompt.
    assert small_span.token_count in large.fed
    assert usage.large_catchup_tokens == small_span.token_count
    assert usage.large_prefill_tokens == usage.prompt_tokens
    total_large_seen = usage.prompt_tokens + usage.completion_tokens
    assert sum(large.fed) <= total_large_seen and sum(small.fed) <= total_large_seen


def test_prefix_cache_is_reused_by_the_next_request(tokenizer):
    engine, large, _ = scripted_engine(tokenizer, BASIC)
    first = engine.generate(PROMPT, max_new_tokens=100)
    large.fed.clear()
    second = engine.generate(PROMPT, max_new_tokens=100)
    assert second.text == first.text
    # Both models kept the shared prompt (all but its last token, which is re-fed for fresh logits).
    assert second.usage.reused_prefix_tokens == 2 * (first.usage.prompt_tokens - 1)
    assert large.fed[0] == 1
    assert second.usage.large_prefill_tokens == 1


def test_a_cold_request_reads_its_prompt_head_in_a_pass_of_its_own(tokenizer):
    # Then a warm request (the prompt cached but its last token) and a cold one run the same passes from the last
    # prompt token on: a pass's shape decides its arithmetic (bf16 wide passes, kernel blocking), so a greedy answer
    # does not depend on what the cache held (tests/test_real_pair.py measures it on the demo pair).
    engine, large, _ = scripted_engine(tokenizer, BASIC)
    cold = engine.generate(PROMPT, max_new_tokens=100, mode="large")
    prompt = cold.usage.prompt_tokens
    assert large.fed[:2] == [prompt - 1, 1] and cold.usage.large_prefill_tokens == prompt
    large.fed.clear()
    warm = engine.generate(PROMPT, max_new_tokens=100, mode="large")
    assert large.fed[0] == 1 and warm.text == cold.text


def test_single_model_modes_never_touch_the_other_model(tokenizer):
    engine, _, small = scripted_engine(tokenizer, BASIC)
    result = engine.generate(PROMPT, max_new_tokens=100, mode="large")
    assert result.text == BASIC and small.fed == [] and [s.model for s in result.spans] == ["large"]
    result = engine.generate(PROMPT, max_new_tokens=100, mode="small")
    assert result.text == BASIC.upper() and [s.model for s in result.spans] == ["small"]


def test_empty_cue_list_is_large_only(tokenizer):
    engine, _, small = scripted_engine(tokenizer, BASIC, cues=[])
    result = engine.generate(PROMPT, max_new_tokens=100)
    assert result.text == BASIC and small.fed == []


def test_reprefill_segments_rereads_everything_at_each_switch(tokenizer):
    engine, large, small = scripted_engine(tokenizer, BASIC)
    cached = engine.generate(PROMPT, max_new_tokens=100)
    large.fed.clear()
    small.fed.clear()
    reprompted = engine.generate(PROMPT, max_new_tokens=100, reprefill_segments=True)
    assert reprompted.text == cached.text and reprompted.spans[1].trigger == cached.spans[1].trigger
    prompt = reprompted.usage.prompt_tokens
    first_large = reprompted.spans[0].token_count
    # The large model re-reads prompt + everything written when it takes over again (no catch-up from its cache),
    # each time in two passes as a cold request does: the prompt up to its last token, then the rest.
    assert large.fed[:2] == [prompt - 1, 1] and large.fed.count(prompt - 1) == 2
    assert 1 + first_large + reprompted.spans[1].token_count in large.fed
    assert small.fed[:2] == [prompt - 1, 1 + first_large]
