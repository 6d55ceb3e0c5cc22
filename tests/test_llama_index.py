"""LlamaIndex RelayLLM on scripted engines: sync/async/stream agreement, messages, tools, spans, usage, events."""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from typing import Any

import pytest
from helpers import PROMPT, ScriptedLM
from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    ImageBlock,
    MessageRole,
    TextBlock,
    ThinkingBlock,
    ToolCallBlock,
)
from llama_index.core.bridge.pydantic import BaseModel
from llama_index.core.callbacks import CallbackManager, TokenCountingHandler
from llama_index.core.constants import DEFAULT_CONTEXT_WINDOW
from llama_index.core.instrumentation.events import BaseEvent
from llama_index.core.instrumentation.events.llm import LLMChatStartEvent, LLMCompletionStartEvent
from llama_index.core.llms.llm import ToolSelection
from llama_index.core.program.function_program import get_function_tool
from llama_index.core.prompts import PromptTemplate
from llama_index.core.tools import FunctionTool
from llama_index.core.types import PydanticProgramMode
from llama_index_events import Collector
from transformers import PreTrainedTokenizerBase

import relaygen_integrations.engine.local.loading as loading_module
from relaygen_integrations import RelayEngine
from relaygen_integrations.chat.tool_calls import forced_prefix
from relaygen_integrations.engine.core.prompt import render_prompt_ids, render_prompt_text
from relaygen_integrations.llama_index import RelayChatModel, RelayLLM, RelaySwitchEvent, to_relay_messages

BASIC = "We add two and three. So the answer is five. Then we are done."
BASIC_RELAY = "We add two and three. So THE ANSWER IS FIVE. Then we are done."
CUES = ["So", "So,", "So ", "Therefore", "Now"]
USER = [ChatMessage(role=MessageRole.USER, content=PROMPT[0]["content"])]
CALL = '<tool_call>\n{"name": "multiply", "arguments": {"a": 6, "b": 7}}\n</tool_call>'


def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


MULTIPLY = FunctionTool.from_defaults(fn=multiply)
MULTIPLY_SPEC = MULTIPLY.metadata.to_openai_tool(skip_length_check=True)


def spans_of(response: Any) -> list[tuple[Any, ...]]:
    """The relaygen spans without their timings (which differ from run to run)."""
    keys = ("model", "trigger", "start", "end", "text", "token_count")
    return [tuple(span[k] for k in keys) for span in response.additional_kwargs["relaygen"]["spans"]]


def make_engine(
    tokenizer: PreTrainedTokenizerBase,
    reference: str,
    *,
    small: str | None = None,
    cues: Sequence[str] = CUES,
    tools: list[dict[str, Any]] | None = None,
    prefix: str | None = None,
    raw_prompt: str | None = None,
) -> RelayEngine:
    """Scripted models know where the completion starts, so the engine is built for the exact prompt it will get."""
    if raw_prompt is not None:
        prompt_ids = tokenizer.encode(raw_prompt, add_special_tokens=False)
    else:
        prompt_ids = render_prompt_ids(tokenizer, PROMPT, tools=tools, assistant_prefix=prefix)
    large = ScriptedLM(tokenizer, reference, len(prompt_ids))
    small_lm = ScriptedLM(tokenizer, small if small is not None else reference.upper(), len(prompt_ids))
    return RelayEngine.from_models(large, small_lm, tokenizer, cues=list(cues))  # type: ignore[arg-type]


# -- construction, laziness, sharing, metadata -------------------------------------------------------------------
def test_construction_is_lazy_and_equal_configs_share_one_engine(monkeypatch, tokenizer):
    loads: list[tuple[str, str, dict[str, Any]]] = []

    def fake_from_pretrained(cls: type[RelayEngine], large: str, small: str, **kwargs: Any) -> RelayEngine:
        loads.append((large, small, kwargs))
        return make_engine(tokenizer, BASIC)

    monkeypatch.setattr(loading_module, "_SHARED_PAIRS", {})
    monkeypatch.setattr(RelayEngine, "from_pretrained", classmethod(fake_from_pretrained))

    first = RelayLLM(large="some/large", small="some/small", cues=["So "])
    second = RelayLLM(large="some/large", small="some/small", cues=["So "])
    other = RelayLLM(large="some/large", small="some/small", cues=["Thus"])
    assert first.metadata.model_name == "relay(some/large+some/small)"
    assert first.metadata.context_window == DEFAULT_CONTEXT_WINDOW  # unknown reference, nothing on disk
    assert loads == []  # neither construction nor metadata loads anything

    assert first.engine is second.engine
    assert len(loads) == 1
    assert loads[0] == ("some/large", "some/small", {"device": "auto", "dtype": "auto", "compile": False})
    # Cues are per request: a model that differs only in cues shares the weights, and its requests carry its cues.
    assert other.engine is first.engine and len(loads) == 1
    assert other._settings({}).cues == ("Thus",) and first._settings({}).cues == ("So ",)
    assert first.metadata.context_window == first.engine.context_window == 4096  # now from the model config


