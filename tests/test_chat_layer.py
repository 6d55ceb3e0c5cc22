"""The shared chat layer: prompt rendering with tools and prefills, Hermes tool-call parsing (whole and streamed)."""

from __future__ import annotations

import pytest

from relaygen_integrations.chat.tool_calls import (
    InvalidToolCall,
    ToolCall,
    ToolCallStreamParser,
    ToolSchemaError,
    forced_prefix,
    parse_tool_calls,
    validate_tools,
)
from relaygen_integrations.engine.core.prompt import MessageError, render_prompt_ids, render_prompt_text

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def test_parse_content_and_tool_calls():
    text = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    out = parse_tool_calls(text)
    assert out.content == "Let me check.\n"  # unstripped, so a stream's text adds up to the same content
    assert [(c.name, c.arguments) for c in out.tool_calls] == [("get_weather", {"city": "Paris"})]
    assert out.tool_calls[0].id.startswith("call_") and len(out.tool_calls[0].id) == 29


def test_malformed_tool_call_is_kept_as_invalid_not_raised():
    out = parse_tool_calls('<tool_call>\n{"name": "get_weather", "arguments": {"city": Paris}}\n</tool_call>')
    assert out.tool_calls == []
    assert len(out.invalid_tool_calls) == 1 and "not valid JSON" in out.invalid_tool_calls[0].error
    out = parse_tool_calls('<tool_call>{"arguments": {}}</tool_call>')
    assert "no 'name'" in out.invalid_tool_calls[0].error


def test_arguments_as_json_string_and_unclosed_call():
    out = parse_tool_calls('<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>')
    assert out.tool_calls[0].arguments == {"x": 1}
    out = parse_tool_calls('<tool_call>\n{"name": "f", "arguments": {"x": 2}}')
    assert out.tool_calls[0].arguments == {"x": 2}


def test_plain_text_is_untouched():
    assert parse_tool_calls("No tools here, 3 < 4.").content == "No tools here, 3 < 4."


def test_stream_parser_never_leaks_half_a_tag():
    text = 'Sure <tool_call>{"name": "f", "arguments": {}}</tool_call> done <tool'
    parser = ToolCallStreamParser()
    pieces = []
    for ch in text:
        pieces.extend(parser.feed(ch))
    pieces.extend(parser.finish())
    content = "".join(p for p in pieces if isinstance(p, str))
    assert content == "Sure  done <tool"
    assert [p.name for p in pieces if isinstance(p, ToolCall)] == ["f"]
    assert not [p for p in pieces if isinstance(p, InvalidToolCall)]


def test_forced_prefixes():
    tools = [WEATHER]
    assert forced_prefix(None, tools) is None and forced_prefix("auto", tools) is None
    assert forced_prefix("any", tools) == '<tool_call>\n{"name": "' == forced_prefix("required", tools)
    assert forced_prefix("get_weather", tools) == '<tool_call>\n{"name": "get_weather", "arguments": {'
    assert forced_prefix({"type": "function", "function": {"name": "get_weather"}}, tools).endswith('"arguments": {')
    with pytest.raises(ToolSchemaError, match="names no bound tool"):
        forced_prefix("nope", tools)


@pytest.mark.parametrize(
    "bad",
    [
        {"name": "x"},
        {"type": "function", "function": {}},
        {"type": "function", "function": {"name": "x", "parameters": []}},
    ],
)
def test_malformed_tool_schema_is_named(bad):
    with pytest.raises(ToolSchemaError):
        validate_tools([bad])


def test_template_renders_tools_tool_calls_and_tool_results(tokenizer):
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
        },
        {"role": "tool", "content": "18 C and sunny"},
    ]
    text = render_prompt_text(tokenizer, messages, tools=[WEATHER])
    assert '"name": "get_weather"' in text and "<tool_response>\n18 C and sunny\n</tool_response>" in text
    assert text.endswith("<|im_start|>assistant\n")
    ids = render_prompt_ids(tokenizer, messages[:1], tools=[WEATHER], assistant_prefix="<tool_call>\n")
    assert tokenizer.decode(ids).endswith("<|im_start|>assistant\n<tool_call>\n")


@pytest.mark.parametrize(
    ("messages", "message"),
    [
        ([], "empty"),
        ([{"role": "wizard", "content": "x"}], "unknown role 'wizard'"),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}], "type 'image_url'.*text only"),
        ([{"role": "user", "content": [{"type": "text", "text": 3}]}], r"content\[0\]\.text must be a string"),
        ([{"role": "user", "content": []}], "empty list of content parts"),
        ("hello", "list of"),
    ],
)
def test_bad_messages_are_named(tokenizer, messages, message):
    with pytest.raises(MessageError, match=message):
        render_prompt_text(tokenizer, messages)


