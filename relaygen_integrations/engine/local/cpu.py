"""What the CPU under this process can do, for benchmarks' machine lines and for choosing a fast path.

Multi-position passes (catch-up, verification, speculation) cost very different amounts on CPUs with and without
native bf16 instructions, so every benchmark records these flags and compares only within one run."""

from __future__ import annotations

import functools
import os
import platform

# The instruction-set extensions that decide which matmul kernels torch (oneDNN / MKL / fbgemm) can use.
RELEVANT_FLAGS = (
    "avx2", "fma", "avx_vnni", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx512_fp16",
    "amx_tile", "amx_bf16", "amx_int8",
)  # fmt: skip
# Flags no kernel reads where the flag they map to is present: the VEX-encoded VNNI (avx_vnni) is oneDNN's and
# fbgemm's AVX2 VNNI path only; with AVX-512 VNNI they take the AVX-512 one. Two EPYCs told apart by it alone
# (benchmarks/data/relay-vs-spec-60 and gguf-60) run the same kernels.
SHADOWED_FLAGS = {"avx_vnni": "avx512_vnni"}


def kernel_flags(flags: list[str] | tuple[str, ...]) -> list[str]:
    """``flags`` without those a present wider flag shadows (``SHADOWED_FLAGS``), sorted: equal for two CPUs whose
    matmul kernels are the same."""
    present = set(flags)
    return sorted(flag for flag in present if SHADOWED_FLAGS.get(flag) not in present)


@functools.cache
def cpu_model_and_flags() -> tuple[str, tuple[str, ...]]:
    """The CPU's model name and which of ``RELEVANT_FLAGS`` it has (from /proc/cpuinfo; empty where unreadable)."""
    model, flags = platform.processor() or platform.machine(), set[str]()
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    model = value.strip()
                elif key.strip() == "flags":
                    flags = set(value.split())
                    break
    except OSError:
        pass
    return model, tuple(flag for flag in RELEVANT_FLAGS if flag in flags)


# Environment variables that cap which instructions torch's kernel libraries use below what the CPU has: ATen's own
# kernels, oneDNN (bf16 matmuls), MKL and fbgemm (int8). Setting them on an AVX-512/AMX CPU is how a benchmark runs
# the AVX2 code paths of a CPU without those instructions (docs/benchmarks.md).
ISA_LIMIT_VARIABLES = (
    "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS",
    "FBGEMM_ENABLE_INSTRUCTIONS",
)  # fmt: skip
# oneDNN's ISA names from the first one with bf16 dot products on; a cap below it means bf16 matmuls are emulated.
_ONEDNN_BF16_ISAS = frozenset({
    "avx512_core_bf16", "avx10_1_512", "avx512_core_fp16", "avx10_1_512_amx", "avx512_core_amx",
    "avx10_1_512_amx_fp16", "avx512_core_amx_fp16", "all",
})  # fmt: skip
_MKL_NO_BF16 = frozenset({"sse4_2", "avx", "avx2", "avx2_e1", "avx512"})


def isa_limits() -> dict[str, str]:
    """The ISA caps set in this process's environment (``ISA_LIMIT_VARIABLES``), for a benchmark's machine line."""
    return {name: os.environ[name] for name in ISA_LIMIT_VARIABLES if os.environ.get(name)}


def has_native_bf16() -> bool:
    """Whether bf16 matmuls run on bf16 instructions (AVX512-BF16 or AMX) rather than by conversion to fp32: the
    CPU has them and no ISA cap in the environment (``isa_limits``) keeps torch's libraries off them."""
    if not {"avx512_bf16", "amx_bf16"} & set(cpu_model_and_flags()[1]):
        return False
    limits = {name: value.strip().lower() for name, value in isa_limits().items()}
    onednn = limits.get("ONEDNN_MAX_CPU_ISA") or limits.get("DNNL_MAX_CPU_ISA")
    if onednn is not None and onednn not in _ONEDNN_BF16_ISAS:
        return False
    return limits.get("MKL_ENABLE_INSTRUCTIONS") not in _MKL_NO_BF16
