"""Reasoning on and off, and reasoning under both of its names.

* The adapters' ``reasoning`` field (ChatOllama's ``reasoning=``): the chat template's own switch
  (``enable_thinking``, ``thinking``) where it has one; without one, what the pair does anyway is kept and anything
  else is a ``SettingsError`` naming ``reasoning`` before any forward pass.
* ``relaygen serve`` writes a reasoning model's thinking as ``reasoning`` (vLLM >= 0.17) beside ``reasoning_content``,
  and reads either name on the assistant messages it is sent.

All on the tiny random-weight pair under templates from ``thinking_templates.py``: its output is the same text either
way; where that text lands (reasoning or answer) and the prompt it continues are what the switch changes.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from helpers import PROMPT
from llama_index.core.base.llms.types import ChatMessage, ThinkingBlock
from thinking_templates import ALWAYS_THINKS, SWITCH, THINKING_FLAG, templated

from relaygen_integrations import RelayEngine
from relaygen_integrations.chat.reasoning import thinking_switch
from relaygen_integrations.chat.relay_chat import prepare_chat, prepare_turn
from relaygen_integrations.engine.core.prompt import MessageError
from relaygen_integrations.engine.core.settings import SettingsError, merge_settings
from relaygen_integrations.langchain import RelayChatModel
from relaygen_integrations.llama_index import RelayLLM
from relaygen_integrations.serve.app import create_app

QUESTION = PROMPT[0]["content"]
TOKENS = 10


def engine_for(tokenizer, pair, template: str | None, thinking: bool = True) -> RelayEngine:
    """The tiny pair under ``template`` (None: the demo tokenizer's ChatML, which has no switch); ``thinking``: the
    policy ends reasoning at ``</think>`` (a thinking pair)."""
    chosen = templated(tokenizer, template) if template is not None else tokenizer
    policy = {"reasoning_end": "</think>"} if thinking else {}
    return RelayEngine.from_models(*pair, chosen, cues=["So"], policy=policy)


@pytest.fixture(scope="module")
def switch_engine(tokenizer, pair) -> RelayEngine:
    return engine_for(tokenizer, pair, SWITCH)


def prompt_text(engine: RelayEngine, **request) -> str:
    plan = prepare_turn(engine, prepare_chat(PROMPT, merge_settings({"max_new_tokens": TOKENS}), **request)).plan
    return engine.tokenizer.decode(plan.prompt_ids)


@contextlib.contextmanager
def forward_passes(engine: RelayEngine) -> Iterator[list[int]]:
    """Records both models' forward passes while the block runs (hooks on the shared tiny pair, removed after)."""
    seen: list[int] = []
    hooks = [r.model.register_forward_pre_hook(lambda *_: seen.append(1)) for r in engine.backend.runners.values()]
    try:
        yield seen
    finally:
        for hook in hooks:
            hook.remove()


def chat_with(**reasoning: str) -> list[dict]:
    """A chat whose assistant turn carries ``reasoning`` (under the names given) before the next question."""
    return [*PROMPT, {"role": "assistant", "content": "Done.", **reasoning}, {"role": "user", "content": "Again."}]


# -- which variable is a template's switch ------------------------------------------------------------------------
def test_the_switch_is_a_variable_the_template_reads(tokenizer):
    assert thinking_switch(SWITCH) == "enable_thinking" and thinking_switch(THINKING_FLAG) == "thinking"
    assert thinking_switch(ALWAYS_THINKS) is None and thinking_switch(tokenizer.chat_template) is None
    assert thinking_switch(None) is None
    # A name a template sets itself, or reads off a message or writes as text, is no switch.
    own = "{%- set enable_thinking = true %}{{ enable_thinking }}{{ messages[0].thinking }}{{ 'enable_thinking' }}"
    assert thinking_switch(own) is None
    assert thinking_switch({"default": ALWAYS_THINKS, "tool_use": SWITCH}) == "enable_thinking"


# -- the switch changes the prompt and where the output lands ----------------------------------------------------
def test_reasoning_sets_enable_thinking_in_the_rendered_prompt(switch_engine):
    on, off, unset = (prompt_text(switch_engine, reasoning=value) for value in (True, False, None))
    assert on.endswith("<|im_start|>assistant\n<think>\n") and unset == on  # the template's default: thinking
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    # the same prompt as the template variable itself, and an agreeing variable beside it is fine
    assert off == prompt_text(switch_engine, chat_template_kwargs={"enable_thinking": False})
    assert off == prompt_text(switch_engine, reasoning=False, chat_template_kwargs={"enable_thinking": False})


def test_langchain_reasoning_field_and_call_argument_move_the_output(switch_engine):
    text_on = switch_engine.generate(PROMPT, max_new_tokens=TOKENS).text
    text_off = switch_engine.generate(
        PROMPT, max_new_tokens=TOKENS, chat_template_kwargs={"enable_thinking": False}
    ).text
    assert text_on and text_off
    thinking = RelayChatModel(engine=switch_engine, max_tokens=TOKENS, reasoning=True).invoke(QUESTION)
    assert thinking.content == "" and thinking.additional_kwargs["reasoning_content"] == text_on
    quiet = RelayChatModel(engine=switch_engine, max_tokens=TOKENS, reasoning=False)
    per_call = RelayChatModel(engine=switch_engine, max_tokens=TOKENS).invoke(QUESTION, reasoning=False)
    for message in (quiet.invoke(QUESTION), per_call):
        assert message.content == text_off and "reasoning_content" not in message.additional_kwargs
        assert message.usage_metadata["output_token_details"] == {"reasoning": 0}  # every token is the answer's
    # the closed block is prompt: the model read the longer prompt
    closed = prepare_turn(switch_engine, prepare_chat(PROMPT, merge_settings(), reasoning=False)).plan.prompt_ids
    assert quiet.invoke(QUESTION).usage_metadata["input_tokens"] == len(closed)
    assert len(closed) > thinking.usage_metadata["input_tokens"]
    streamed = "".join(chunk.text for chunk in quiet.stream(QUESTION))
    assert streamed == text_off


def test_llama_index_reasoning_field_and_call_argument_move_the_output(switch_engine):
    text_on = switch_engine.generate(PROMPT, max_new_tokens=TOKENS).text
    text_off = switch_engine.generate(
        PROMPT, max_new_tokens=TOKENS, chat_template_kwargs={"enable_thinking": False}
    ).text
    messages = [ChatMessage(role="user", content=QUESTION)]
    thinking = RelayLLM(engine=switch_engine, max_tokens=TOKENS, reasoning=True).chat(messages)
    assert isinstance(thinking.message.blocks[0], ThinkingBlock) and thinking.message.blocks[0].content == text_on
    quiet = RelayLLM(engine=switch_engine, max_tokens=TOKENS, reasoning=False)
    for response in (
        quiet.chat(messages),
        RelayLLM(engine=switch_engine, max_tokens=TOKENS).chat(messages, reasoning=False),
    ):
        assert response.message.content == text_off
        assert not any(isinstance(block, ThinkingBlock) for block in response.message.blocks)
    # the completion entry point renders through the same template
    assert quiet.complete(QUESTION).text == text_off
    assert RelayLLM(engine=switch_engine, max_tokens=TOKENS).complete(QUESTION, reasoning=False).text == text_off


def test_a_thinking_flag_template_gets_its_own_variable(tokenizer, pair):
    engine = engine_for(tokenizer, pair, THINKING_FLAG)
    assert prompt_text(engine).endswith("<|im_start|>assistant\n")  # off unless asked for
    assert prompt_text(engine, reasoning=True).endswith("<|im_start|>assistant\n<think>\n")
    text = engine.generate(PROMPT, max_new_tokens=TOKENS, chat_template_kwargs={"thinking": True}).text
    message = RelayChatModel(engine=engine, max_tokens=TOKENS, reasoning=True).invoke(QUESTION)
    assert message.content == "" and message.additional_kwargs["reasoning_content"] == text


# -- without a switch ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("template", "thinking", "honoured", "refused"),
    [
        (None, False, False, True),  # ChatML, a plain pair: it does not reason, and cannot be made to
        (ALWAYS_THINKS, True, True, False),  # a thinking pair that always reasons, and cannot be made to stop
    ],
)
def test_without_a_switch_what_the_pair_does_is_kept_and_the_rest_refused(
    tokenizer, pair, template, thinking, honoured, refused
):
    engine = engine_for(tokenizer, pair, template, thinking=thinking)
    model = RelayChatModel(engine=engine, max_tokens=TOKENS)
    default = model.invoke(QUESTION)
    kept = model.invoke(QUESTION, reasoning=honoured)
    assert (kept.content, kept.additional_kwargs) == (default.content, default.additional_kwargs)
    assert kept.usage_metadata["input_tokens"] == default.usage_metadata["input_tokens"]  # the same prompt
    calls = (
        lambda: model.invoke(QUESTION, reasoning=refused),
        lambda: RelayChatModel(engine=engine, reasoning=refused).invoke(QUESTION),
        lambda: RelayLLM(engine=engine, reasoning=refused).chat([ChatMessage(role="user", content=QUESTION)]),
        lambda: RelayLLM(engine=engine, reasoning=refused).complete(QUESTION),
    )
    with forward_passes(engine) as passes:
        for call in calls:
            with pytest.raises(SettingsError, match="no thinking switch") as error:
                call()
            assert error.value.field == "reasoning"
    assert passes == []  # refused before any model work
    with forward_passes(engine) as passes:
        model.invoke(QUESTION, max_tokens=1)
    assert passes  # the hooks do see a request that runs


