"""Tool calls of other chat-template families - Llama 3.x JSON calls, Mistral's ``[TOOL_CALLS]`` list and its v11
``[TOOL_CALLS]name[ARGS]{...}`` form - on the tiny random-weight pair, with each family's own chat template
(``fixtures/chat_templates/``): the format is read from the template, the output is parsed (whole and streamed;
malformed calls kept as invalid), calls render back through the template as the model writes them, and under the
grammar the random model writes a valid call of the family. A tokenizer that declares a ``response_template``
(transformers 5.x) has its calls read by transformers' own parser.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

import pytest
from family_tokenizers import FAMILIES, family_pair, family_tokenizer, load_family_tokenizer
from pydantic import BaseModel, Field

from relaygen_integrations import RelayEngine
from relaygen_integrations.chat.constraints import turn_grammar
from relaygen_integrations.chat.relay_chat import prepare_chat, prepare_turn, stream_chat
from relaygen_integrations.chat.tool_calls import InvalidToolCall, ToolCall, assistant_tool_calls_for_template
from relaygen_integrations.chat.tool_formats import (
    HERMES,
    TOOL_FORMATS,
    ResponseTemplateError,
    chat_parser,
    chat_tool_format,
    detect_tool_format,
)
from relaygen_integrations.chat.tool_formats.declared import DeclaredParser
from relaygen_integrations.engine.constraints.grammar import GrammarTokenizer
from relaygen_integrations.engine.core.prompt import render_prompt_text
from relaygen_integrations.engine.core.settings import ToolFormatName, merge_settings

MESSAGES = [{"role": "user", "content": "What is the weather like by the sea?"}]


def function_tool(name: str, parameters: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {"name": name, "description": f"The {name} tool.", "parameters": parameters},
    }


def plain_tool(name: str, properties: dict[str, Any]) -> dict[str, Any]:
    return function_tool(name, {"type": "object", "properties": properties, "required": list(properties)})


class Weather(BaseModel):
    """Arguments whose every value is bounded, so that even a random model finishes them."""

    place: Literal["sea", "sky", "sun"]
    note: str = Field(max_length=8)
    hours: int = Field(ge=0, le=99)


DESCRIBE = function_tool("describe", Weather.model_json_schema())
SETTLE = plain_tool("settle", {"ok": {"type": "boolean"}})
WEATHER = plain_tool("get_weather", {"city": {"type": "string"}})
ADD = plain_tool("add", {"a": {"type": "integer"}, "b": {"type": "integer"}})

# The start of every call each family writes (under a grammar, without text before it).
CALL_START = {"llama3_json": '{"name": "', "mistral": '[TOOL_CALLS] [{"name": "', "mistral_v11": "[TOOL_CALLS]"}


# -- which format ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_the_format_is_read_from_the_chat_template(family):
    assert chat_tool_format(family_tokenizer(family)).name == family


def test_hermes_where_the_template_says_so_or_names_no_format(tokenizer):
    assert chat_tool_format(tokenizer) is HERMES  # the demo pair's Qwen template writes <tool_call>
    assert detect_tool_format("{{ messages[0]['content'] }}") is HERMES  # renders no tools: as before formats
    # The setting names a format explicitly, whatever the template says.
    assert chat_tool_format(tokenizer, "mistral_v11").name == "mistral_v11"
    assert set(get_args(ToolFormatName)) == set(TOOL_FORMATS)


# -- parsing ----------------------------------------------------------------------------------------------------------
def parse(family: str, text: str, size: int | None = None) -> tuple[str, list[ToolCall], list[InvalidToolCall]]:
    """The content, calls and invalid calls of ``text``, fed whole or in pieces of ``size`` characters."""
    parser = TOOL_FORMATS[family].parser(["get_weather"])
    pieces = [text] if size is None else [text[i : i + size] for i in range(0, len(text), size)]
    out = [piece for chunk in pieces for piece in parser.feed(chunk)] + list(parser.finish())
    content = "".join(piece for piece in out if isinstance(piece, str))
    return content, [p for p in out if isinstance(p, ToolCall)], [p for p in out if isinstance(p, InvalidToolCall)]


PARIS = ("get_weather", {"city": "Paris"})
PARSES = [
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Paris"}}', "", [PARIS], None),
    ("llama3_json", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}', "", [PARIS], None),
    ("llama3_json", '{"name": "a", "parameters": {}}; {"name": "b", "parameters": {"x": 1}}', "",
     [("a", {}), ("b", {"x": 1})], None),
    ("llama3_json", "It is sunny {mostly} in Paris.", "It is sunny {mostly} in Paris.", [], None),
    # A built-in tool's Python call is not read here: it stays text, tag and all.
    ("llama3_json", '<|python_tag|>brave_search.call(query="Paris")', '<|python_tag|>brave_search.call(query="Paris")',
     [], None),
    # An answer written as JSON is no call, even with a "name" field.
    ("llama3_json", '{"name": "Paris", "temperature": 18}', '{"name": "Paris", "temperature": 18}', [], None),
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": Paris}}', "", [], "not valid JSON"),
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Par', "", [], "not valid JSON"),
    ("llama3_json", '{"name": "get_weather", "parameters": "[1]"}', "", [], "not a JSON object"),
    ("mistral", '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}]', "", [PARIS], None),
    ("mistral", 'Let me look. [TOOL_CALLS] [{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"x": 1}}]',
     "Let me look. ", [("a", {}), ("b", {"x": 1})], None),
    ("mistral", "No call here, [TOOL", "No call here, [TOOL", [], None),
    ("mistral", '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": Paris}}]', "", [], "not valid JSON"),
    ("mistral", '[TOOL_CALLS] [{"arguments": {"city": "Paris"}}]', "", [], "no 'name'"),
    ("mistral_v11", '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}', "", [PARIS], None),
    ("mistral_v11", 'Looking.[TOOL_CALLS]a[ARGS]{}[TOOL_CALLS]b[ARGS]{"x": 1} Done.', "Looking. Done.",
     [("a", {}), ("b", {"x": 1})], None),
    ("mistral_v11", '[TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]{"city": "Paris"}', "", [PARIS], None),
    ("mistral_v11", '[TOOL_CALLS]get_weather[ARGS]{"city": Paris}', "", [], "not valid JSON"),
    ("mistral_v11", "[TOOL_CALLS]get_weather", "", [], "no [ARGS]"),
]  # fmt: skip


@pytest.mark.parametrize(("family", "text", "content", "calls", "error"), PARSES)
def test_each_family_parses_whole_and_streamed(family, text, content, calls, error):
    for size in (None, 1, 4):
        got_content, got_calls, invalid = parse(family, text, size)
        assert got_content == content, size
        assert [(c.name, c.arguments) for c in got_calls] == calls, size
        if error is None:
            assert not invalid
        else:  # kept as an invalid call, never raised (the typed fallback every format shares)
            [bad] = invalid
            assert error in bad.error and bad.raw


@pytest.mark.parametrize("family", ["mistral", "mistral_v11"])
def test_mistral_calls_get_the_ids_its_template_requires(family):
    _content, [call], _invalid = parse(family, next(text for f, text, *_ in PARSES if f == family))
    assert len(call.id) == 9 and call.id.isalnum()


# -- the template renders tools and calls as the model writes them -------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_calls_render_back_through_the_template_as_written(family):
    """A parsed call, sent back in the history, renders as the model wrote it (the grammar writes JSON spaced as the
    template does), its id accepted (Mistral v0.3's template raises on any other than 9 characters); the tools render
    through the template too."""
    tokenizer = family_tokenizer(family)
    output = next(text for f, text, _c, calls, _e in PARSES if f == family and calls == [PARIS])
    _content, calls, _invalid = parse(family, output)
    history = [
        *MESSAGES,
        {"role": "assistant", "content": "", "tool_calls": assistant_tool_calls_for_template(calls)},
        {"role": "tool", "tool_call_id": calls[0].id, "content": "18 C"},
    ]
    rendered = render_prompt_text(tokenizer, history, tools=[WEATHER])
    written = output.replace("}]", f', "id": "{calls[0].id}"}}]') if family == "mistral" else output
    assert written in rendered
    assert '"description": "The get_weather tool."' in rendered
    prompt = prepare_turn(engine(family), prepare_chat(MESSAGES, merge_settings({}), [WEATHER])).plan.prompt_ids
    opening = {"llama3_json": "<|start_header_id|>", "mistral": "[AVAILABLE_TOOLS]", "mistral_v11": "[AVAILABLE_TOOLS]"}
    assert tokenizer.convert_tokens_to_ids(opening[family]) in prompt  # the template's markup, as its token


# -- the grammar ------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def grammar_tokenizers() -> dict[str, GrammarTokenizer]:
    return {
        family: GrammarTokenizer(tok, len(tok), [tok.eos_token_id])
        for family, tok in ((f, family_tokenizer(f)) for f in FAMILIES)
    }


NOTE = plain_tool("note", {"text": {"type": "string"}})
WALKS = {
    "llama3_json": {
        "call": '{"name": "add", "parameters": {"a": 1, "b": 2}}',
        "second": '{"name": "note", "parameters": {"text": "hi"}}',
        "both": None,  # one call a turn: the template renders no more
        "bad": ['{"name": "add", "arguments": {"a": 1, "b": 2}}',  # "parameters", as the template writes
                '{"name": "add", "parameters": {"a": 1, "b": 2, "c": 3}}', '{"name": "div", "parameters": {"a": 1}}',
                '{"name": "add", "parameters": {"a":1, "b": 2}}', ' {"name": "add", "parameters": {"a": 1, "b": 2}}',
                '{"answer": 3}'],
    },
    "mistral": {
        "call": '[TOOL_CALLS] [{"name": "add", "arguments": {"a": 1, "b": 2}}]',
        "second": 'I note it. [TOOL_CALLS] [{"name": "note", "arguments": {"text": "hi"}}]',
        "both": '[TOOL_CALLS] [{"name": "add", "arguments": {"a": 1, "b": 2}}, '
        '{"name": "note", "arguments": {"text": "hi"}}]',
        "bad": ['[TOOL_CALLS] []', '[TOOL_CALLS][{"name": "add", "arguments": {"a": 1, "b": 2}}]',
                '[TOOL_CALLS] [{"name": "add", "arguments": {"a": "1", "b": 2}}]'],
    },
    "mistral_v11": {
        "call": '[TOOL_CALLS]add[ARGS]{"a": 1, "b": 2}',
        "second": 'I note it.[TOOL_CALLS]note[ARGS]{"text": "hi"}',
        "both": '[TOOL_CALLS]add[ARGS]{"a": 1, "b": 2}[TOOL_CALLS]note[ARGS]{"text": "hi"}',
        "bad": ['[TOOL_CALLS]div[ARGS]{"a": 1, "b": 2}', '[TOOL_CALLS]add[ARGS]{"a": 1}',
                '[TOOL_CALLS]add [ARGS]{"a": 1, "b": 2}'],
    },
}  # fmt: skip


def walks(family: str, tokenizer: GrammarTokenizer, grammar: str, text: str) -> bool:
    state = tokenizer.state(grammar, 0)
    for token in family_tokenizer(family).encode(text, add_special_tokens=False):
        if not state.allowed()[token]:
            return False
        state.advance(token)
    return state.matcher.is_accepting()


@pytest.mark.parametrize("family", FAMILIES)
def test_each_familys_grammar_takes_its_calls_and_nothing_else(family, grammar_tokenizers):
    tokenizer, cases, fmt = grammar_tokenizers[family], WALKS[family], TOOL_FORMATS[family]

    def grammar(choice: Any, parallel: bool = False) -> str:
        return turn_grammar(*fmt.grammar([ADD, NOTE], choice, tokenizer, parallel), None, tokenizer)

    offered, required, named = grammar("auto"), grammar("required"), grammar("add")
    assert walks(family, tokenizer, offered, cases["call"]) and walks(family, tokenizer, offered, cases["second"])
    assert walks(family, tokenizer, offered, "Just an answer, {with braces}.")
    assert walks(family, tokenizer, required, cases["call"])
    assert not walks(family, tokenizer, required, "Just an answer.")
    assert not walks(family, tokenizer, named, cases["second"])
    for bad in cases["bad"]:
        assert not walks(family, tokenizer, offered, bad), bad
    if cases["both"] is not None:  # one call a turn unless parallel calls are asked for
        assert not walks(family, tokenizer, offered, cases["both"])
        assert walks(family, tokenizer, grammar("auto", parallel=True), cases["both"])
    answer = '{"verdict": "calm"}'  # with a response format: a call or the answer, no free text
    item = '%json {"type": "object", "properties": {"verdict": {"type": "string"}}, "required": ["verdict"]}'
    either = turn_grammar(*fmt.grammar([ADD, NOTE], "auto", tokenizer, answer=item), None, tokenizer)
    assert walks(family, tokenizer, either, answer) and walks(family, tokenizer, either, cases["call"])
    assert not walks(family, tokenizer, either, "Just an answer.")
    _content, calls, invalid = parse(family, answer)
    assert not calls and not invalid  # and the answer does not read as a call


_ENGINES: dict[str, RelayEngine] = {}


def engine(family: str) -> RelayEngine:
    """A relay engine over the tiny random pair on ``family``'s tokenizer; cues are the schema's words, so switches
    happen inside the calls."""
    if family not in _ENGINES:
        tokenizer = family_tokenizer(family)
        _ENGINES[family] = RelayEngine.from_models(
            *family_pair(tokenizer), tokenizer, cues=["sea", "sky", "sun"],
            policy={"min_large_tokens": 1, "max_small_tokens": 10},
        )  # fmt: skip
    return _ENGINES[family]


@pytest.mark.parametrize("choice", ["required", "describe"])
@pytest.mark.parametrize("family", FAMILIES)
def test_random_weights_under_the_grammar_write_a_valid_call_of_the_family(family, choice):
    request = prepare_chat(MESSAGES, merge_settings({"max_new_tokens": 100}), [DESCRIBE, SETTLE], tool_choice=choice)
    final = list(stream_chat(engine(family), request))[-1]
    result, parsed = final.result, final.parsed
    assert result.finish_reason == "stop", result.text
    assert result.text.startswith(CALL_START[family]), result.text
    assert not parsed.invalid_tool_calls and parsed.content == ""
    [call] = parsed.tool_calls
    if choice == "describe":
        assert call.name == "describe"
    if call.name == "describe":
        Weather.model_validate(call.arguments)
    else:
        assert call.name == "settle" and isinstance(call.arguments["ok"], bool)


@pytest.mark.parametrize("family", FAMILIES)
def test_offered_tools_give_text_or_a_call_never_a_broken_one(family, grammar_tokenizers):
    request = prepare_chat(MESSAGES, merge_settings({"max_new_tokens": 40}), [DESCRIBE, SETTLE])
    plan = prepare_turn(engine(family), request).plan
    assert plan.call_tag is not None and plan.call_tag == TOOL_FORMATS[family].call_tag(grammar_tokenizers[family])
    final = list(stream_chat(engine(family), request))[-1]
    assert not final.parsed.invalid_tool_calls
    if not final.parsed.tool_calls:  # text: none of it reads as the opening of a call
        assert final.parsed.content == final.result.text and not final.result.text.startswith(("{", "[TOOL_CALLS]"))


@pytest.mark.parametrize("family", FAMILIES)
def test_without_a_grammar_the_prefill_opens_the_familys_call(family):
    """``constrain=False`` (or a remote pair): a forced call is prefilled in the template's own form, which opens
    the family's call."""
    written = next(text for f, text, _c, calls, _e in PARSES if f == family and calls == [PARIS])
    for choice in ("required", "get_weather"):
        request = prepare_chat(MESSAGES, merge_settings({"constrain": False}), [WEATHER], tool_choice=choice)
        assert request.prefix is not None and request.prefix.startswith("<tool_call>")  # engine-free: the default
        prompt = family_tokenizer(family).decode(prepare_turn(engine(family), request).plan.prompt_ids)
        prefix = TOOL_FORMATS[family].forced_prefix(choice, [WEATHER])
        assert prefix is not None and prompt.endswith(prefix) and written.startswith(prefix), prefix


# -- a declared response template (transformers 5.x) -----------------------------------------------------------------
MISTRAL_RESPONSE = {
    "defaults": {"role": "assistant"},
    "start_anchor": "[/INST]",
    "fields": {
        "tool_calls": {
            "open_pattern": r"\s*\[TOOL_CALLS\]",
            "content": "json",
            "transform_each": True,
            "transform": {"type": "function", "function": {"name": "{name}", "arguments": "{arguments}"}},
        },
        "content": {"close_pattern": r"\s*</s>", "content": "text"},
    },
}


@pytest.fixture(scope="module")
def declaring() -> Any:
    tokenizer = load_family_tokenizer("mistral")
    tokenizer.response_template = MISTRAL_RESPONSE
    return tokenizer


def test_a_declared_response_template_reads_the_calls(declaring):
    """transformers' parser casts arguments by the tool's schema ("7" -> 7 for an integer), as parse_response does;
    the format's own parser keeps what was written - and is what a named ``tool_format`` gets."""
    text = 'Adding. [TOOL_CALLS] [{"name": "add", "arguments": {"a": "7", "b": 2}}]'
    expected = (text, {"a": 7, "b": 2}, "Adding.")
    whole = chat_parser(declaring, None, [ADD])
    assert isinstance(whole, DeclaredParser)
    for size in (len(text), 1, 5):
        parser = chat_parser(declaring, None, [ADD])
        out = [p for i in range(0, len(text), size) for p in parser.feed(text[i : i + size])] + list(parser.finish())
        [call] = [p for p in out if isinstance(p, ToolCall)]
        assert (text, call.arguments, "".join(p for p in out if isinstance(p, str)).strip()) == expected
        assert len(call.id) == 9  # the family's ids still
    named = chat_parser(declaring, "mistral", [ADD])
    [call] = [p for p in [*named.feed(text), *named.finish()] if isinstance(p, ToolCall)]
    assert call.arguments == {"a": "7", "b": 2}
    broken = chat_parser(declaring, None, [ADD])
    out = [*broken.feed('[TOOL_CALLS] [{"name": "add", "arguments": {"a": 7,}}]'), *broken.finish()]
    [bad] = [p for p in out if isinstance(p, InvalidToolCall)]
    assert '"a": 7,' in bad.raw and not [p for p in out if isinstance(p, ToolCall)]


def test_a_declared_template_runs_under_the_familys_grammar(declaring):
    engine = RelayEngine.from_models(*family_pair(declaring), declaring, cues=[])
    request = prepare_chat(MESSAGES, merge_settings({"max_new_tokens": 100}), [DESCRIBE], tool_choice="required")
    final = list(stream_chat(engine, request))[-1]
    [call] = final.parsed.tool_calls
    assert call.name == "describe" and not final.parsed.invalid_tool_calls, final.result.text
    assert Weather.model_validate(call.arguments) and len(call.id) == 9


def test_a_declared_template_that_does_not_load_is_named():
    tokenizer = load_family_tokenizer("mistral")
    tokenizer.response_template = {"start_anchor": "[/INST]", "fields": {"tool_calls": {"content": "yaml"}}}
    with pytest.raises(ResponseTemplateError, match="response_template does not load") as caught:
        chat_parser(tokenizer, None, [ADD])
    assert caught.value.field == "response_template"
    assert not isinstance(chat_parser(tokenizer, "mistral", [ADD]), DeclaredParser)  # naming the format skips it
