"""The configuration tuner: pass-cost tables, a mode's work, the cost model, the choice per recorded machine, the
cache (a scripted timer counts what is measured), and the configuration the engine gets."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import torch

from relaygen_integrations.engine.core.configuration import PairConfiguration
from relaygen_integrations.engine.core.shipped import shipped_profile
from relaygen_integrations.tune.candidates import MAX_LOST_PROBLEMS, ProfiledMode, expand
from relaygen_integrations.tune.choose import choose
from relaygen_integrations.tune.configuration import configuration_for, configure_pair
from relaygen_integrations.tune.cost_model import seconds_per_token
from relaygen_integrations.tune.costs import PassCostTable, interpolate
from relaygen_integrations.tune.measure import (
    MEASURE_METHOD,
    POSITIONS,
    STEP_SAMPLES,
    ModelPassTimer,
    measure_pass_costs,
    sizes_to_measure,
)
from relaygen_integrations.tune.profile import modes_from_results, profiled_modes
from relaygen_integrations.tune.tuner import CPU_PLAN, cache_path, default_plan, tune_pair
from relaygen_integrations.tune.work import reconstruct_passes, run_passes, work_from_runs

DATA = Path(__file__).resolve().parent.parent / "benchmarks" / "data"
PROFILE = shipped_profile("demo").data  # type: ignore[union-attr]
MODES = profiled_modes(PROFILE)


def table_of(*paths: str) -> PassCostTable:
    """A machine's table, later files overriding earlier ones (the row-scaled int8 remeasure on the same EPYC)."""
    return PassCostTable.load_layered(*(DATA / path for path in paths))


AVX512_BF16 = ("pass-cost-avx512bf16/pass_cost.json", "pass-cost-avx512bf16/pass_cost-int8-row-scaled.json")
MACHINES = {
    "avx512-bf16 EPYC": (AVX512_BF16, "large-spec#bf16/int8"),
    "AMX Xeon": (("pass-cost-avx2-capped/native.json",), "large-spec#bf16/int8"),
    "AMX Xeon, AVX2 paths forced": (("pass-cost-avx2-capped/avx2-capped.json",), "large-spec#bf16/int8"),
    "AVX2 EPYC (issue 2 run)": (("pass-cost-avx2.json",), "large-spec#bf16/int8"),
    # The EPYC this tuner was built on: bf16 passes grow 1.7x from 1 to 2 positions, so no draft pays for itself.
    "AVX2 EPYC (tuner)": (("tune-avx2-epyc/pass_cost.json",), "large#bf16"),
    "H200 (engine's compile=True)": (("gpu-h200/pass_cost.json",), "large#bf16+compile"),
    # A Xeon with AVX-512 and neither AVX512-BF16 nor AMX: bf16 passes grow (315 ms for 1 position, 650 for 4), yet
    # less than the AVX2 EPYC's, and drafts still pay (tune-check-avx512 measured the choice 1.2x faster than large).
    "AVX-512 Xeon without bf16 instructions": (("tune-check-avx512/tune_table.json",), "large-spec#bf16/int8"),
}


def test_interpolation_is_linear_between_and_past_the_measured_sizes() -> None:
    costs = {1: 1.0, 2: 1.5, 4: 2.0, 8: 4.0}
    assert interpolate(costs, 1) == 1.0 and interpolate(costs, 3) == pytest.approx(1.75)
    assert interpolate(costs, 16) == pytest.approx(8.0)  # the last segment's slope, 0.5 per position
    assert interpolate({4: 2.0}, 8) == pytest.approx(4.0) and interpolate({4: 2.0}, 2) == 2.0