def test_contradicting_the_template_variable_or_a_bad_value_is_refused_naming_reasoning(switch_engine):
    with pytest.raises(SettingsError, match="contradicts") as error:
        prompt_text(switch_engine, reasoning=False, chat_template_kwargs={"enable_thinking": True})
    assert error.value.field == "reasoning"
    with pytest.raises(SettingsError) as error:
        RelayChatModel(engine=switch_engine).invoke(QUESTION, reasoning="high")
    assert error.value.field == "reasoning"
    with pytest.raises(ValueError, match="reasoning"):
        RelayChatModel(engine=switch_engine, reasoning="maybe")  # the field's own validation


# -- relaygen serve: both names out, both names in -----------------------------------------------------------------
def test_the_server_writes_reasoning_under_both_names(switch_engine):
    text = switch_engine.generate(PROMPT, max_new_tokens=TOKENS).text
    body = {"messages": PROMPT, "max_tokens": TOKENS}
    with TestClient(create_app(switch_engine)) as client:
        message = client.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]
        assert message["reasoning"] == message["reasoning_content"] == text and message["content"] == ""
        stream = client.post("/v1/chat/completions", json={**body, "stream": True}).text
        deltas = [
            chunk["choices"][0]["delta"]
            for line in stream.splitlines()
            if line.startswith("data: {") and (chunk := json.loads(line[6:])).get("choices")
        ]
        pieces = [delta for delta in deltas if "reasoning" in delta or "reasoning_content" in delta]
        assert pieces and all(delta["reasoning"] == delta["reasoning_content"] for delta in pieces)
        assert "".join(delta["reasoning"] for delta in pieces) == text
        # thinking off over HTTP is the template variable, as vLLM takes it: the text is the answer
        off = {**body, "chat_template_kwargs": {"enable_thinking": False}}
        answer = client.post("/v1/chat/completions", json=off).json()["choices"][0]["message"]
        assert answer["reasoning"] == answer["reasoning_content"] == "" and answer["content"]


