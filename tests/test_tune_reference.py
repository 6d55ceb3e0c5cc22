"""``relaygen tune --profile-from ... --reference``: a run without a ``large`` of its own is compared with another
run's ``large`` on the problems both have, only when nothing that decides that greedy text differs; a run with its
own ``large`` keeps it. Small results.json files written here (tune/profile.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from relaygen_integrations.tune.profile import ReferenceMismatchError, modes_from_results, profiled_modes

CONFIG = {"data": "../shared/data/gsm8k/test_dev.jsonl", "max_new_tokens": 512, "temperature": 0.0, "dtype": "bf16"}
MACHINE = {"cpu": "AMD EPYC", "torch": "2.13.0+cpu", "cpu_flags": ["avx2", "fma", "avx512_bf16"], "dtype": "bf16"}


def run(problem: int, mode: str, correct: bool) -> dict[str, Any]:
    """One benchmark run with the fields a mode's work is read from (a plain large-model decode)."""
    return {"problem": problem, "mode": mode, "correct": correct, "text": f"{mode} {problem}",
            "completion_tokens": 10, "prompt_tokens": 5, "seconds": 1.0, "passes": {"large": {"5": 1, "1": 9}},
            "small_tokens": 0, "switches": 0, "catchup_tokens": 0, "speculative_rounds": 0, "draft_tokens": 0,
            "accepted_draft_tokens": 0}  # fmt: skip


def write(folder: Path, runs: list[dict[str, Any]], config: dict[str, Any] | None = None, **machine: Any) -> Path:
    path = folder / "results.json"
    folder.mkdir(parents=True)
    saved = {"config": {**CONFIG, **(config or {})}, "machine": {**MACHINE, **machine}, "runs": runs}
    path.write_text(json.dumps(saved), encoding="utf-8")
    return path


@pytest.fixture
def reference(tmp_path: Path) -> Path:
    """``large`` on problems 0-9, solving the even ones (5 of 10)."""
    return write(tmp_path / "old", [run(p, "large", p % 2 == 0) for p in range(10)])


@pytest.fixture
def new_run(tmp_path: Path) -> Path:
    """Only GGUF modes, on problems 4-13 (6 shared with the reference): large#gguf solves all but problem 4."""
    runs = [run(p, "large#gguf", p != 4) for p in range(4, 14)]
    runs += [run(p, "large-spec#gguf/int8", p < 8) for p in range(4, 14)]
    return write(tmp_path / "new", runs)


def test_a_run_without_large_is_compared_with_the_references_large_on_shared_problems(
    new_run: Path, reference: Path
) -> None:
    modes = modes_from_results([(new_run, None)], reference=reference)
    assert set(modes) == {"large#gguf", "large-spec#gguf/int8"}
    gguf = modes["large#gguf"].evidence
    # problems 4-9 are in both: large solved 4, 6, 8 (3); large#gguf solved 5-9 (5 of 6)
    assert gguf is not None and (gguf.problems, gguf.solved, gguf.reference_solved) == (6, 5, 3)
    spec = modes["large-spec#gguf/int8"].evidence
    assert spec is not None and (spec.problems, spec.solved, spec.reference_solved) == (6, 4, 3)
    assert gguf.benchmark == f"{new_run.parent} (reference large: {reference.parent})"
    assert modes["large#gguf"].work.runs == 10  # the work is the run's own, all of its problems
    # without the reference such a run has no evidence at all
    assert modes_from_results([(new_run, None)])["large#gguf"].evidence is None


def test_a_run_with_its_own_large_ignores_the_reference(tmp_path: Path, reference: Path) -> None:
    own = [run(p, "large", True) for p in range(3)] + [run(p, "large#gguf", p == 0) for p in range(3)]
    # a different torch too: the reference is not used, so it is not checked either
    path = write(tmp_path / "own", own, torch="2.99.0+cpu")
    evidence = modes_from_results([(path, None)], reference=reference)["large#gguf"].evidence
    assert evidence is not None and (evidence.problems, evidence.solved, evidence.reference_solved) == (3, 1, 3)
    assert evidence.benchmark == str(path.parent)


