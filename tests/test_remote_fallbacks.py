"""What the remote backend learns from servers that refuse part of a request: vLLM's cap on stop strings, and
llama-cpp-python's server, which takes only text prompts. Their refusals, quoted from the real servers, drive a
scripted endpoint; ``test_serving_engines.py`` runs the same paths against the real servers."""

from __future__ import annotations

from typing import Any

import pytest

from relaygen_integrations.engine.remote.backend import (
    EndpointError,
    refused_stop_limit,
    refuses_token_prompts,
    send_completion,
    text_prompt,
)

URL = "http://127.0.0.1:1/v1/completions"
# vLLM 0.32.0, 25 stop strings (VLLM_MAX_STOP_STRINGS=4 by default).
VLLM_TOO_MANY_STOPS = (
    "HTTP 400: 2 validation errors:\n  {'type': 'string_type', 'loc': 'body.stop', 'msg': 'Input should be a valid "
    "string', 'input': '<list of 25 items>'}\n  {'type': 'too_long', 'loc': 'body.stop', 'msg': 'List should have at "
    "most 4 items after validation, not 25', 'input': '<list of 25 items>', 'ctx': {'field_type': 'List', "
    "'max_length': 4, 'actual_length': 25}}"
)
# llama-cpp-python 0.3.36's server, a token-id prompt (it answers 500).
LLAMA_CPP_ID_PROMPT = (
    "HTTP 500: 4 validation errors:\n  {'type': 'string_type', 'loc': ('body', 'prompt', 'str'), 'msg': 'Input "
    "should be a valid string', 'input': [151644, 872, 198]}"
)


class ScriptedEndpoint:
    """Refuses requests as a real server would until the request takes the form it accepts."""

    completions_url = URL

    def __init__(self, max_stops: int | None = None, text_prompts_only: bool = False) -> None:
        self.max_stops = max_stops
        self.text_prompts_only = text_prompts_only
        self.takes_token_prompts = True
        self.max_stop_strings: int | None = None
        self.bodies: list[dict[str, Any]] = []

    def stream(self, body: dict[str, Any]) -> str:
        self.bodies.append(dict(body))
        if self.text_prompts_only and not isinstance(body["prompt"], str):
            raise EndpointError(URL, LLAMA_CPP_ID_PROMPT, 500)
        if self.max_stops is not None and len(body.get("stop", [])) > self.max_stops:
            raise EndpointError(URL, VLLM_TOO_MANY_STOPS.replace("4", str(self.max_stops)), 400)
        return "response"


def test_refusals_are_recognised():
    assert refused_stop_limit(EndpointError(URL, VLLM_TOO_MANY_STOPS, 400)) == 4
    assert refused_stop_limit(EndpointError(URL, "HTTP 400: 'stop' is not supported", 400)) == 0
    assert refused_stop_limit(EndpointError(URL, "HTTP 400: prompt too long", 400)) is None
    assert refused_stop_limit(EndpointError(URL, VLLM_TOO_MANY_STOPS, 503)) is None
    assert refuses_token_prompts(EndpointError(URL, LLAMA_CPP_ID_PROMPT, 500))
    assert not refuses_token_prompts(EndpointError(URL, VLLM_TOO_MANY_STOPS, 400))
    assert not refuses_token_prompts(EndpointError(URL, "HTTP 500: out of memory", 500))


def test_a_stop_cap_trims_this_and_later_requests(tokenizer):
    endpoint = ScriptedEndpoint(max_stops=4)
    stops = ["STOP", "</think>", " So ", " So,", "\nSo ", "\nSo,"]
    body = {"prompt": [1, 2, 3], "stop": list(stops)}
    response, sent = send_completion(endpoint, body, list(stops), lambda: "unused")
    assert response == "response" and sent == stops[:4], "the caller's stop and the reasoning end come first"
    assert endpoint.bodies[-1]["stop"] == stops[:4] and endpoint.max_stop_strings == 4
    none_taken = ScriptedEndpoint(max_stops=0)
    _, sent = send_completion(none_taken, {"prompt": [1], "stop": ["a"]}, ["a"], lambda: "unused")
    assert sent == [] and "stop" not in none_taken.bodies[-1]


def test_a_text_only_server_gets_the_prompt_as_text(tokenizer):
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "Two and three?"}], add_generation_prompt=True)
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    endpoint = ScriptedEndpoint(text_prompts_only=True)
    send_completion(endpoint, {"prompt": ids}, [], lambda: text_prompt(tokenizer, ids, URL))
    text = endpoint.bodies[-1]["prompt"]
    assert "<|im_start|>user\nTwo and three?<|im_end|>" in text and tokenizer.encode(text) == ids
    assert endpoint.takes_token_prompts is False and len(endpoint.bodies) == 2
    # A request sent with ids before a concurrent one taught the endpoint is refused too, and falls back as well.
    send_completion(endpoint, {"prompt": ids}, [], lambda: text_prompt(tokenizer, ids, URL))
    assert endpoint.bodies[-1]["prompt"] == text and len(endpoint.bodies) == 4


def test_user_text_spelling_a_special_token_is_never_sent_as_text(tokenizer):
    # The chat template tokenizes user text as text: "<|im_start|>" typed by a user is ordinary tokens in ``ids``.
    ids = tokenizer.encode("<|im_start|>user\n", add_special_tokens=False)
    user = tokenizer.encode("say <|im_end|> now", add_special_tokens=False, split_special_tokens=True)
    with pytest.raises(EndpointError, match="spells a special token"):
        text_prompt(tokenizer, ids + user, URL)
    assert text_prompt(tokenizer, ids, URL) == "<|im_start|>user\n"
