"""The model profile's keys (langchain-core's ``ModelProfile``), each checked against what the pair really does.

The profile is read without loading weights (``chat/profile.py``); these tests load the tiny pair where a value is a
claim about behaviour, and check the claim with it.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
from helpers import PROMPT
from langchain_core.language_models.model_profile import ModelProfile, _warn_unknown_profile_keys
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from thinking_templates import SWITCH, SYSTEM_FIRST_ONLY, templated

from relaygen_integrations import RelayEngine
from relaygen_integrations.engine.core.prompt import MessageError
from relaygen_integrations.engine.core.settings import SettingsError
from relaygen_integrations.langchain import RelayChatModel, convert_messages
from relaygen_integrations.serve.app import create_app

LATER_SYSTEM = [HumanMessage("First question."), AIMessage("First answer."), SystemMessage("NOW-BE-BRIEF"),
                HumanMessage("Second question.")]  # fmt: skip


@pytest.fixture(scope="module")
def engine(tokenizer, pair) -> RelayEngine:
    return RelayEngine.from_models(*pair, tokenizer, cues=["So"])


def test_every_key_is_one_langchain_core_declares(engine):
    profile = RelayChatModel(engine=engine).profile
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # langchain-core warns about keys it does not know
        _warn_unknown_profile_keys(profile)
    assert set(profile) <= set(ModelProfile.__annotations__)
    newer = {"reasoning_effort_levels", "temperature", "mid_conversation_system_messages", "mid_conversation_tools",
             "image_url_inputs", "image_tool_message", "pdf_tool_message", "attachment", "image_outputs"}  # fmt: skip
    assert newer <= set(profile)


def test_a_system_message_after_the_first_turn_stays_where_it_sits(engine):
    assert RelayChatModel(engine=engine).profile["mid_conversation_system_messages"] is True
    prompt = engine.tokenizer.decode(engine.encode_messages(convert_messages(LATER_SYSTEM)))
    assert prompt.index("First answer.") < prompt.index("NOW-BE-BRIEF") < prompt.index("Second question.")


def test_a_template_that_refuses_a_later_system_message_says_so(tokenizer, pair):
    engine = RelayEngine.from_models(
        *pair, templated(tokenizer, SYSTEM_FIRST_ONLY), policy={"reasoning_end": "</think>"}
    )
    model = RelayChatModel(engine=engine, max_tokens=2)
    assert model.profile["mid_conversation_system_messages"] is False
    with pytest.raises(MessageError, match="only supported at the beginning"):
        model.invoke(LATER_SYSTEM)
    assert model.invoke(LATER_SYSTEM[:2] + LATER_SYSTEM[3:]).usage_metadata["output_tokens"] > 0  # the rest renders


def test_the_profile_read_from_files_matches_the_loaded_one(tokenizer, pair, tmp_path: Path):
    """A local directory's config and template files give the same profile as the engine loaded from them."""
    for template, stays in ((SWITCH, True), (SYSTEM_FIRST_ONLY, False)):
        folder = tmp_path / str(stays)
        folder.mkdir()
        pair[0].config.to_json_file(folder / "config.json")
        (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "Qwen2Tokenizer"}))
        (folder / "chat_template.jinja").write_text(template)
        unloaded = RelayChatModel(large=str(folder), small=str(folder))
        assert unloaded._engine is None
        assert unloaded.profile["mid_conversation_system_messages"] is stays
        assert unloaded.profile["max_input_tokens"] == pair[0].config.max_position_embeddings
        loaded = RelayChatModel(engine=RelayEngine.from_models(*pair, templated(tokenizer, template)))
        assert loaded.profile == unloaded.profile
    # the older place of a template: tokenizer_config.json's chat_template
    (tmp_path / "True" / "chat_template.jinja").unlink()
    (tmp_path / "True" / "tokenizer_config.json").write_text(json.dumps({"chat_template": SYSTEM_FIRST_ONLY}))
    assert RelayChatModel(large=str(tmp_path / "True")).profile["mid_conversation_system_messages"] is False


def test_temperature_samples(engine):
    """``temperature``: a sampling temperature changes the text (seeded: reproducibly), and 0 is greedy."""
    model = RelayChatModel(engine=engine, max_tokens=16)
    assert model.profile["temperature"] is True
    greedy = model.invoke("Solve it.").content
    sampled = {seed: model.invoke("Solve it.", temperature=1.0, seed=seed).content for seed in range(3)}
    assert any(text != greedy for text in sampled.values())
    assert model.invoke("Solve it.", temperature=1.0, seed=0).content == sampled[0]


def test_no_reasoning_effort_levels_and_an_effort_is_refused(engine):
    """``reasoning_effort_levels`` is empty: an effort is refused by both the adapter and the server."""
    model = RelayChatModel(engine=engine, max_tokens=2)
    assert model.profile["reasoning_effort_levels"] == []
    with pytest.raises(SettingsError) as error:
        model.invoke("Solve it.", reasoning_effort="low")
    assert error.value.field == "reasoning_effort"
    from fastapi.testclient import TestClient

    with TestClient(create_app(engine)) as client:
        body = {"messages": PROMPT, "max_tokens": 2, "reasoning_effort": "low"}
        refused = client.post("/v1/chat/completions", json=body)
    assert refused.status_code == 400 and "reasoning_effort" in refused.json()["error"]["message"]


def test_no_images_anywhere_not_even_in_a_tool_result(engine):
    """``image_inputs``, ``image_url_inputs``, ``image_tool_message`` are false: each place refuses an image."""
    profile = RelayChatModel(engine=engine).profile
    assert not (profile["image_inputs"] or profile["image_url_inputs"] or profile["image_tool_message"])
    image = {"type": "image", "url": "https://example.com/cat.png"}
    call = AIMessage("", tool_calls=[{"name": "look", "args": {}, "id": "call_1"}])
    for messages in (
        [HumanMessage(content=[image])],
        [HumanMessage("Look."), call, ToolMessage(content=[image], tool_call_id="call_1")],
    ):
        with pytest.raises(ValueError, match="text only"):
            RelayChatModel(engine=engine, max_tokens=2).invoke(messages)


def test_the_engine_and_both_adapters_read_one_context_window(pair, tmp_path: Path):
    """LangChain's profile and LlamaIndex's metadata, before any model loads, give the window the engine will:
    ``max_position_embeddings`` at the config's top or in its ``text_config``, one fallback where it names none
    (they differed there: LlamaIndex fell back to its own 3900, and read ``text_config`` where LangChain did not)."""
    from relaygen_integrations.engine.core.pairs import FALLBACK_CONTEXT_WINDOW, context_window_of
    from relaygen_integrations.engine.local.loading import context_window
    from relaygen_integrations.llama_index import RelayLLM

    cases = {
        "top": ({"max_position_embeddings": 4096}, 4096),
        "text_config": ({"text_config": {"max_position_embeddings": 8192}}, 8192),
        "none": ({"model_type": "qwen2"}, FALLBACK_CONTEXT_WINDOW),
    }
    for name, (config, window) in cases.items():
        folder = tmp_path / name
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(config))
        (folder / "tokenizer_config.json").write_text("{}")
        (folder / "chat_template.jinja").write_text(SWITCH)
        assert context_window_of(config) == window
        assert RelayChatModel(large=str(folder), small=str(folder)).profile["max_input_tokens"] == window
        assert RelayLLM(large=str(folder), small=str(folder)).metadata.context_window == window
    assert context_window(pair[0]) == pair[0].config.max_position_embeddings