def test_a_recorded_histogram_is_used_as_is_and_an_old_run_is_rebuilt_from_its_counts() -> None:
    recorded = {"passes": {"large": {"1": 10, "4": 2}}, "completion_tokens": 18}
    assert run_passes(recorded) == ({"large": {1: 10.0, 4: 2.0}}, False)
    old = {"mode": "large-spec#bf16/int8", "completion_tokens": 101, "speculative_rounds": 20, "draft_tokens": 70,
           "accepted_draft_tokens": 80 - 20, "catchup_tokens": 30, "prompt_tokens": 50}  # fmt: skip
    passes = reconstruct_passes(old)
    # 20 checks of 3.5 drafted tokens + 1: half over 4 positions, half over 5; the large model wrote the other 20
    # tokens (101 - 60 accepted - 20 of its own in the rounds - the first, from the prefill) in one-token steps.
    assert passes["large"] == {50: 1.0, 4: 10.0, 5: 10.0, 1: 20.0}
    # the small model: 20 catch-up passes over 1.5 tokens, 50 further draft steps, the prompt once
    assert passes["small"] == {50: 1.0, 1: 10.0 + 50, 2: 10.0}


def test_the_cost_model_predicts_the_sixty_problem_run_on_its_machine() -> None:
    saved = json.loads((DATA / "relay-vs-spec-60" / "results.json").read_text())
    by_mode: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for run in saved["runs"]:
        by_mode[run["mode"]].append(run)
    table = table_of(*AVX512_BF16)
    for mode, formats in (("large", ("bf16", "bf16")), ("large-spec#bf16/int8", ("bf16", "int8"))):
        runs = by_mode[mode]
        measured = sum(r["seconds"] for r in runs) / sum(r["completion_tokens"] for r in runs)
        predicted = seconds_per_token(work_from_runs(runs), table, dict(zip(("large", "small"), formats, strict=True)))
        assert predicted == pytest.approx(measured, rel=0.05), mode


@pytest.mark.parametrize("machine", sorted(MACHINES))
def test_the_choice_per_recorded_machine(machine: str) -> None:
    paths, expected = MACHINES[machine]
    choice = choose(MODES, table_of(*paths))
    assert choice.winner.candidate.name == expected
    assert choice.winner.candidate.backed
    assert all(p.seconds_per_answer >= choice.winner.seconds_per_answer * 0.98 for p in choice.ranked
               if p.candidate.backed)  # fmt: skip


# recorded run -> (its machine's table, the problems every mode ran)
RECORDED_RUNS = {
    "relay-vs-spec-60": (AVX512_BF16, 20),  # the AVX512-BF16 EPYC
    "tune-check-avx512": (("tune-check-avx512/tune_table.json",), 10),  # the Xeon with AVX-512, no bf16 instructions
    "tune-check-avx2-forced-avx512": (("tune-check-avx2-forced-avx512/tune_table.json",), 10),  # same, AVX2 forced
    # the same Xeon class a day later, the default tuned there and correcting its table by its own passes
    "tune-check-observed-avx512": (("tune-check-observed-avx512/tune_table_before.json",), 10),
}


@pytest.mark.parametrize("run", sorted(RECORDED_RUNS))
def test_where_a_recorded_run_exists_the_choice_is_its_fastest_backed_mode(run: str) -> None:
    """Of a recorded run's modes, the backed ones are large and large-spec#bf16/int8 (the int8 large model lost
    answers, the GGUF's 4-bit one too many); the measured faster one is what the tuner picks on that machine's table
    (``default`` is the candidate the run's engine was tuned to)."""
    paths, problems = RECORDED_RUNS[run]
    saved = json.loads((DATA / run / "results.json").read_text())
    default = (saved.get("configurations") or {}).get("default", {}).get("candidate")
    seconds: dict[str, list[float]] = defaultdict(list)  # per answer: default and its candidate may both have run
    for recorded in saved["runs"]:
        if recorded["problem"] < problems:
            mode = {"large": "large#bf16", "default": default}.get(recorded["mode"], recorded["mode"])
            seconds[mode].append(recorded["seconds"])
    choice = choose(MODES, table_of(*paths))
    backed = {p.candidate.name for p in choice.ranked if p.candidate.backed}
    fastest = min((sum(s) / len(s), m) for m, s in seconds.items() if m in backed)[1]
    assert fastest == choice.winner.candidate.name == "large-spec#bf16/int8"


