"""What the CPU under this process can do, for benchmarks' machine lines and for choosing a fast path.

Multi-position passes (catch-up, verification, speculation) cost very different amounts on CPUs with and without
native bf16 instructions, so every benchmark records these flags and compares only within one run."""

from __future__ import annotations

import functools
import platform

# The instruction-set extensions that decide which matmul kernels torch (oneDNN / MKL / fbgemm) can use.
RELEVANT_FLAGS = (
    "avx2", "fma", "avx_vnni", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx512_fp16",
    "amx_tile", "amx_bf16", "amx_int8",
)  # fmt: skip


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


def has_native_bf16() -> bool:
    """Whether bf16 matmuls run on bf16 instructions (AVX512-BF16 or AMX) rather than by conversion to fp32."""
    return bool({"avx512_bf16", "amx_bf16"} & set(cpu_model_and_flags()[1]))