async def test_async_first_use_loads_off_the_event_loop(monkeypatch, tokenizer):
    loader_threads: list[threading.Thread] = []

    def fake_from_pretrained(cls: type[RelayEngine], large: str, small: str, **kwargs: Any) -> RelayEngine:
        loader_threads.append(threading.current_thread())
        return make_engine(tokenizer, BASIC)

    monkeypatch.setattr(loading_module, "_SHARED_PAIRS", {})
    monkeypatch.setattr(RelayEngine, "from_pretrained", classmethod(fake_from_pretrained))
    response = await RelayLLM(large="a", small="b", max_tokens=100).achat(USER)
    assert response.message.content == BASIC_RELAY
    assert loader_threads and loader_threads[0] is not threading.main_thread()


def test_metadata_and_alias(tokenizer):
    assert RelayChatModel is RelayLLM
    llm = RelayLLM(engine=make_engine(tokenizer, BASIC), max_tokens=77)
    meta = llm.metadata
    assert (meta.context_window, meta.num_output, meta.is_chat_model, meta.is_function_calling_model) == (
        4096,
        77,
        True,
        True,
    )
    assert meta.model_name == "relay(large+small)"
    assert RelayLLM(engine=llm.engine, mode="large").metadata.model_name == "large(large+small)"
    assert RelayLLM(engine=llm.engine, context_window=1000).metadata.context_window == 1000
    unloaded = RelayLLM()
    # The demo pair's profile ships mode "large" (the small model drafting); read without loading anything.
    assert unloaded.metadata.model_name == "large(demo:large+demo:small)" and unloaded._engine is None
    assert RelayLLM(large="some/dir", small="other/dir").metadata.model_name == "relay(some/dir+other/dir)"
    assert RelayLLM.class_name() == "RelayLLM"


# -- one answer, eight ways ---------------------------------------------------------------------------------------
async def test_complete_chat_stream_and_async_agree(tokenizer):
    llm = RelayLLM(engine=make_engine(tokenizer, BASIC), max_tokens=100)

    chat = llm.chat(USER)
    assert chat.message.content == BASIC_RELAY and chat.message.role == MessageRole.ASSISTANT
    spans = spans_of(chat)
    assert [(s[0], s[4]) for s in spans] == [
        ("large", "We add two and three. So"),
        ("small", " THE ANSWER IS FIVE."),
        ("large", " Then we are done."),
    ]

    streamed = list(llm.stream_chat(USER))
    assert "".join(r.delta or "" for r in streamed) == BASIC_RELAY
    assert streamed[-1].message.content == BASIC_RELAY and streamed[-1].delta == ""
    # Each delta names the model that wrote it; only the final response carries the relaygen block and usage.
    tagged = {(r.delta, r.additional_kwargs["relaygen_model"]) for r in streamed[:-1]}
    assert all(model == ("small" if delta.isupper() else "large") for delta, model in tagged if delta.strip(" ."))
    assert {r.additional_kwargs["relaygen_span"] for r in streamed[:-1] if r.additional_kwargs["relaygen_model"]} == {
        0,
        1,
        2,
    }
    assert all("relaygen" not in r.additional_kwargs for r in streamed[:-1])
    # Switches come as empty deltas whose raw names them (agents copy raw into their AgentStream events).
    switches = [r.raw["relaygen_switch"] for r in streamed[:-1] if r.raw is not None]
    assert all(r.raw is None or r.delta == "" for r in streamed[:-1])
    assert [(w["from_model"], w["to_model"], w["char_offset"]) for w in switches] == [
        ("large", "small", spans[1][2]),
        ("small", "large", spans[2][2]),
    ]
    assert spans_of(streamed[-1]) == spans

    assert llm.complete(PROMPT[0]["content"]).text == BASIC_RELAY
    completion_stream = list(llm.stream_complete(PROMPT[0]["content"]))
    assert "".join(r.delta or "" for r in completion_stream) == BASIC_RELAY == completion_stream[-1].text
    assert spans_of(completion_stream[-1]) == spans

    achat = await llm.achat(USER)
    assert achat.message.content == BASIC_RELAY and spans_of(achat) == spans
    adeltas = [r async for r in await llm.astream_chat(USER)]
    assert [(r.delta, r.additional_kwargs.get("relaygen_model")) for r in adeltas] == [
        (r.delta, r.additional_kwargs.get("relaygen_model")) for r in streamed
    ]
    assert (await llm.acomplete(PROMPT[0]["content"])).text == BASIC_RELAY
    acompletion = [r async for r in await llm.astream_complete(PROMPT[0]["content"])]
    assert [r.delta for r in acompletion] == [r.delta for r in completion_stream]


