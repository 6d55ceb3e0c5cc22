"""LangChain's own standard unit-test suite for chat models, run against RelayChatModel."""

from __future__ import annotations

import pytest
from langchain_tests.unit_tests import ChatModelUnitTests

from relaygen_integrations.langchain import RelayChatModel


class TestRelayChatModelStandard(ChatModelUnitTests):
    @property
    def chat_model_class(self) -> type[RelayChatModel]:
        return RelayChatModel

    @property
    def chat_model_params(self) -> dict:
        # Construction must not load weights: these hub-style names are never fetched by the unit suite.
        return {"large": "org/large-model", "small": "org/small-model"}

    @property
    def has_tool_calling(self) -> bool:
        return True

    @property
    def has_tool_choice(self) -> bool:
        return True

    @property
    def has_structured_output(self) -> bool:
        return True

    @property
    def returns_usage_metadata(self) -> bool:
        return True

    @pytest.fixture
    def model(self, request: pytest.FixtureRequest) -> RelayChatModel:
        return self.chat_model_class(**self.chat_model_params)
