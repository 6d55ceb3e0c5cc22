"""Structured output on the real demo pair: 20 varied prompts, one nested pydantic schema, and every result
validates - through LangChain's ``with_structured_output(method="json_schema")``, LlamaIndex's ``structured_predict``
/ ``as_structured_llm`` and ``relaygen serve``'s ``response_format`` (each under the schema's grammar). The three
fronts share the 20 prompts between them (every third prompt each) rather than each answering all 20: the grammar is
the same engine code behind all three, and 60 answers of up to 160 tokens took 17 min on a 2-core CPU without bf16
instructions, more than CI can give one file."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from relaygen_integrations import RelayEngine
from relaygen_integrations.registry import pair_paths

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from grammar_mask import Landmark  # the one nested schema: the mask benchmark's too

pytestmark = pytest.mark.real_pair


LANDMARKS = [
    "the Eiffel Tower", "the Colosseum", "the Statue of Liberty", "the Sydney Opera House", "the Taj Mahal",
    "the Golden Gate Bridge", "Big Ben", "the Burj Khalifa", "the Leaning Tower of Pisa", "the Brandenburg Gate",
    "the Empire State Building", "the Sagrada Familia", "Tower Bridge", "the CN Tower", "the Space Needle",
    "the Atomium", "the Petronas Towers", "the Parthenon", "Neuschwanstein Castle", "the Gateway Arch",
]  # fmt: skip
PROMPTS = [
    f"{opening} {landmark}." for opening, landmark in zip(
        ["Describe", "Tell me about", "Give me the facts on", "What do you know about"] * 5, LANDMARKS, strict=True
    )
]  # fmt: skip
LANGCHAIN_PROMPTS, LLAMA_INDEX_PROMPTS, SERVER_PROMPTS = PROMPTS[0::3], PROMPTS[1::3], PROMPTS[2::3]


@pytest.fixture(scope="module")
def engine() -> RelayEngine:
    if pair_paths("demo") is None:
        pytest.fail("the demo pair is not cached: run `relaygen models fetch demo` (make test does this first)")
    return RelayEngine.shared()


def test_langchain_json_schema_output_validates(engine):
    from relaygen_integrations.langchain import RelayChatModel

    structured = RelayChatModel(engine=engine, max_tokens=160).with_structured_output(Landmark, method="json_schema")
    results = [structured.invoke(prompt) for prompt in LANGCHAIN_PROMPTS]
    assert len(results) == 7 and all(isinstance(result, Landmark) for result in results)


def test_llama_index_structured_predict_validates(engine):
    from llama_index.core.llms import ChatMessage
    from llama_index.core.prompts import PromptTemplate

    from relaygen_integrations.llama_index import RelayLLM

    llm = RelayLLM(engine=engine, max_tokens=160)
    half = len(LLAMA_INDEX_PROMPTS) // 2
    template = PromptTemplate("{question}")
    predicted = [llm.structured_predict(Landmark, template, question=p) for p in LLAMA_INDEX_PROMPTS[:half]]
    assert len(predicted) == 3 and all(isinstance(result, Landmark) for result in predicted)
    structured = llm.as_structured_llm(Landmark)
    for prompt in LLAMA_INDEX_PROMPTS[half:]:
        response = structured.chat([ChatMessage(role="user", content=prompt)])
        assert isinstance(response.raw, Landmark)


def test_server_response_format_validates(engine):
    from relaygen_integrations.serve.app import create_app

    response_format = {
        "type": "json_schema",
        "json_schema": {"name": "landmark", "schema": Landmark.model_json_schema()},
    }
    with TestClient(create_app(engine)) as client:
        for prompt in SERVER_PROMPTS:
            body = {
                "messages": [{"role": "user", "content": prompt}],
                "max_tokens": 160,
                "response_format": response_format,
            }
            answer = client.post("/v1/chat/completions", json=body)
            assert answer.status_code == 200, answer.text
            Landmark.model_validate_json(answer.json()["choices"][0]["message"]["content"])