def test_predict_goes_through_the_chat_path(tokenizer):
    llm = RelayLLM(engine=make_engine(tokenizer, BASIC), max_tokens=100)
    assert llm.predict(PromptTemplate("Solve {what}."), what="it") == BASIC_RELAY


async def test_async_methods_generate_on_a_worker_thread(tokenizer):
    """No sync generation hidden behind ``async def``: the loop's thread never runs the model."""
    engine = make_engine(tokenizer, BASIC)
    threads: list[threading.Thread] = []
    run_plan = engine.run_plan

    def recording_run_plan(*args: Any, **kwargs: Any) -> Any:
        threads.append(threading.current_thread())
        return run_plan(*args, **kwargs)

    engine.run_plan = recording_run_plan  # type: ignore[method-assign]
    llm = RelayLLM(engine=engine, max_tokens=100)
    await llm.achat(USER)
    [r async for r in await llm.astream_chat(USER)]
    await llm.acomplete("Solve it.")
    [r async for r in await llm.astream_complete("Solve it.")]
    assert len(threads) == 4 and all(t is not threading.current_thread() for t in threads)


async def test_formatted_completion_uses_the_raw_prompt_ids(tokenizer):
    raw = "Question: what is two plus three?\nAnswer:"
    engine = make_engine(tokenizer, " Five.", raw_prompt=raw, cues=[])
    llm = RelayLLM(engine=engine, max_tokens=20)
    assert llm.complete(raw, formatted=True).text == " Five."
    large = engine.backend.runners["large"].model
    # The whole prompt was prefilled as written: no chat template around it, no special tokens added.
    # (read in two passes, as every cold request: up to its last token, then that token)
    assert sum(large.fed[:2]) == len(tokenizer.encode(raw, add_special_tokens=False)) and large.fed[1] == 1
    assert (await llm.acomplete(raw, formatted=True)).text == " Five."
    assert [r.delta for r in llm.stream_complete(raw, formatted=True)][-2:] == [".", ""]


def test_per_call_settings_override_the_fields(tokenizer):
    llm = RelayLLM(engine=make_engine(tokenizer, BASIC), max_tokens=100)
    short = llm.chat(USER, max_tokens=3)
    assert short.raw["finish_reason"] == "length" and short.raw["usage"]["completion_tokens"] == 3
    stopped = llm.chat(USER, stop=["So"])
    assert stopped.message.content == "We add two and three. " and stopped.raw["finish_reason"] == "stop_sequence"
    large_only = llm.complete("Solve it.", mode="large")
    assert large_only.text == BASIC and large_only.additional_kwargs["relaygen"]["small_tokens"] == 0


def test_speculative_field_and_per_call_override(tokenizer):
    # The small model agrees with the large one, so its drafts are accepted; the text is the large model's.
    llm = RelayLLM(engine=make_engine(tokenizer, BASIC, small=BASIC), max_tokens=100, speculative=4, mode="large")
    response = llm.chat(USER)
    usage = response.additional_kwargs["relaygen"]["usage"]
    assert response.message.content == BASIC and usage["accepted_draft_tokens"] == usage["draft_tokens"] > 0
    plain = llm.chat(USER, speculative=False).additional_kwargs["relaygen"]["usage"]
    assert plain["draft_tokens"] == 0


