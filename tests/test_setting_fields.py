"""Each setting declared once, each request checked once.

GenerationSettings is the one declaration of a generation setting: both adapters' fields and the server's request
fields are built from it, so a setting added there must show up in each of them (or be named, with its reason, as
one they leave out). A chat request's messages and tools are checked once - by the chat layer, or by the engine when
it is called directly - and a bad one is still the typed error naming the field, before any forward pass.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient
from helpers import PROMPT, ScriptedLM, chat_engine
from langchain_core.messages import HumanMessage
from langchain_core.tools import tool
from llama_index.core.base.llms.types import ChatMessage
from transformers import PreTrainedTokenizerBase

from relaygen_integrations import RelayEngine
from relaygen_integrations.chat.model_fields import ADAPTER_SETTINGS, FIELD_NAMES, NOT_FIELDS
from relaygen_integrations.engine.core import prompt
from relaygen_integrations.engine.core.prompt import MessageError, ToolSchemaError
from relaygen_integrations.engine.core.settings import FIELDS, GenerationPlan, GenerationSettings, merge_settings
from relaygen_integrations.langchain import RelayChatModel
from relaygen_integrations.llama_index import RelayLLM
from relaygen_integrations.serve.app import NOT_OVER_HTTP, OPENAI_NAMED, ChatCompletionRequest, create_app

# A valid value other than the default for every setting. A setting added to GenerationSettings needs one here: the
# round trips below then check that it reaches the engine from an adapter's field and from a request's JSON.
SAMPLES: dict[str, Any] = {
    "max_new_tokens": 9, "temperature": 0.5, "top_p": 0.5, "top_k": 3, "seed": 7, "stop": ["ZZ"], "mode": "large",
    "cues": ["So"], "speculative": 2, "draft_vocab": 100, "reprefill_segments": True, "verify": "greedy",
    "reasoning_format": "inline", "logprobs": True, "top_logprobs": 2, "grammar": 'start: "Yes" | "No"',
    "constrain": False, "tool_format": "llama3_json", "prompt_lookup": True,
}  # fmt: skip
# What a sample needs beside it to be valid (OpenAI's rule: top_logprobs only with logprobs).
NEEDS: dict[str, dict[str, Any]] = {"top_logprobs": {"logprobs": True}}


def sample(name: str) -> dict[str, Any]:
    """The setting's sample value, with what it needs, as settings."""
    return {name: SAMPLES[name], **NEEDS.get(name, {})}


ADAPTERS = (RelayChatModel, RelayLLM)


def test_every_setting_has_a_sample():
    assert set(SAMPLES) == FIELDS, "a new generation setting: add a sample value to SAMPLES"
    for name in SAMPLES:
        assert getattr(merge_settings(sample(name)), name) != GenerationSettings.model_fields[name].default


# -- declared once --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("adapter", ADAPTERS)
def test_every_setting_is_a_field_of_both_adapters(adapter):
    assert set(ADAPTER_SETTINGS.values()) == FIELDS - NOT_FIELDS and NOT_FIELDS <= FIELDS
    for name in FIELDS - NOT_FIELDS:
        field = FIELD_NAMES.get(name, name)
        assert field in adapter.model_fields, f"setting {name!r} is no field of {adapter.__name__}"
        declared = GenerationSettings.model_fields[name]
        assert adapter.model_fields[field].description == (" ".join((declared.description or "").split()) or None)
        if name != "stop":  # the adapters' stop field is a list, None for none (model_fields._DIFFER)
            assert adapter.model_fields[field].default == declared.default


@pytest.fixture
def tiny(tokenizer, pair, monkeypatch) -> tuple[RelayEngine, list[GenerationPlan]]:
    """An engine over the tiny random-weight pair that runs every request, and the plans its backend opened: what
    the engine itself was asked to do (recorded, then run as they are)."""
    engine = RelayEngine.from_models(*pair, tokenizer)
    opened: list[GenerationPlan] = []
    open_session = engine.backend.open

    def recording_open(plan: GenerationPlan, transcript: Any) -> Any:
        opened.append(plan)
        return open_session(plan, transcript)

    monkeypatch.setattr(engine.backend, "open", recording_open)
    return engine, opened


QUESTION = PROMPT[0]["content"]
ENTRY_POINTS = ("langchain", "llama_index", "http")