def test_text_parts_and_the_developer_role_render_as_text_and_system(tokenizer):
    plain = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi\nthere"}]
    parts = [
        {"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
        {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "text", "text": "there"}]},
    ]
    assert render_prompt_ids(tokenizer, parts) == render_prompt_ids(tokenizer, plain)


def test_a_non_text_part_is_refused_naming_where_it_is(tokenizer):
    parts = [{"type": "text", "text": "look"}, {"type": "input_audio", "input_audio": {}}]
    with pytest.raises(MessageError) as refused:
        render_prompt_text(tokenizer, [{"role": "user", "content": "a"}, {"role": "user", "content": parts}])
    assert refused.value.field == "messages[1].content[1].type" and "input_audio" in str(refused.value)


def _scripted(tokenizer, reference: str, prefix: str = ""):
    from helpers import PROMPT, ScriptedLM

    from relaygen_integrations import RelayEngine

    prompt_ids = render_prompt_ids(tokenizer, PROMPT, tools=[WEATHER], assistant_prefix=prefix or None)
    large = ScriptedLM(tokenizer, reference, len(prompt_ids))
    small = ScriptedLM(tokenizer, reference.upper(), len(prompt_ids))
    return RelayEngine.from_models(large, small, tokenizer, cues=[]), PROMPT


@pytest.mark.parametrize("prefix_choice", [None, "any", "get_weather"])
def test_stream_chat_yields_tool_calls_with_stable_ids(tokenizer, prefix_choice):
    from relaygen_integrations.chat.relay_chat import prepare_chat, stream_chat
    from relaygen_integrations.engine.core.settings import merge_settings

    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    request = prepare_chat(
        [{"role": "user", "content": "Solve it."}],
        merge_settings({"max_new_tokens": 80, "constrain": False}),  # the prefill path (constrained: test_grammar.py)
        [WEATHER],
        tool_choice=prefix_choice,
    )
    engine, _ = _scripted(
        tokenizer, "Checking. " + call if request.prefix is None else call[len(request.prefix) :], request.prefix or ""
    )
    deltas = list(stream_chat(engine, request))
    final = deltas[-1]
    streamed_calls = [d.tool_call for d in deltas if d.tool_call is not None]
    assert [(c.name, c.arguments) for c in final.parsed.tool_calls] == [("get_weather", {"city": "Paris"})]
    assert [c.id for c in streamed_calls] == [c.id for c in final.parsed.tool_calls]
    assert "".join(d.text for d in deltas) == final.parsed.content
    assert final.parsed.content == ("Checking. " if request.prefix is None else "")


FENCED = 'I will call it.\n```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```\n'


def feed_in_pieces(parser: ToolCallStreamParser, text: str, size: int = 3) -> list:
    pieces = []
    for i in range(0, len(text), size):
        pieces.extend(parser.feed(text[i : i + size]))
    return pieces + list(parser.finish())


def test_fenced_json_naming_a_bound_tool_is_a_tool_call():
    pieces = feed_in_pieces(ToolCallStreamParser({"get_weather"}), FENCED)
    calls = [p for p in pieces if isinstance(p, ToolCall)]
    assert [(c.name, c.arguments) for c in calls] == [("get_weather", {"city": "Paris"})]
    assert "".join(p for p in pieces if isinstance(p, str)) == "I will call it.\n\n"
    out = parse_tool_calls(FENCED, tool_names=["get_weather"])
    assert out.tool_calls[0].name == "get_weather" and "```" not in out.content


@pytest.mark.parametrize(
    ("text", "names"),
    [
        (FENCED, ()),  # no tools bound: fences are plain text
        (FENCED.replace("get_weather", "other_tool"), ("get_weather",)),  # not a bound tool
        ("Code:\n```python\nprint('hi')\n```\nDone.", ("get_weather",)),  # ordinary code block
    ],
)
def test_other_fenced_blocks_stay_text(text, names):
    pieces = feed_in_pieces(ToolCallStreamParser(names), text)
    assert not [p for p in pieces if not isinstance(p, str)]
    assert "".join(pieces) == text


def test_unclosed_fence_at_the_end_still_parses():
    text = FENCED.rstrip("\n").removesuffix("```")
    out = parse_tool_calls(text, tool_names=["get_weather"])
    assert [c.name for c in out.tool_calls] == ["get_weather"]


def test_call_without_closing_tag_keeps_the_call_and_the_prose():
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "東京"}}\nThe weather is nice.'
    out = parse_tool_calls(text)
    assert [(c.name, c.arguments) for c in out.tool_calls] == [("get_weather", {"city": "東京"})]
    assert out.content.strip() == "The weather is nice." and out.invalid_tool_calls == []