# -- message conversion --------------------------------------------------------------------------------------------
def test_message_conversion_with_tool_roles(tokenizer):
    messages = [
        ChatMessage(role=MessageRole.SYSTEM, content="Be brief."),
        ChatMessage(role=MessageRole.USER, content="What is 6 times 7?"),
        ChatMessage(
            role=MessageRole.ASSISTANT,
            blocks=[
                ThinkingBlock(content="the user wants a product"),
                TextBlock(text="Let me compute."),
                ToolCallBlock(tool_call_id="call_1", tool_name="multiply", tool_kwargs={"a": 6, "b": 7}),
            ],
        ),
        ChatMessage(role=MessageRole.TOOL, content="42", additional_kwargs={"tool_call_id": "call_1"}),
        ChatMessage(
            role=MessageRole.ASSISTANT,
            content="",
            additional_kwargs={
                "tool_calls": [
                    {"id": "call_2", "type": "function", "function": {"name": "multiply", "arguments": '{"a": 1}'}}
                ]
            },
        ),
        ChatMessage(role=MessageRole.TOOL, content="1", additional_kwargs={"tool_call_id": "call_2"}),
    ]
    converted = to_relay_messages(messages)
    assert converted == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 6 times 7?"},
        {
            "role": "assistant",
            "content": "Let me compute.",
            "reasoning_content": "the user wants a product",  # for the template: Qwen2.5's ignores it
            "tool_calls": [
                {"type": "function", "function": {"name": "multiply", "arguments": {"a": 6, "b": 7}}, "id": "call_1"}
            ],
        },
        {"role": "tool", "content": "42", "tool_call_id": "call_1"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "function": {"name": "multiply", "arguments": {"a": 1}}, "id": "call_2"}
            ],
        },
        {"role": "tool", "content": "1", "tool_call_id": "call_2"},
    ]
    text = render_prompt_text(tokenizer, converted, tools=[MULTIPLY_SPEC])
    assert '<tool_call>\n{"name": "multiply", "arguments": {"a": 6, "b": 7}}\n</tool_call>' in text
    assert "<tool_response>\n42\n</tool_response>" in text and "the user wants a product" not in text
    assert to_relay_messages([ChatMessage(role=MessageRole.DEVELOPER, content="x")])[0]["role"] == "system"


def test_text_blocks_give_the_plain_prompt(tokenizer):
    from relaygen_integrations.engine.core.prompt import render_prompt_ids

    plain = [ChatMessage(role=MessageRole.SYSTEM, content="Be brief."), ChatMessage(role="user", content="hi\nthere")]
    blocks = [
        ChatMessage(role=MessageRole.DEVELOPER, blocks=[TextBlock(text="Be brief.")]),
        ChatMessage(role=MessageRole.USER, blocks=[TextBlock(text="hi"), TextBlock(text="there")]),
    ]
    converted = [to_relay_messages(m) for m in (plain, blocks)]
    assert render_prompt_ids(tokenizer, converted[1]) == render_prompt_ids(tokenizer, converted[0])


def test_images_are_refused_with_a_clear_error(tokenizer):
    llm = RelayLLM(engine=make_engine(tokenizer, BASIC))
    message = ChatMessage(
        role=MessageRole.USER, blocks=[TextBlock(text="What is this?"), ImageBlock(url="http://x/y.png")]
    )
    with pytest.raises(ValueError, match=r"ImageBlock.*text-only"):
        llm.chat([message])


# -- tools -----------------------------------------------------------------------------------------------------------
def tool_engine(tokenizer: PreTrainedTokenizerBase, reference: str, prefix: str | None = None) -> RelayEngine:
    return make_engine(tokenizer, reference, small=reference, cues=[], tools=[MULTIPLY_SPEC], prefix=prefix)