def test_accuracy_backing_follows_the_rules() -> None:
    candidates = {c.name: c for c in expand(MODES, table_of(*AVX512_BF16))}
    assert not candidates["large#int8"].backed  # lost more than MAX_LOST_PROBLEMS in 20
    assert not candidates["large-spec#int8"].backed  # the int8 large model decides every token
    assert candidates["large-spec#bf16/int8"].backed  # lossless by construction, whatever the drafter's format
    verified = candidates["relay+verify@prob:0.2#bf16"]
    assert verified.backed and "37/60" in verified.why  # evidence: as many solved as large on 60
    assert not candidates["relay-spec#bf16"].backed  # plain relay lost answers, on too few problems
    assert MAX_LOST_PROBLEMS == 2


def test_profile_modes_come_from_the_runs_they_name() -> None:
    modes = modes_from_results([(DATA / "relay-vs-spec-60" / "results.json", ["large", "large-spec#bf16/int8"])])
    assert set(modes) == {"large#bf16", "large-spec#bf16/int8"}
    spec = modes["large-spec#bf16/int8"]
    assert spec.evidence is not None and (spec.evidence.solved, spec.evidence.reference_solved) == (36, 39)
    assert spec.draft_vocab == 32768 and spec.work.runs == 60
    assert MODES["large-spec#bf16/int8"].work.to_json() == spec.work.to_json()  # the shipped profile holds it


class ScriptedTimer:
    """Pass costs from a formula; counts every pass it is asked to time."""

    def __init__(self) -> None:
        self.loads: list[tuple[str, str]] = []
        self.passes = 0

    def load(self, role: str, fmt: str) -> None:
        self.loads.append((role, fmt))
        self.current = (role, fmt)

    def time_pass(self, positions: int) -> float:
        self.passes += 1
        step = {"large": 0.3, "small": 0.06}[self.current[0]] * (0.5 if self.current[1] == "int8" else 1.0)
        return step * (1 + 0.05 * (positions - 1))

    def switch_rows(self) -> int | None:
        return None

    def close(self) -> None:
        pass


def test_first_use_measures_once_and_is_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RELAYGEN_HOME", str(tmp_path))  # no GGUF kept: the plan's four other formats
    timer = ScriptedTimer()
    first = tune_pair("demo", PROFILE, torch.device("cpu"), timer=timer, home=tmp_path, show_progress=False)
    assert not first.cached and timer.passes > 0 and len(timer.loads) == 4
    assert first.path == cache_path("demo", first.machine, tmp_path) and first.path.is_file()
    measured = timer.passes
    second = tune_pair("demo", PROFILE, torch.device("cpu"), timer=timer, home=tmp_path, show_progress=False)
    assert second.cached and timer.passes == measured  # nothing measured the second time
    assert second.choice.winner.candidate.name == first.choice.winner.candidate.name
    third = tune_pair("demo", PROFILE, torch.device("cpu"), timer=timer, home=tmp_path, refresh=True,
                      show_progress=False)  # fmt: skip
    assert not third.cached and timer.passes == 2 * measured


def test_a_table_measured_the_old_way_is_measured_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RELAYGEN_HOME", str(tmp_path))
    timer = ScriptedTimer()
    first = tune_pair("demo", PROFILE, torch.device("cpu"), timer=timer, home=tmp_path, show_progress=False)
    saved = json.loads(first.path.read_text(encoding="utf-8"))
    del saved["machine"]["method"]  # as tables were cached before MEASURE_METHOD (one step sample, sizes to 32)
    first.path.write_text(json.dumps(saved), encoding="utf-8")
    measured = timer.passes
    again = tune_pair("demo", PROFILE, torch.device("cpu"), timer=timer, home=tmp_path, show_progress=False)
    assert not again.cached and timer.passes == 2 * measured
    assert tune_pair("demo", PROFILE, torch.device("cpu"), timer=timer, home=tmp_path, show_progress=False).cached


def test_a_format_that_fails_to_load_is_left_out_and_the_rest_measured() -> None:
    class Failing(ScriptedTimer):
        def load(self, role: str, fmt: str) -> None:
            if fmt == "gguf":
                raise ValueError("no int4 kernel for Q5_K")
            super().load(role, fmt)

    plan = [("large", "bf16"), ("large", "gguf"), ("small", "int8")]
    table = measure_pass_costs(Failing(), plan, budget_seconds=60)
    assert table.formats("large") == ["bf16"] and table.formats("small") == ["int8"]