@pytest.mark.parametrize(
    ("section", "key", "value"),
    [
        ("config", "data", "../shared/data/gsm8k/train_calib.jsonl"),
        ("config", "max_new_tokens", 256),
        ("config", "temperature", 0.7),
        ("machine", "cpu_flags", ["avx2", "fma"]),
        ("machine", "torch", "2.12.0+cpu"),
    ],
)
def test_a_reference_run_under_other_settings_is_refused(
    tmp_path: Path, new_run: Path, section: str, key: str, value: Any
) -> None:
    runs = [run(p, "large", True) for p in range(10)]
    config = {key: value} if section == "config" else None
    machine = {key: value} if section == "machine" else {}
    other = write(tmp_path / "other", runs, config, **machine)
    with pytest.raises(ReferenceMismatchError, match=rf"--reference .*{section} '{key}'") as raised:
        modes_from_results([(new_run, None)], reference=other)
    assert isinstance(raised.value, ValueError)


def test_the_same_flags_in_another_order_are_the_same_machine(tmp_path: Path, new_run: Path) -> None:
    flags = list(reversed(MACHINE["cpu_flags"]))
    other = write(tmp_path / "other", [run(p, "large", True) for p in range(5, 7)], cpu_flags=flags)
    evidence = modes_from_results([(new_run, ["large#gguf"])], reference=other)["large#gguf"].evidence
    assert evidence is not None and (evidence.problems, evidence.reference_solved) == (2, 2)


def test_a_flag_no_kernel_reads_beside_its_wider_form_does_not_part_machines(tmp_path: Path) -> None:
    flags = ["avx2", "avx512_vnni", "avx512_bf16"]
    new = write(tmp_path / "new", [run(p, "large#gguf", True) for p in range(2)], cpu_flags=[*flags, "avx_vnni"])
    old = write(tmp_path / "old", [run(p, "large", True) for p in range(2)], cpu_flags=flags)
    assert modes_from_results([(new, None)], reference=old)["large#gguf"].evidence is not None
    # Without AVX-512 VNNI, avx_vnni selects kernels (oneDNN's AVX2 VNNI path): refused.
    new = write(tmp_path / "new2", [run(p, "large#gguf", True) for p in range(2)], cpu_flags=["avx2", "avx_vnni"])
    old = write(tmp_path / "old2", [run(p, "large", True) for p in range(2)], cpu_flags=["avx2"])
    with pytest.raises(ReferenceMismatchError, match="cpu_flags"):
        modes_from_results([(new, None)], reference=old)


def test_a_reference_without_large_runs_is_refused(tmp_path: Path, new_run: Path) -> None:
    no_large = write(tmp_path / "other", [run(p, "large#int8", True) for p in range(10)])
    with pytest.raises(ReferenceMismatchError, match=r"--reference .*no 'large' runs"):
        modes_from_results([(new_run, None)], reference=no_large)


def test_relaygen_tune_takes_a_reference(tmp_path: Path, new_run: Path, reference: Path, capsys) -> None:
    from relaygen_integrations.cli.main import main

    profile = tmp_path / "p.json"
    profile.write_text("{}")
    assert main(["tune", "--profile", str(profile), "--profile-from", f"{new_run}:large#gguf",
                 "--reference", str(reference)]) == 0  # fmt: skip
    written = json.loads(profile.read_text())
    evidence = profiled_modes(written)["large#gguf"].evidence
    assert evidence is not None and (evidence.problems, evidence.solved, evidence.reference_solved) == (6, 5, 3)
    assert written["tuning"]["sources"] == sorted([str(new_run.parent), str(reference.parent)])
    mismatched = write(tmp_path / "other", [run(0, "large", True)], torch="2.12.0+cpu")
    assert main(["tune", "--profile", str(profile), "--profile-from", str(new_run),
                 "--reference", str(mismatched)]) != 0  # fmt: skip
    assert "--reference" in capsys.readouterr().err
    assert profiled_modes(json.loads(profile.read_text())) == profiled_modes(written)  # nothing written
    with pytest.raises(SystemExit, match="--reference only applies with --profile-from"):
        main(["tune", "--profile", str(profile), "--reference", str(reference)])
