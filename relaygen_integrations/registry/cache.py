"""The on-disk cache: where everything lives under ``relaygen_home()``, the ``relaygen.json`` manifests that
mark a directory complete, and the lock / temp-dir / atomic-rename steps that keep a half-built directory from
ever looking complete.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from filelock import FileLock
from pydantic import BaseModel, ValidationError

from .specs import DType, ModelSpec, PairSpec, Role

__all__ = ["MANIFEST_FORMAT", "MANIFEST_NAME", "TOKENIZER_DIRNAME", "relaygen_home"]

MANIFEST_NAME = "relaygen.json"
# Bumped whenever the on-disk layout of a converted directory changes, so old directories get rebuilt.
MANIFEST_FORMAT = 1
TOKENIZER_DIRNAME = "tokenizer"


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


# ---------------------------------------------------------------------------------------------- layout


def relaygen_home() -> Path:
    """Root of everything this package caches: ``$RELAYGEN_HOME`` or ``~/.cache/relaygen``."""
    env = os.environ.get("RELAYGEN_HOME")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "relaygen"


def gguf_file_path(spec: ModelSpec, home: Path) -> Path:
    return home / "gguf" / spec.gguf_file


def _pair_root(pair: str, home: Path) -> Path:
    return home / "models" / pair


def model_dir(pair: str, role: Role, dtype: DType, home: Path) -> Path:
    return _pair_root(pair, home) / f"{role}-{dtype}"


def tokenizer_dir(pair: str, home: Path) -> Path:
    return _pair_root(pair, home) / TOKENIZER_DIRNAME


def gguf_size_ok(spec: ModelSpec, home: Path) -> Path | None:
    """The kept GGUF if it has the published size. Cheap, for reporting only: fetch_pair re-hashes it before use."""
    path = gguf_file_path(spec, home)
    try:
        return path if path.stat().st_size == spec.gguf_size else None
    except OSError:
        return None


# ------------------------------------------------------------------------------------------- manifests


def _dir_files(directory: Path) -> dict[str, int]:
    return {
        p.relative_to(directory).as_posix(): p.stat().st_size
        for p in sorted(directory.rglob("*"))
        if p.is_file() and p.name != MANIFEST_NAME
    }


def write_manifest(directory: Path, **fields: Any) -> None:
    try:
        import transformers

        tf_version: str | None = transformers.__version__
    except ImportError:  # the tokenizer/model writers need it, but a fake converter in tests may not
        tf_version = None
    manifest = _Manifest(
        format=MANIFEST_FORMAT,
        files=_dir_files(directory),
        created=datetime.now(UTC).isoformat(timespec="seconds"),
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


def model_dir_valid(pair: PairSpec, role: Role, dtype: DType, home: Path) -> bool:
    spec = pair.model(role)
    directory = model_dir(pair.name, role, dtype, home)
    return (
        _read_valid_manifest(directory, pair=pair.name, role=role, dtype=dtype, source_sha256=spec.gguf_sha256)
        is not None
    )


def tokenizer_dir_valid(pair: PairSpec, home: Path) -> bool:
    directory = tokenizer_dir(pair.name, home)
    return (
        _read_valid_manifest(
            directory, pair=pair.name, role="tokenizer", dtype=None, source_sha256=pair.large.gguf_sha256
        )
        is not None
    )


def dir_size(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


# ------------------------------------------------------------------------------------------- installing


@contextlib.contextmanager
def pair_lock(home: Path, name: str) -> Iterator[None]:
    """Serialise fetches of one pair across processes (two `make` targets may fetch at the same time), on every OS:
    ``filelock`` takes flock on POSIX and msvcrt's lock on Windows. The OS drops the lock with a process that dies,
    so a crashed fetch never blocks the next one; a live one is waited for, however long its download takes."""
    home.mkdir(parents=True, exist_ok=True)
    with FileLock(home / f".lock-{name}"):
        yield


def fresh_tmp_dir(final: Path) -> Path:
    """An empty sibling of ``final`` (same filesystem, so the final rename is atomic)."""
    final.parent.mkdir(parents=True, exist_ok=True)
    # Leftovers of a crashed earlier build are never renamed into place; clear them.
    for stale in final.parent.glob(f".{final.name}.tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))


def install_dir(tmp: Path, final: Path) -> None:
    # mkdtemp makes 0700 dirs and transformers writes 0600 weights; a shared cache should honour the umask.
    umask = os.umask(0)
    os.umask(umask)
    tmp.chmod(0o777 & ~umask)
    for path in tmp.rglob("*"):
        path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)
    if final.exists():  # a partial or outdated build: it has no valid manifest, or we would not be here
        shutil.rmtree(final)
    os.replace(tmp, final)


def drop_ggufs(pair: PairSpec, home: Path) -> None:
    # Only after every conversion succeeded; another dtype later means downloading again.
    for spec in pair.models():
        gguf_file_path(spec, home).unlink(missing_ok=True)