def keep_demo_ggufs(home: Path) -> None:
    """The demo pair's GGUF files as the registry checks them (the published size; sparse, nothing written)."""
    from relaygen_integrations.registry.cache import gguf_file_path
    from relaygen_integrations.registry.specs import DEMO_PAIR

    for spec in DEMO_PAIR.models():
        path = gguf_file_path(spec, home)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as file:
            file.truncate(spec.gguf_size)


def test_the_cpu_plan_measures_the_large_gguf_only_for_a_pair_that_keeps_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from relaygen_integrations.registry import specs

    monkeypatch.setenv("RELAYGEN_HOME", str(tmp_path))
    cpu = torch.device("cpu")
    without = [("large", "bf16"), ("small", "int8"), ("small", "bf16"), ("large", "fp32")]
    assert list(default_plan(cpu, "demo")) == without  # the demo pair, its GGUFs not kept
    keep_demo_ggufs(tmp_path)
    assert list(default_plan(cpu, "demo")) == list(CPU_PLAN) == [*without[:3], ("large", "gguf"), without[3]]
    other = {role: spec.model_copy(update={"gguf_file": f"other-{role}.gguf"}) for role, spec in
             (("large", specs.DEMO_PAIR.large), ("small", specs.DEMO_PAIR.small))}  # fmt: skip
    monkeypatch.setitem(specs.KNOWN_PAIRS, "other", specs.DEMO_PAIR.model_copy(update={"name": "other", **other}))
    assert ("large", "gguf") not in default_plan(cpu, "other")  # a known pair whose files are not kept
    assert ("large", "gguf") not in default_plan(cpu, "org/not-a-pair") and list(default_plan(cpu)) == without
    assert ("large", "gguf") not in default_plan(torch.device("cuda"), "demo")  # the int4 kernel is CPU-only


def test_a_table_cached_before_the_gguf_was_planned_is_measured_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RELAYGEN_HOME", str(tmp_path))
    timer = ScriptedTimer()
    before = tune_pair("demo", PROFILE, torch.device("cpu"), timer=timer, home=tmp_path, show_progress=False)
    assert ("large", "gguf") not in timer.loads and "large:gguf" not in before.table.machine["plan"]
    keep_demo_ggufs(tmp_path)
    timer.loads.clear()
    after = tune_pair("demo", PROFILE, torch.device("cpu"), timer=timer, home=tmp_path, show_progress=False)
    assert not after.cached and timer.loads == list(CPU_PLAN) and after.table.has("large", "gguf")
    assert tune_pair("demo", PROFILE, torch.device("cpu"), timer=timer, home=tmp_path, show_progress=False).cached


def test_the_budget_cuts_the_plan_and_the_cut_is_remembered(tmp_path: Path) -> None:
    now = [0.0]
    timer = ScriptedTimer()
    original = timer.time_pass

    def ticking(positions: int) -> float:
        seconds = original(positions)
        now[0] += seconds
        return seconds

    timer.time_pass = ticking  # type: ignore[method-assign]
    table = measure_pass_costs(timer, [("large", "bf16"), ("small", "int8"), ("large", "fp32")], budget_seconds=2.8,
                               clock=lambda: now[0])  # fmt: skip
    # large bf16 stops before 16 positions (expected to overrun), small int8 fits whole, fp32 gets only its warm-up
    assert sorted(table.costs["large"]["bf16"].seconds) == [1, 2, 4, 8]
    assert sorted(table.costs["small"]["int8"].seconds) == [1, 2, 4, 8, 16, 32]
    assert not table.has("large", "fp32") and now[0] <= 2.8 + 0.3


class SwitchingTimer(ScriptedTimer):
    """A bf16 model whose passes of 24 rows or more run in fp32: a fixed conversion cost, then a flatter slope."""

    def __init__(self) -> None:
        super().__init__()
        self.widths: list[int] = []

    def time_pass(self, positions: int) -> float:
        self.passes += 1
        self.widths.append(positions)
        return 0.3 + 0.07 * (positions - 1) if positions < 24 else 3.6 + 0.01 * positions

    def switch_rows(self) -> int | None:
        return 24


