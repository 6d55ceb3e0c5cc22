"""Cue presets and profiles, load-time checks."""

from __future__ import annotations

import copy
import json

import pytest

from relaygen_integrations.engine import CueConfigError, TokenizerMismatchError, resolve_cues
from relaygen_integrations.engine.core.cues import GENERIC_CUES, QWEN3_CUES, R1_CUES, cue_core, has_left_boundary
from relaygen_integrations.engine.core.pairs import check_tokenizers_match
from relaygen_integrations.engine.core.shipped import ShippedProfile, shipped_profile, shipped_profile_path
from relaygen_integrations.engine.local.weights import pick_dtype


def test_presets_resolve():
    assert resolve_cues("qwen3").cues == QWEN3_CUES
    assert resolve_cues("r1").cues == R1_CUES
    assert resolve_cues("generic").cues == GENERIC_CUES
    assert resolve_cues("auto", pair_name="no-such-pair").cues == GENERIC_CUES
    assert resolve_cues(["So,", "Thus"]).cues == ("So,", "Thus")
    assert resolve_cues(None).cues == ()


def test_profile_file_is_loaded(tmp_path):
    profile = tmp_path / "pair.json"
    profile.write_text(json.dumps({"selected_cues": ["Therefore", "So,"], "table": []}))
    assert resolve_cues(str(profile)).cues == ("Therefore", "So,")


def test_a_shipped_profile_is_read_once_and_read_only():
    # Every reader (configuration, cues, tuner, bench) gets the same parsed object: none can change what another
    # reads, and the demo pair's cues, settings and tuning entry are the file's.
    profile = shipped_profile("demo")
    assert profile is shipped_profile("demo") and shipped_profile("no-such-pair") is None
    on_disk = json.loads(shipped_profile_path("demo").read_text(encoding="utf-8"))
    assert resolve_cues("auto", pair_name="demo").cues == tuple(on_disk["selected_cues"])
    assert resolve_cues("all-candidates", pair_name="demo").cues == tuple(on_disk["candidates"])
    assert profile.setting("mode", "mode") == on_disk["mode"]["mode"]
    assert dict(profile.tuning)["modes"].keys() == on_disk["tuning"]["modes"].keys()
    with pytest.raises(TypeError):
        profile.data["mode"]["mode"] = "small"  # type: ignore[index]
    with pytest.raises(AttributeError):
        profile.data["selected_cues"].append("Hence")  # type: ignore[union-attr]
    assert ShippedProfile.read(shipped_profile_path("demo")).data == profile.data


@pytest.mark.parametrize(
    ("spec", "message"),
    [("nonsense", "unknown cue preset 'nonsense'"), ([""], "empty"), ([",so"], "word character")],
)
def test_bad_cue_specs_are_named(spec, message):
    with pytest.raises(CueConfigError, match=message):
        resolve_cues(spec)


def test_corrupt_profile_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(CueConfigError, match="not JSON"):
        resolve_cues(str(bad))
    with pytest.raises(CueConfigError, match="does not exist"):
        resolve_cues(str(tmp_path / "missing.json"))


def test_word_boundary_helpers():
    assert cue_core("So,") == "So" and cue_core("So ") == "So" and cue_core("double-check") == "double-check"
    assert has_left_boundary("Also", 0) and not has_left_boundary("Also", 2)
    assert has_left_boundary("x. So", 3)


def test_tokenizer_mismatch_names_the_first_differing_token(tokenizer):
    other = copy.deepcopy(tokenizer)
    other.add_tokens(["<zz_new_token>"])
    with pytest.raises(TokenizerMismatchError, match=r"token id \d+: large has None, small has '<zz_new_token>'"):
        check_tokenizers_match(tokenizer, other)
    check_tokenizers_match(tokenizer, copy.deepcopy(tokenizer))


def test_dtype_names():
    import torch

    assert pick_dtype("auto") == torch.bfloat16 and pick_dtype("fp32") == torch.float32
    with pytest.raises(ValueError, match="unknown dtype"):
        pick_dtype("int3")