def test_tool_call_becomes_a_block_and_a_tool_selection(tokenizer):
    llm = RelayLLM(engine=tool_engine(tokenizer, "Let me compute.\n" + CALL), max_tokens=120)
    response = llm.chat_with_tools([MULTIPLY], user_msg=PROMPT[0]["content"])
    blocks = [b for b in response.message.blocks if isinstance(b, ToolCallBlock)]
    assert [(b.tool_name, b.tool_kwargs) for b in blocks] == [("multiply", {"a": 6, "b": 7})]
    assert response.message.content == "Let me compute.\n"
    wire = response.message.additional_kwargs["tool_calls"]
    assert wire[0]["id"] == blocks[0].tool_call_id and json.loads(wire[0]["function"]["arguments"]) == {"a": 6, "b": 7}
    selections = llm.get_tool_calls_from_response(response)
    assert selections == [
        ToolSelection(tool_id=blocks[0].tool_call_id, tool_name="multiply", tool_kwargs={"a": 6, "b": 7})
    ]
    # The assistant turn goes back into a history and renders as the same call.
    again = to_relay_messages([response.message])[0]
    assert again["tool_calls"][0]["function"] == {"name": "multiply", "arguments": {"a": 6, "b": 7}}


def test_predict_and_call_runs_the_tool(tokenizer):
    llm = RelayLLM(engine=tool_engine(tokenizer, CALL), max_tokens=120)
    output = llm.predict_and_call([MULTIPLY], user_msg=PROMPT[0]["content"])
    assert output.response == "42" and output.sources[0].tool_name == "multiply"


async def test_streamed_tool_calls_arrive_whole_and_match_the_final(tokenizer):
    llm = RelayLLM(engine=tool_engine(tokenizer, "Checking.\n" + CALL), max_tokens=120)
    streamed = list(llm.stream_chat_with_tools([MULTIPLY], user_msg=PROMPT[0]["content"]))
    with_calls = [r for r in streamed if llm.get_tool_calls_from_response(r, error_on_no_tool_call=False)]
    first = llm.get_tool_calls_from_response(with_calls[0])
    final = llm.get_tool_calls_from_response(streamed[-1])
    assert first == final and final[0].tool_kwargs == {"a": 6, "b": 7}
    assert "".join(r.delta or "" for r in streamed) == "Checking.\n" == streamed[-1].message.content
    astreamed = [r async for r in await llm.astream_chat_with_tools([MULTIPLY], user_msg=PROMPT[0]["content"])]
    assert llm.get_tool_calls_from_response(astreamed[-1])[0].tool_kwargs == {"a": 6, "b": 7}


@pytest.mark.parametrize(
    "body",
    [
        '<tool_call>\n{"name": "multiply", "arguments": {"a": 6, "b": }}\n</tool_call>',
        '<tool_call>\n{"arguments": {"a": 6}}\n</tool_call>',
        '<tool_call>\n{"name": "multiply", "argu',  # ran out of tokens mid-call
    ],
)
async def test_malformed_tool_json_never_raises_from_chat(tokenizer, body):
    llm = RelayLLM(engine=tool_engine(tokenizer, body), max_tokens=120, constrain=False)  # a grammar forbids these
    for response in (
        llm.chat_with_tools([MULTIPLY], user_msg=PROMPT[0]["content"]),
        list(llm.stream_chat_with_tools([MULTIPLY], user_msg=PROMPT[0]["content"]))[-1],
        await llm.achat_with_tools([MULTIPLY], user_msg=PROMPT[0]["content"]),
    ):
        assert llm.get_tool_calls_from_response(response, error_on_no_tool_call=False) == []
        invalid = response.message.additional_kwargs["invalid_tool_calls"]
        assert len(invalid) == 1 and invalid[0]["error"]
        with pytest.raises(ValueError, match=r"0 tool calls.*malformed"):
            llm.get_tool_calls_from_response(response, error_on_no_tool_call=True)


def test_no_tool_call_raises_only_when_asked(tokenizer):
    llm = RelayLLM(engine=tool_engine(tokenizer, "It is 42."), max_tokens=50)
    response = llm.chat_with_tools([MULTIPLY], user_msg=PROMPT[0]["content"])
    assert response.message.content == "It is 42." and "tool_calls" not in response.message.additional_kwargs
    assert llm.get_tool_calls_from_response(response, error_on_no_tool_call=False) == []
    with pytest.raises(ValueError, match="0 tool calls"):
        llm.get_tool_calls_from_response(response)