def test_the_server_reads_either_name_on_assistant_messages(switch_engine):
    ids = {
        name: switch_engine.encode_messages(chat_with(**({name: "Think first."} if name else {})))
        for name in ("reasoning", "reasoning_content", None)
    }
    assert ids["reasoning"] == ids["reasoning_content"] != ids[None]  # rendered, inside the turn's <think> block
    assert "<think>\nThink first.\n</think>" in switch_engine.tokenizer.decode(ids["reasoning"])
    with TestClient(create_app(switch_engine)) as client:

        def post(**reasoning: object):
            return client.post("/v1/chat/completions", json={"messages": chat_with(**reasoning), "max_tokens": 2})

        usage = [
            post(**{name: "Think first."}).json()["usage"]["prompt_tokens"]
            for name in ("reasoning", "reasoning_content")
        ]
        assert usage == [len(ids["reasoning"])] * 2
        assert post(reasoning="Think first.", reasoning_content="Think first.").status_code == 200  # our own echo
        for bad in ({"reasoning": "A.", "reasoning_content": "B."}, {"reasoning": ["A."]}):
            refused = post(**bad)
            assert refused.status_code == 400 and "messages[1].reasoning" in refused.json()["error"]["message"]

    with pytest.raises(MessageError) as error:  # the engine's own entry points read the messages the same way
        switch_engine.encode_messages(chat_with(reasoning="A.", reasoning_content="B."))
    assert error.value.field == "messages[1].reasoning"