def test_a_kernel_switch_inside_the_sizes_is_measured_past_and_steps_are_timed_three_times() -> None:
    assert sizes_to_measure(POSITIONS, None) == list(POSITIONS)
    assert sizes_to_measure(POSITIONS, 24) == [*POSITIONS, 64]  # 32 and 64 past the switch
    assert sizes_to_measure((1, 4), 24) == [1, 4, 24, 48]
    timer = SwitchingTimer()
    table = measure_pass_costs(timer, [("large", "bf16")], budget_seconds=60)
    assert timer.widths.count(1) == 1 + STEP_SAMPLES and max(timer.widths) == 64  # warm-up + samples; 64 measured
    costs = table.costs["large"]["bf16"]
    # A 100-token prompt priced with the fp32 regime's own slope (32 -> 64), not the jump from 16 (bf16) to 32 (fp32).
    assert costs.at(100) == pytest.approx(3.6 + 0.01 * 100)


def test_an_explicit_setting_or_tune_off_never_measures(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr("relaygen_integrations.tune.tuner.tune_pair", lambda *a, **k: calls.append("tuned"))
    monkeypatch.setenv("RELAYGEN_TUNE", "on")
    cpu = torch.device("cpu")
    explicit = configure_pair("demo", cpu, {"dtype": "bf16", "mode": "auto"})
    assert explicit.source == "profile" and explicit.dtype == "bf16" and explicit.mode == "large" and not calls
    monkeypatch.setenv("RELAYGEN_TUNE", "off")
    assert configure_pair("demo", cpu, {}) == PairConfiguration.shipped("demo", "cpu") and not calls
    assert configure_pair(None, cpu, {}).source == "generic" and not calls


def test_tuning_picks_the_winner_as_the_engine_configuration(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RELAYGEN_TUNE", "on")
    monkeypatch.setenv("RELAYGEN_HOME", str(tmp_path))
    machine_table = table_of("tune-avx2-epyc/pass_cost.json")
    machine_table.machine = {"plan": ["large:bf16", "small:int8", "small:bf16", "large:fp32"], "method": MEASURE_METHOD}
    from relaygen_integrations.tune.machine import this_machine

    machine_table.save(cache_path("demo", this_machine("cpu"), tmp_path))
    configuration = configure_pair("demo", torch.device("cpu"), {"mode": "auto", "dtype": "auto"})
    assert configuration.source == "tuned" and configuration.candidate == "large#bf16"
    assert (configuration.mode, configuration.speculative, configuration.dtype) == ("large", False, "bf16")


def test_configurations_map_candidates_to_engine_settings() -> None:
    candidates = {c.name: c for c in expand(MODES, table_of(*AVX512_BF16))}
    spec = configuration_for(candidates["large-spec#bf16/int8"], 2.6, "m")
    assert (spec.mode, spec.speculative, spec.dtype, spec.draft_vocab) == ("large", True, "bf16/int8", 32768)
    verified = configuration_for(candidates["relay+verify@prob:0.2#bf16"], 1.0, "m")
    assert (verified.mode, verified.speculative, verified.verify, verified.dtype) == ("relay", False, "prob:0.2",
                                                                                     "bf16")  # fmt: skip
    # Drafts copied from the context are speculation: the text is the large model's, the engine runs prompt_lookup.
    lookup_mode = ProfiledMode("large-spec+lookup#bf16/int8", MODES["large-spec#bf16/int8"].work, None, 32768)
    (copied,) = [c for c in expand({"m": lookup_mode}, table_of(*AVX512_BF16)) if c.formats["small"] == "int8"]
    assert copied.backed and "lossless" in copied.why
    lookup = configuration_for(copied, 2.8, "m")
    assert (lookup.mode, lookup.speculative, lookup.prompt_lookup, lookup.dtype) == ("large", True, True, "bf16/int8")
    assert not spec.prompt_lookup
    shipped = PairConfiguration.shipped("demo", "cpu")
    assert (shipped.mode, shipped.speculative, shipped.dtype, shipped.verify, shipped.draft_vocab) == (
        "large", True, "bf16/int8", "prob:0.2", 32768)  # fmt: skip
    assert PairConfiguration.shipped("demo", "cuda").dtype == "auto"  # bf16 (no CUDA entry)


def test_the_real_timer_times_a_model_and_leaves_its_context_as_it_was(tokenizer) -> None:
    from helpers import tiny_qwen2

    model = tiny_qwen2(tokenizer, seed=0)
    timer = ModelPassTimer(lambda role, fmt: model, context=16)
    table = measure_pass_costs(timer, [("large", "fp32")], positions=(1, 4), budget_seconds=30)
    assert set(table.costs["large"]["fp32"].seconds) == {1, 4}
    assert all(s > 0 for s in table.costs["large"]["fp32"].seconds.values())
    timer.load("large", "fp32")
    timer.time_pass(4)
    assert timer.cache.get_seq_length() == 16  # type: ignore[attr-defined]


def test_the_configuration_reaches_every_result(tokenizer) -> None:
    from helpers import tiny_qwen2

    from relaygen_integrations.engine.engine import RelayEngine
    from relaygen_integrations.llama_index.events import _raw

    large, small = tiny_qwen2(tokenizer, seed=0), tiny_qwen2(tokenizer, seed=1)
    engine = RelayEngine.from_models(large, small, tokenizer, mode="large")
    assert engine.generate_ids([1, 2, 3], max_new_tokens=2).configuration is None
    engine.configuration = PairConfiguration(mode="large", source="tuned", candidate="large#bf16")
    result = engine.generate_ids([1, 2, 3], max_new_tokens=2)
    assert result.relay_metadata()["configuration"]["candidate"] == "large#bf16"  # LangChain's response_metadata
    assert _raw(result)["configuration"]["source"] == "tuned"  # LlamaIndex's raw
    assert sum(result.usage.passes["large"].values()) >= 2  # the prefill and a step, by size


def test_a_known_pairs_auto_is_a_shared_copy_of_its_own() -> None:
    """ "auto" may be tuned to formats other than the profile's: an explicit format must never get that engine."""
    from relaygen_integrations.engine.local.loading import pair_key

    auto = pair_key("demo", "demo", "cpu", "auto", {})
    assert auto != pair_key("demo", "demo", "cpu", "bf16/int8", {}) and auto == pair_key(
        "demo", "demo", "cpu", "auto", {}
    )
    assert pair_key("org/a", "org/b", "cpu", "auto", {}) == pair_key("org/a", "org/b", "cpu", "bf16", {})


def test_relaygen_tune_explains_a_recorded_machine_and_writes_a_profile_entry(tmp_path: Path, capsys) -> None:
    from relaygen_integrations.cli.main import main

    assert main(["tune", "--costs", str(DATA / "tune-avx2-epyc" / "pass_cost.json"), "--explain"]) == 0
    out = capsys.readouterr().out
    assert "winner: large#bf16" in out and "large-spec#bf16/int8" in out and "not backed" in out
    assert '"candidate": "large#bf16"' in out
    profile = tmp_path / "p.json"
    profile.write_text("{}")
    results = DATA / "relay-vs-spec-60" / "results.json"
    assert main(["tune", "--profile", str(profile), "--profile-from", f"{results}:large,large-spec#bf16/int8"]) == 0
    written = profiled_modes(json.loads(profile.read_text()))
    assert set(written) == {"large#bf16", "large-spec#bf16/int8"}
    assert written["large-spec#bf16/int8"].work.to_json() == MODES["large-spec#bf16/int8"].work.to_json()


def test_bench_auto_modes_are_large_and_the_tuners_top_backed_candidates(monkeypatch: pytest.MonkeyPatch) -> None:
    from relaygen_integrations.bench import predicted

    class Tuned:
        choice = choose(MODES, table_of(*AVX512_BF16))

    monkeypatch.setattr("relaygen_integrations.bench.predicted.tune_pair", lambda *args, **kwargs: Tuned())
    modes = predicted.auto_modes("demo", "demo")
    # the draft vocabulary the profiled run used is part of the mode's name, so the bench runs what was priced
    assert modes == ["large", "large-spec@32768#bf16/int8", "large-spec#bf16", "relay+verify@prob:0.2#bf16"]
    with pytest.raises(ValueError, match="known pair"):
        predicted.auto_modes("org/a", "org/b")