def reply(entry_point: str, engine: RelayEngine, settings: dict[str, Any]) -> str:
    """The reply to QUESTION through one entry point, ``settings`` given as it takes them: an adapter's fields, or
    the request's JSON (both name max_new_tokens ``max_tokens``)."""
    given = {FIELD_NAMES.get(key, key): value for key, value in settings.items()}
    if entry_point == "langchain":
        return str(RelayChatModel(engine=engine, **given).invoke(QUESTION).content)
    if entry_point == "llama_index":
        message = RelayLLM(engine=engine, **given).chat([ChatMessage(role="user", content=QUESTION)]).message
        return str(message.content)
    response = TestClient(create_app(engine)).post("/v1/chat/completions", json={"messages": PROMPT, **given})
    assert response.status_code == 200, response.text
    return str(response.json()["choices"][0]["message"]["content"])


@pytest.mark.parametrize("adapter", ADAPTERS)
@pytest.mark.parametrize("name", sorted(FIELDS - NOT_FIELDS))
def test_a_configured_setting_reaches_the_engine(tiny, adapter, name):
    engine, opened = tiny
    assert set(adapter(engine=engine).settings_layer()) == FIELDS - NOT_FIELDS
    entry_point = "langchain" if adapter is RelayChatModel else "llama_index"
    reply(entry_point, engine, {"max_new_tokens": 4} | sample(name))  # 4 tokens: short runs, unless the sample
    assert len(opened) == 1
    assert getattr(opened[0].settings, name) == getattr(merge_settings(sample(name)), name)


def test_the_adapters_keep_their_public_field_types_and_bounds():
    fields = RelayChatModel.model_fields
    assert fields["max_tokens"].default == 256 and fields["stop"].default is None and fields["mode"].default is None
    model = RelayChatModel(max_new_tokens=5, stop_sequences="END", top_k="4")  # the aliases, lax conversion
    assert (model.max_tokens, model.stop, model.top_k) == (5, ["END"], 4)
    for bad in ({"temperature": -1.0}, {"top_p": 0.0}, {"max_tokens": 0}, {"top_k": 0}, {"draft_vocab": -1}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            RelayLLM(**bad)


def test_every_setting_is_a_field_of_the_server_request():
    assert OPENAI_NAMED | NOT_OVER_HTTP <= FIELDS
    over_http = FIELDS - OPENAI_NAMED - NOT_OVER_HTTP
    assert over_http <= set(ChatCompletionRequest.model_fields), "a setting is no field of the server's request"
    assert {"max_tokens", "max_completion_tokens"} <= set(ChatCompletionRequest.model_fields)
    assert all(ChatCompletionRequest.model_fields[name].default is None for name in over_http)


@pytest.mark.parametrize("name", sorted(FIELDS - NOT_OVER_HTTP))
def test_a_setting_in_a_request_reaches_the_engine(tiny, name):
    engine, opened = tiny
    assert name not in OPENAI_NAMED or FIELD_NAMES[name] == "max_tokens"  # reply() sends OpenAI's name
    reply("http", engine, {"max_new_tokens": 4} | sample(name))
    assert len(opened) == 1
    assert getattr(opened[0].settings, name) == getattr(merge_settings(sample(name)), name)


def test_a_request_keeps_the_openai_conventions(tiny):
    engine, opened = tiny
    client = TestClient(create_app(engine))
    body = {"messages": PROMPT, "top_k": -1, "stop": "", "max_completion_tokens": 7}
    assert client.post("/v1/chat/completions", json=body).status_code == 200
    assert (opened[-1].settings.top_k, opened[-1].settings.stop, opened[-1].max_new_tokens) == (None, (), 7)
    for left_out in NOT_OVER_HTTP:  # accepted and ignored, as any field the server does not know
        body = {"messages": PROMPT, "max_tokens": 2, left_out: SAMPLES[left_out]}
        assert client.post("/v1/chat/completions", json=body).status_code == 200
        assert getattr(opened[-1].settings, left_out) == GenerationSettings.model_fields[left_out].default


# Settings whose effect shows in the tiny engine's text, each as settings with it and the same without it (or with
# another value): a reply that matches the first run, and not the second, shows the setting arrived and acted.
SAMPLED = {"temperature": 1.0, "seed": 7}
EFFECTS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "max_new_tokens": ({"max_new_tokens": 9}, {}),
    "temperature": (SAMPLED, {"seed": 7}),
    "seed": ({**SAMPLED, "seed": 8}, SAMPLED),
    "top_k": ({**SAMPLED, "top_k": 3}, SAMPLED),
    "top_p": ({**SAMPLED, "top_p": 0.5}, SAMPLED),
    "mode": ({"mode": "small"}, {}),
    "stop": ({"stop": None}, {}),  # a piece of the engine's own text, filled in by the test
    "grammar": ({"grammar": SAMPLES["grammar"]}, {}),
}