def spy_prompts(engine: RelayEngine) -> list[str]:
    prompts: list[str] = []
    encode = engine.encode_messages

    def recording(*args: Any, **kwargs: Any) -> list[int]:
        ids = encode(*args, **kwargs)
        prompts.append(engine.tokenizer.decode(ids))
        return ids

    engine.encode_messages = recording  # type: ignore[method-assign]
    return prompts


@pytest.mark.parametrize(
    ("choice", "tool_choice"),
    [({"tool_required": True}, "required"), ({"tool_choice": "multiply"}, "multiply")],
)
async def test_tool_required_and_named_choice_prefill_the_call(tokenizer, choice, tool_choice):
    prefix = forced_prefix(tool_choice, [MULTIPLY_SPEC])
    assert prefix is not None and CALL.startswith(prefix)
    engine = tool_engine(tokenizer, CALL[len(prefix) :], prefix=prefix)
    prompts = spy_prompts(engine)
    llm = RelayLLM(engine=engine, max_tokens=120, constrain=False)  # the prefill path; constrained: test_grammar.py
    kwargs = llm._prepare_chat_with_tools([MULTIPLY], user_msg="hi", **choice)
    assert kwargs["tools"] == [MULTIPLY_SPEC] and kwargs["tool_choice"] == tool_choice
    response = llm.chat_with_tools([MULTIPLY], user_msg=PROMPT[0]["content"], **choice)
    assert prompts[-1].endswith("<|im_start|>assistant\n" + prefix)
    assert llm.get_tool_calls_from_response(response)[0].tool_kwargs == {"a": 6, "b": 7}
    aresponse = await llm.achat_with_tools([MULTIPLY], user_msg=PROMPT[0]["content"], **choice)
    assert llm.get_tool_calls_from_response(aresponse)[0].tool_name == "multiply"


class Answer(BaseModel):
    """A number with its unit."""

    value: int
    unit: str


def test_structured_predict_goes_through_a_forced_tool_call(tokenizer):
    """LlamaIndex's structured output for function-calling LLMs in ``PydanticProgramMode.FUNCTION`` (the default is
    a JSON answer, ``test_llama_index_structured.py``): a required call of a tool built from the output class
    (FunctionCallingProgram), parsed back into the class."""
    spec = get_function_tool(Answer).metadata.to_openai_tool(skip_length_check=True)
    prefix = forced_prefix("required", [spec])
    assert prefix is not None
    call = '<tool_call>\n{"name": "Answer", "arguments": {"value": 5, "unit": "apples"}}\n</tool_call>'
    engine = make_engine(tokenizer, call[len(prefix) :], small="", cues=[], tools=[spec], prefix=prefix)
    llm = RelayLLM(engine=engine, max_tokens=100, pydantic_program_mode=PydanticProgramMode.FUNCTION)
    assert llm.structured_predict(Answer, PromptTemplate("Solve it.")) == Answer(value=5, unit="apples")


def test_parallel_tool_calls_are_trimmed_unless_allowed(tokenizer):
    two = CALL + "\n" + CALL.replace('"a": 6', '"a": 2')
    llm = RelayLLM(engine=tool_engine(tokenizer, two), max_tokens=200)
    single = llm.chat_with_tools([MULTIPLY], user_msg=PROMPT[0]["content"])
    assert [s.tool_kwargs["a"] for s in llm.get_tool_calls_from_response(single)] == [6]
    assert len(single.message.additional_kwargs["tool_calls"]) == 1
    # Under the grammar the model may write a second call only with parallel_tool_calls=True; LlamaIndex's flag keeps
    # the calls it wrote.
    kept = llm.chat_with_tools([MULTIPLY], user_msg=PROMPT[0]["content"], allow_parallel_tool_calls=True)
    assert [s.tool_kwargs["a"] for s in llm.get_tool_calls_from_response(kept)] == [6]
    both = llm.chat_with_tools(
        [MULTIPLY], user_msg=PROMPT[0]["content"], allow_parallel_tool_calls=True, parallel_tool_calls=True
    )
    assert [s.tool_kwargs["a"] for s in llm.get_tool_calls_from_response(both)] == [6, 2]


