"""The cost table corrected by what an engine's passes really cost here (``tune/observed.py``), recorded by the
engine, used by the tuner's choice, ``relaygen tune --explain`` and the bench's predicted column."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from test_tune import PROFILE, ScriptedTimer

from relaygen_integrations.bench.predicted import predicted_rows
from relaygen_integrations.bench.summary import Run
from relaygen_integrations.engine.core.configuration import PairConfiguration
from relaygen_integrations.tune.configuration import cost_recorder
from relaygen_integrations.tune.costs import PassCostTable
from relaygen_integrations.tune.observed import (
    MIN_PASSES,
    REMEMBERED_PASSES,
    CostRecorder,
    ObservedCosts,
    bucket_ratios,
    corrected_table,
    read_observed,
)
from relaygen_integrations.tune.tuner import cache_path, tune_pair


def measured_table() -> PassCostTable:
    table = PassCostTable()
    table.put("large", "bf16", {1: 0.2, 2: 0.3, 4: 0.5, 8: 0.9})
    table.put("small", "int8", {1: 0.05, 2: 0.06, 4: 0.08, 8: 0.12})
    return table


def test_each_bucket_is_scaled_by_its_own_observations_and_the_rest_by_the_format_or_the_machine() -> None:
    observed = ObservedCosts()
    # Ten steps at 0.3 s where the table says 0.2 (x1.5); ten 3-position passes at the table's own 0.4 s (x1).
    observed.add({"large": "bf16"}, {"large": {1: 10, 3: 10}}, {"large": {1: 3.0, 3: 4.0}})
    observed.add({"large": "bf16"}, {"large": {6: 2}}, {"large": {6: 10.0}})  # too few for their own bucket
    corrected = corrected_table(measured_table(), observed)
    large, small = corrected.get("large", "bf16"), corrected.get("small", "int8")
    assert large is not None and small is not None
    assert large.at(1) == pytest.approx(0.3) and large.at(3) == pytest.approx(0.4) and large.at(4) == pytest.approx(0.5)
    # 5-8 positions: two passes only, so the format's ratio over everything it ran: (3 + 4 + 10) / (2 + 4 + 1.4).
    format_ratio = 17.0 / 7.4
    assert large.at(8) == pytest.approx(0.9 * format_ratio) and large.at(100) > large.at(8)
    # The small model never ran here: the machine's level (every observed pass) moves it alike.
    assert small.at(1) == pytest.approx(0.05 * format_ratio)
    # The measured table is left as it was, and a corrected one saves only what was measured.
    assert measured_table().get("large", "bf16").at(1) == pytest.approx(0.2)  # type: ignore[union-attr]
    assert corrected.to_json()["seconds"] == measured_table().to_json()["seconds"]
    ratios = bucket_ratios(measured_table().get("large", "bf16"), observed.cells["large"]["bf16"])  # type: ignore[arg-type]
    assert [(r.upto, round(r.ratio, 3), r.passes) for r in ratios] == [(1, 1.5, 10), (4, 1.0, 10), (8, 7.143, 2)]


def test_nothing_observed_prices_as_measured_and_too_little_is_not_trusted() -> None:
    table = measured_table()
    assert corrected_table(table, ObservedCosts()).get("large", "bf16").at(2) == pytest.approx(0.3)  # type: ignore[union-attr]
    few = ObservedCosts()
    few.add({"large": "bf16"}, {"large": {1: MIN_PASSES - 1}}, {"large": {1: 10.0}})
    assert corrected_table(table, few).get("small", "int8").at(1) == pytest.approx(0.05)  # type: ignore[union-attr]
    assert corrected_table(table, few).get("large", "bf16").at(1) == pytest.approx(0.2)  # type: ignore[union-attr]


def test_observations_read_back_from_json_and_old_ones_fade() -> None:
    observed = ObservedCosts()
    observed.add({"large": "bf16", "small": "int8"}, {"large": {"1": 4}, "small": {2: 3}},
                 {"large": {"1": 1.0}, "small": {"2": 0.3}})  # fmt: skip
    again = ObservedCosts.from_json(json.loads(json.dumps(observed.to_json())))
    assert again.cells == {"large": {"bf16": {1: [1.0, 4.0]}}, "small": {"int8": {2: [0.3, 3.0]}}}
    assert ObservedCosts.from_json({"large": {"bf16": {"x": 1}}}).cells == {}  # a damaged file: nothing observed
    observed.add({"large": "bf16"}, {"large": {1: REMEMBERED_PASSES}}, {"large": {1: 100.0}})
    assert observed.passes("large", "bf16") == pytest.approx((REMEMBERED_PASSES + 4) / 2)
    assert observed.cells["large"]["bf16"][1][0] == pytest.approx(101.0 / 2)  # the mean per pass is kept
    assert observed.passes("small", "int8") == 3  # another format keeps its own


def test_a_mismeasured_step_flips_the_choice_once_the_engine_has_seen_what_steps_cost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class SpecCostlyTimer(ScriptedTimer):
        """Passes over several positions cost many steps (bf16 emulated), and the step was measured far too cheap."""

        def time_pass(self, positions: int) -> float:
            self.passes += 1
            step = {"large": 0.1, "small": 0.06}[self.current[0]] * {"int8": 0.5, "fp32": 3.0}.get(self.current[1], 1.0)
            return step * positions * (3.0 if positions > 1 and self.current[0] == "large" else 1.0)

    monkeypatch.setenv("RELAYGEN_HOME", str(tmp_path))
    timer = SpecCostlyTimer()
    cpu = torch.device("cpu")
    first = tune_pair("demo", PROFILE, cpu, timer=timer, home=tmp_path, show_progress=False)
    assert first.choice.winner.candidate.name == "large#bf16" and not first.observed.cells
    measured_large = first.table.get("large", "bf16")
    assert measured_large is not None
    # The engine then ran large bf16 steps at twelve times the measured step, and its 4-position passes as measured.
    recorder = CostRecorder(first.path, {"large": "bf16", "small": "int8"})

    recorder(
        SimpleNamespace(
            passes={"large": {1: 200, 4: 50}},
            pass_seconds={"large": {1: 200 * 12 * measured_large.at(1), 4: 50 * measured_large.at(4)}},
        )
    )
    measured = timer.passes
    second = tune_pair("demo", PROFILE, cpu, timer=timer, home=tmp_path, show_progress=False)
    assert second.cached and timer.passes == measured  # nothing measured again: the observations did it
    assert second.observed.passes("large", "bf16") == 250
    assert second.choice.winner.candidate.name.startswith("large-spec")  # drafts now pay: steps cost what they do
    # A refresh measures again and keeps what the engine observed (facts about this machine).
    third = tune_pair("demo", PROFILE, cpu, timer=timer, home=tmp_path, refresh=True, show_progress=False)
    assert not third.cached and third.observed.passes("large", "bf16") == 250
    assert third.choice.winner.candidate.name == second.choice.winner.candidate.name


def test_an_engine_on_a_tuned_configuration_records_its_passes(
    tokenizer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from helpers import tiny_qwen2

    from relaygen_integrations.engine.engine import RelayEngine

    monkeypatch.setenv("RELAYGEN_HOME", str(tmp_path))
    monkeypatch.setenv("RELAYGEN_TUNE", "on")
    tuned = PairConfiguration(mode="large", speculative=True, source="tuned", candidate="large-spec#bf16/int8",
                              machine="m1")  # fmt: skip
    assert cost_recorder("demo", tuned) is None  # no table cached for that machine: nothing to correct
    measured_table().save(cache_path("demo", "m1", tmp_path))
    assert cost_recorder("demo", PairConfiguration(mode="large", source="profile")) is None
    assert cost_recorder(None, tuned) is None
    monkeypatch.setenv("RELAYGEN_TUNE", "off")
    assert cost_recorder("demo", tuned) is None
    monkeypatch.setenv("RELAYGEN_TUNE", "on")
    recorder = cost_recorder("demo", tuned)
    assert recorder is not None and recorder.formats == {"large": "bf16", "small": "int8"}

    large, small = tiny_qwen2(tokenizer, seed=0), tiny_qwen2(tokenizer, seed=1)
    engine = RelayEngine.from_models(large, small, tokenizer, mode="large", speculative=True)
    engine.on_usage = recorder
    first = engine.generate_ids([1, 2, 3, 4], max_new_tokens=12).usage
    second = engine.generate_ids([1, 2, 3, 5], max_new_tokens=12).usage
    observed = read_observed(cache_path("demo", "m1", tmp_path))
    for role, fmt in (("large", "bf16"), ("small", "int8")):
        cells = observed.cells[role][fmt]
        expected: dict[int, int] = {}
        for usage in (first, second):
            for k, n in usage.passes[role].items():
                expected[k] = expected.get(k, 0) + n
        assert {k: cell[1] for k, cell in cells.items()} == expected
        spent = sum(u.pass_seconds[role][k] for u in (first, second) for k in u.pass_seconds[role])
        assert sum(cell[0] for cell in cells.values()) == pytest.approx(spent, rel=1e-4)
    # The file still holds the measured table: the tuner reads it as before.
    assert PassCostTable.load(cache_path("demo", "m1", tmp_path)).to_json() == measured_table().to_json()


def run(mode: str, problem: int, seconds: float, passes: dict[str, dict[str, int]],
        spent: dict[str, dict[str, float]]) -> Run:  # fmt: skip
    return Run(problem, mode, seconds, 10, "stop", "", None, "", True, passes=passes, pass_seconds=spent)


def test_the_bench_prices_each_mode_with_what_the_other_modes_paid() -> None:
    table = measured_table()
    # large paid 2x the table for its steps; large-spec's passes ran at 1.5x. Neither's own observations price it.
    runs = [
        run("large", 1, 4.0, {"large": {"1": 10}}, {"large": {"1": 4.0}}),
        run(
            "large-spec#bf16/int8",
            1,
            2.0,
            {"large": {"1": 10, "4": 2}, "small": {"1": 10}},
            {"large": {"1": 3.0, "4": 1.5}, "small": {"1": 0.75}},
        ),
    ]
    rows = predicted_rows(runs, ["large", "large-spec#bf16/int8"], table.to_json(), "bf16", {})
    large = rows["large"]
    assert large["predicted_s_per_token"] == pytest.approx(0.2 + 0.001)
    assert large["corrected_s_per_token"] == pytest.approx(0.3 + 0.001)  # the spec run's 1.5x, not its own 2x
    assert large["measured_s_per_token"] == pytest.approx(0.4)
    spec = rows["large-spec#bf16/int8"]
    # Its large steps corrected by large's 2x; its 4-position passes and the small model's (never seen in another
    # mode) by the machine's level, which is large's 2x too.
    assert spec["corrected_s_per_token"] == pytest.approx((10 * 0.4 + 2 * 1.0 + 10 * 0.1) / 10 + 0.001)
    assert not math.isclose(spec["corrected_s_per_token"], spec["predicted_s_per_token"])
    # Runs saved before pass_seconds existed: the measured prediction alone.
    old = [Run(**{**vars(r), "pass_seconds": {}}) for r in runs]
    assert "corrected_s_per_token" not in predicted_rows(old, ["large"], table.to_json(), "bf16", {})["large"]


def test_relaygen_tune_explains_the_observed_ratios_and_chooses_with_them(tmp_path: Path, capsys) -> None:
    from test_tune import DATA

    from relaygen_integrations.cli.main import main

    table = DATA / "tune-avx2-epyc" / "pass_cost.json"  # the AVX2 EPYC: large#bf16 wins, no draft pays
    assert main(["tune", "--costs", str(table), "--explain"]) == 0
    assert "winner: large#bf16" in capsys.readouterr().out
    # The same table with what an engine observed since: its steps cost four times the measured, its 3-4-position
    # passes what was measured. A step is dear against a check: drafting pays.
    saved = json.loads(table.read_text(encoding="utf-8"))
    measured = PassCostTable.from_json(saved).get("large", "bf16")
    assert measured is not None
    observed = ObservedCosts()
    observed.add({"large": "bf16"}, {"large": {1: 300, 4: 60}},
                 {"large": {1: 300 * 4 * measured.at(1), 4: 60 * measured.at(4)}})  # fmt: skip
    corrected = tmp_path / "observed.json"
    corrected.write_text(json.dumps(saved | {"observed": observed.to_json()}), encoding="utf-8")
    assert main(["tune", "--costs", str(corrected), "--explain"]) == 0
    out = capsys.readouterr().out
    assert "observed large:bf16 against measured" in out and "<= 1: x4.00 (300)" in out and "<= 4: x1.00 (60)" in out
    assert "winner: large#bf16 " not in out and "winner: large-spec" in out


def test_on_a_recorded_run_the_corrected_price_is_within_a_few_percent_where_the_measured_was_not() -> None:
    """benchmarks/data/tune-check-observed-avx512: the tuner's day-old table priced every mode 11-18 % below what
    the run paid; corrected by the run's other modes' passes (leave-one-out) each lands within 5 %."""
    data = Path(__file__).resolve().parent.parent / "benchmarks" / "data" / "tune-check-observed-avx512"
    saved = json.loads((data / "results.json").read_text(encoding="utf-8"))
    before = json.loads((data / "tune_table_before.json").read_text(encoding="utf-8"))
    runs = [Run(**run) for run in saved["runs"]]
    modes = ["large", "large-spec#bf16/int8", "relay-spec+verify@prob:0.2#bf16/int8", "default"]
    rows = predicted_rows(runs, modes, before, saved["machine"]["dtype"], saved["configurations"])
    assert set(rows) == set(modes)
    for mode, row in rows.items():
        assert row["ratio"] < 0.9, mode
        assert abs(row["corrected_ratio"] - 1) < 0.05, mode
    # What the engine recorded beside its table during the run: enough large and small passes to trust.
    after = read_observed(data / "tune_table_after.json")
    assert after.passes("large", "bf16") >= MIN_PASSES and after.passes("small", "int8") >= MIN_PASSES