@pytest.mark.parametrize("name", sorted(EFFECTS))
def test_a_key_setting_changes_what_the_engine_writes_from_every_entry_point(tiny, name):
    engine, _ = tiny
    budget = {"max_new_tokens": 8}
    given, other = (budget | settings for settings in EFFECTS[name])
    if name == "stop":
        given["stop"] = [engine.generate(PROMPT, **budget).text[6:9]]  # random weights write no English to stop at
    expected = engine.generate(PROMPT, **given).text
    assert expected != engine.generate(PROMPT, **other).text  # on this engine, the setting changes the text
    for entry_point in ENTRY_POINTS:
        assert reply(entry_point, engine, given) == expected, entry_point


# -- checked once ---------------------------------------------------------------------------------------------------
@pytest.fixture
def checks(monkeypatch) -> Counter[str]:
    """Counts the calls of the message and tool checks, wherever a module of the package imported them."""
    counts: Counter[str] = Counter()

    def counted(name: str, check: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            counts[name] += 1
            return check(*args, **kwargs)

        return call

    for check in (prompt.validate_messages, prompt.validate_tools):
        wrapper = counted(check.__name__, check)
        for module in [m for name, m in sys.modules.items() if name.startswith("relaygen_integrations")]:
            for attribute, value in list(vars(module).items()):
                if value is check:
                    monkeypatch.setattr(module, attribute, wrapper)
    return counts


@tool
def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


def test_a_langchain_request_is_checked_once(tokenizer, checks):
    model = RelayChatModel(engine=chat_engine(tokenizer, "Six times seven is 42."), max_tokens=8)
    assert model.invoke("What is 6 times 7?").content
    assert checks == {"validate_messages": 1}
    bound = model.bind_tools([multiply])
    checks.clear()  # bind_tools checks the tools once when they are bound; each request once more, in prepare_chat
    assert bound.invoke("What is 6 times 7?").content
    assert checks == {"validate_messages": 1, "validate_tools": 1}


async def test_an_async_and_a_streamed_request_are_checked_once(tokenizer, checks):
    model = RelayChatModel(engine=chat_engine(tokenizer, "Six times seven is 42."), max_tokens=8)
    assert (await model.ainvoke("What is 6 times 7?")).content
    assert checks == {"validate_messages": 1}
    assert [chunk async for chunk in model.astream("What is 6 times 7?")]
    assert checks == {"validate_messages": 2}


def test_a_llama_index_chat_is_checked_once(tokenizer, checks):
    llm = RelayLLM(engine=chat_engine(tokenizer, "Six times seven is 42."), max_tokens=8)
    assert llm.chat([ChatMessage(role="user", content="What is 6 times 7?")]).message.content
    assert checks == {"validate_messages": 1}


def test_a_direct_engine_call_is_checked_once(tokenizer, checks):
    engine = chat_engine(tokenizer, "Six times seven is 42.")
    tools = [{"type": "function", "function": {"name": "multiply", "parameters": {"type": "object"}}}]
    assert engine.generate(PROMPT, tools=tools, max_new_tokens=8).text
    assert checks == {"validate_messages": 1, "validate_tools": 1}


def _counted_engine(tokenizer: PreTrainedTokenizerBase) -> tuple[RelayEngine, ScriptedLM, ScriptedLM]:
    large, small = ScriptedLM(tokenizer, "Five."), ScriptedLM(tokenizer, "FIVE.")
    return RelayEngine.from_models(large, small, tokenizer, cues=["So"]), large, small  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("call", "error", "field"),
    [
        (lambda m: m.invoke([HumanMessage(content="hi \ud83d")]), MessageError, "messages[0].content"),
        (
            lambda m: m.invoke("hi", chat_template_kwargs={"messages": 5}),
            MessageError,
            "chat_template_kwargs['messages']",
        ),
        (lambda m: m.invoke("hi", tools=[{"type": "function", "function": {}}]), ToolSchemaError, "tools[0]"),
    ],
)
def test_a_bad_chat_request_is_still_named_before_any_forward_pass(tokenizer, call, error, field):
    engine, large, small = _counted_engine(tokenizer)
    with pytest.raises(error) as caught:
        call(RelayChatModel(engine=engine))
    assert caught.value.field == field
    assert large.fed == small.fed == []
