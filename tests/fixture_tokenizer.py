"""The demo pair's tokenizer as a small committed fixture, for tests that must not need the real models.

``tests/fixtures/qwen2_tokenizer/`` holds ``tokenizer.json.xz`` (the 11 MB ``tokenizer.json`` compresses to
~1.4 MB) and ``tokenizer_config.json`` (special tokens and the chat template inline). Regenerate them with
``scripts/make_tokenizer_fixture.py``.
"""

from __future__ import annotations

import functools
import hashlib
import lzma
import os
import shutil
import tempfile
from pathlib import Path

FIXTURE_DIR = Path(__file__).parent / "fixtures" / "qwen2_tokenizer"
COMPRESSED = "tokenizer.json.xz"
PLAIN_FILES = ("tokenizer_config.json",)


def _fixture_key() -> str:
    digest = hashlib.sha256()
    for name in (COMPRESSED, *PLAIN_FILES):
        digest.update(name.encode())
        digest.update((FIXTURE_DIR / name).read_bytes())
    return digest.hexdigest()[:16]


def _cache_root() -> Path:
    # Deliberately not under $RELAYGEN_HOME: registry tests point that at per-test temp dirs that pytest
    # deletes, while this directory outlives any one test. Keyed by the fixture's hash, so a regenerated
    # fixture never reuses a stale copy; per user, so a shared /tmp does not mix owners.
    override = os.environ.get("RELAYGEN_TEST_FIXTURES")
    if override:
        return Path(override)
    uid = os.getuid() if hasattr(os, "getuid") else "user"
    return Path(tempfile.gettempdir()) / f"relaygen-test-fixtures-{uid}"


@functools.lru_cache(maxsize=1)
def fixture_tokenizer_dir() -> Path:
    """A directory ``AutoTokenizer.from_pretrained(dir)`` loads offline (decompressed once, then reused)."""
    target = _cache_root() / f"qwen2_tokenizer-{_fixture_key()}"
    if target.is_dir():  # only ever created by the atomic rename below, so it is complete
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        with lzma.open(FIXTURE_DIR / COMPRESSED) as src, (tmp / "tokenizer.json").open("wb") as dst:
            shutil.copyfileobj(src, dst, 8 * 1024 * 1024)
        for name in PLAIN_FILES:
            shutil.copy2(FIXTURE_DIR / name, tmp / name)
        try:
            os.replace(tmp, target)
        except OSError:
            if not target.is_dir():  # a parallel test worker won the race: use its copy, otherwise re-raise
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
