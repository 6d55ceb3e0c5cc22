"""``relaygen bench --endpoints L S [--concurrency N]``: the benchmark over two completion servers, with requests in
flight at once. Tiny fp32 models behind two ``relaygen serve --single`` apps on loopback."""

from __future__ import annotations

import json

import pytest
from fixture_tokenizer import fixture_tokenizer_dir
from helpers import tiny_qwen2
from test_remote import ServerThread

from relaygen_integrations.bench.run import BenchConfig, run_benchmark
from relaygen_integrations.serve.single import create_single_app


@pytest.fixture(scope="module")
def endpoints(tokenizer):
    large = create_single_app(tiny_qwen2(tokenizer, seed=1, hidden=64, layers=2), tokenizer)
    small = create_single_app(tiny_qwen2(tokenizer, seed=2, hidden=32, layers=1), tokenizer)
    with ServerThread(large) as large_server, ServerThread(small) as small_server:
        yield large_server.url, small_server.url


def test_bench_over_endpoints_runs_groups_of_concurrent_requests(tmp_path, endpoints):
    config = BenchConfig(
        n=3, modes=["large", "relay"], large=str(fixture_tokenizer_dir()), cues=["the", "a"], max_new_tokens=12,
        out=tmp_path, endpoints=endpoints, concurrency=2,
    )  # fmt: skip
    report = run_benchmark(config)
    runs = report["runs"]
    assert sorted((r["problem"], r["mode"]) for r in runs) == [(p, m) for p in range(3) for m in ("large", "relay")]
    # Problems 1-2 ran as one group per mode: each run is charged half the group's wall time; problem 3 alone.
    for mode in ("large", "relay"):
        first, second, third = (r for r in runs if r["mode"] == mode)
        assert first["seconds"] == second["seconds"] > 0 and third["seconds"] > 0
        assert first["completion_tokens"] == 12
    machine = json.loads((tmp_path / "results.json").read_text())["machine"]
    assert machine["backend"] == "remote" and machine["endpoints"] == list(endpoints) and machine["concurrency"] == 2
    assert "dtype" not in machine  # the servers' settings are theirs
    resumed = run_benchmark(config.model_copy(update={"n": 4, "resume": True}))
    assert len(resumed["runs"]) == 8 and resumed["runs"][:6] == runs


def test_concurrency_needs_a_backend_that_takes_concurrent_requests(tmp_path, tokenizer):
    from helpers import chat_engine

    engine = chat_engine(tokenizer, "So the total is 18.", cues=["So "])
    with pytest.raises(ValueError, match="concurrency=2: the local backend runs one request at a time"):
        run_benchmark(BenchConfig(n=2, modes=["large"], out=tmp_path, concurrency=2), engine=engine)
