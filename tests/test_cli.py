"""`relaygen generate` / `relaygen demo` on a scripted engine (the CLI wiring, JSON output, coloured stream)."""

from __future__ import annotations

import json

import pytest
from helpers import chat_engine

from relaygen_integrations import RelayEngine
from relaygen_integrations.cli.main import main

REPLY = "We add two and three. So the answer is five. Then we are done."


@pytest.fixture
def scripted(monkeypatch, tokenizer):
    engine = chat_engine(tokenizer, REPLY, cues=["So "])
    calls = []

    def shared(cls, large="demo", small="demo", **kwargs):
        calls.append((large, small, kwargs))
        return engine

    monkeypatch.setattr(RelayEngine, "shared", classmethod(shared))
    return calls


def test_generate_json(scripted, capsys):
    assert main(["generate", "Add two and three.", "--json", "--max-new-tokens", "100", "--cues", "So ,Thus"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["text"] == "We add two and three. So THE ANSWER IS FIVE. Then we are done."
    assert [s["model"] for s in out["spans"]] == ["large", "small", "large"]
    assert out["usage"]["switches"] == 2 and out["finish_reason"] == "stop"
    assert scripted[0][2] == {"device": "auto", "dtype": "auto", "compile": False}  # shared whatever the cues


def test_generate_cues_apply_per_request(scripted, capsys):
    # The shared engine's own cues say "So "; the command's cues replace them for this request, so nothing fires.
    assert main(["generate", "Add two and three.", "--json", "--max-new-tokens", "100", "--cues", "Thus,Hence"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["text"] == REPLY and [s["model"] for s in out["spans"]] == ["large"]


def test_generate_streams_text_and_a_stats_line(scripted, capsys):
    assert main(["generate", "Add two and three.", "--max-new-tokens", "100"]) == 0
    out = capsys.readouterr().out
    assert "We add two and three. So THE ANSWER IS FIVE. Then we are done." in out
    assert "switches 2" in out and "small" in out


def test_demo_runs_a_gsm8k_question_and_checks_the_index(scripted, capsys):
    assert main(["demo", "--max-new-tokens", "100"]) == 0
    out = capsys.readouterr().out
    assert "Janet" in out and "reference answer: 18" in out and "switches 2" in out
    # The large model alone first, then relay, then the comparison of the two on this question.
    assert out.index("large alone") < out.index("relay (reference") < out.index("relay answered in")
    assert "1.00x" in out and "wrong" in out  # the scripted reply's answer (five) is not 18
    assert main(["demo", "--index", "99"]) == 2


def test_demo_json_has_both_runs_with_checked_answers(scripted, capsys):
    assert main(["demo", "--json", "--max-new-tokens", "100", "--verify", "greedy"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["reference"] == "18" and list(out["runs"]) == ["large alone", "relay, verified (greedy)"]
    alone, relay = out["runs"]["large alone"], out["runs"]["relay, verified (greedy)"]
    assert [s["model"] for s in alone["spans"]] == ["large"] and alone["usage"]["small_tokens"] == 0
    # The scripted large model rejects the small model's upper-case sentence: relay writes the large model's text.
    assert relay["usage"]["rejected_tokens"] > 0 and relay["text"] == alone["text"] and relay["correct"] is False


def test_demo_table_counts_the_rejected_tokens_of_a_verified_relay(scripted, capsys):
    assert main(["demo", "--max-new-tokens", "100", "--verify", "greedy"]) == 0
    out = capsys.readouterr().out
    assert "relay, verified (greedy) (reference" in out
    header = next(line for line in out.splitlines() if "tok/s" in line and "answer" in line)
    assert header.replace("┃", " ").split() == [
        "run",
        "answer",
        "tokens",
        "small",
        "rejected",
        "s",
        "tok/s",
        "speed-up",
    ]
    assert "faster to the answer on this question" in out
    row = next(line for line in out.splitlines() if line.strip().startswith("relay,") and "│" in line)
    assert int(row.split("│")[4]) > 0  # the upper-case sentence the scripted large model rejects
    assert main(["demo", "--max-new-tokens", "100"]) == 0  # unverified: no such column
    assert "rejected" not in next(line for line in capsys.readouterr().out.splitlines() if "tok/s" in line)


def test_demo_without_comparison_runs_relay_only(scripted, capsys):
    assert main(["demo", "--no-compare", "--json", "--max-new-tokens", "100"]) == 0
    assert list(json.loads(capsys.readouterr().out)["runs"]) == ["relay"]


def test_generate_refuses_a_bad_draft_vocabulary_before_loading(scripted, capsys):
    assert main(["generate", "Add two and three.", "--speculative", "--draft-vocab", "-5"]) != 0
    assert "draft_vocab" in capsys.readouterr().err and scripted == []  # no engine was asked for