def test_tool_kwargs_given_as_a_json_string_are_parsed(tokenizer):
    llm = RelayLLM(engine=make_engine(tokenizer, BASIC))
    message = ChatMessage(
        role=MessageRole.ASSISTANT, blocks=[ToolCallBlock(tool_call_id="c", tool_name="f", tool_kwargs='{"x": 1}')]
    )
    assert llm.get_tool_calls_from_response(ChatResponse(message=message))[0].tool_kwargs == {"x": 1}


# -- usage and instrumentation ---------------------------------------------------------------------------------------
def test_token_counting_handler_counts_engine_usage_without_tokenizing(tokenizer):
    tokenized: list[str] = []

    def counting_tokenizer(text: str) -> list[int]:
        tokenized.append(text)
        return [0] * len(text.split())

    counter = TokenCountingHandler(tokenizer=counting_tokenizer)
    llm = RelayLLM(engine=make_engine(tokenizer, BASIC), max_tokens=100, callback_manager=CallbackManager([counter]))
    response = llm.chat(USER)
    usage = response.raw["usage"]
    assert usage["prompt_tokens"] == len(render_prompt_ids(tokenizer, PROMPT))
    assert usage["completion_tokens"] == response.additional_kwargs["relaygen"]["usage"]["completion_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    list(llm.stream_chat(USER))
    llm.complete("Solve it.")
    assert counter.prompt_llm_token_count == 3 * usage["prompt_tokens"]
    assert counter.completion_llm_token_count == 3 * usage["completion_tokens"]
    assert tokenized == []


def check_switch_events(collector: Collector, start_kind: type[BaseEvent], method: str, switches: int) -> None:
    starts = collector.of(start_kind)
    relay = collector.of(RelaySwitchEvent)
    assert len(starts) == 1 and len(relay) == switches == 2
    # Each switch belongs to the span of the call that produced it, also when a stream is consumed later.
    assert {e.span_id for e in relay} == {starts[0].span_id}
    assert starts[0].span_id.startswith(f"RelayLLM.{method}-")
    assert [(e.from_model, e.to_model, e.trigger, e.span_index) for e in relay] == [
        ("large", "small", "cue:So ", 1),
        ("small", "large", "sentence_end", 2),
    ]
    assert relay[0].char_offset == len("We add two and three. So")
    assert relay[0].class_name() == "RelaySwitchEvent" and relay[0].model_dump()["class_name"] == "RelaySwitchEvent"
    collector.events.clear()


async def test_switch_events_reach_root_handlers_with_the_call_span(tokenizer, collector):
    llm = RelayLLM(engine=make_engine(tokenizer, BASIC), max_tokens=100)

    switches = llm.chat(USER).raw["usage"]["switches"]
    check_switch_events(collector, LLMChatStartEvent, "chat", switches)
    list(llm.stream_chat(USER))
    check_switch_events(collector, LLMChatStartEvent, "stream_chat", switches)
    llm.complete("Solve it.")
    check_switch_events(collector, LLMCompletionStartEvent, "complete", switches)
    list(llm.stream_complete("Solve it."))
    check_switch_events(collector, LLMCompletionStartEvent, "stream_complete", switches)
    await llm.achat(USER)
    check_switch_events(collector, LLMChatStartEvent, "achat", switches)
    [r async for r in await llm.astream_chat(USER)]
    check_switch_events(collector, LLMChatStartEvent, "astream_chat", switches)
    await llm.acomplete("Solve it.")
    check_switch_events(collector, LLMCompletionStartEvent, "acomplete", switches)
    [r async for r in await llm.astream_complete("Solve it.")]
    check_switch_events(collector, LLMCompletionStartEvent, "astream_complete", switches)


def test_stream_switch_events_fire_as_the_stream_is_consumed(tokenizer, collector):
    llm = RelayLLM(engine=make_engine(tokenizer, BASIC), max_tokens=100)
    stream = llm.stream_chat(USER)
    seen_at_switch: list[str] = []
    text = ""
    for response in stream:
        if collector.of(RelaySwitchEvent) and not seen_at_switch:
            seen_at_switch.append(text)
        text += response.delta or ""
    # The first switch was dispatched before the small model's first delta, not after the stream ended.
    assert seen_at_switch == ["We add two and three. So"]
