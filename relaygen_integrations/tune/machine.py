"""Which machine a cost table belongs to: what decides a pass's cost, and nothing else.

Pass costs differ 2-4x between CPU classes of the same core count (AVX2 only, AVX-512 with AVX512-BF16, AMX), with
ISA caps in the environment (``ATEN_CPU_CAPABILITY=avx2`` ... make an AMX Xeon run AVX2 code), between torch versions
(kernels change) and with the thread count. So a measured table is cached under a key of exactly those, and a
session that lands on another CPU measures again instead of trusting another machine's numbers.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass

import torch

from ..engine.local.cpu import cpu_model_and_flags, isa_limits
from ..engine.local.wide_passes import machine_wide_rows


@dataclass(frozen=True)
class MachineIdentity:
    device: str  # "cpu" or "cuda"
    processor: str  # the CPU's model name, or the GPU's
    flags: tuple[str, ...]  # the CPU flags that decide kernels (``cpu.RELEVANT_FLAGS``); empty on a GPU
    isa_limits: tuple[tuple[str, str], ...]  # ISA caps set in the environment (``cpu.isa_limits``)
    torch: str
    threads: int
    # Our own kernel choices that change pass costs on this machine (``wide_passes``: bf16 passes of at least N rows
    # run in fp32 on a CPU without bf16 instructions), so a table measured before a change is measured again.
    kernels: str = ""

    def key(self) -> str:
        """A short stable name for this machine: the cache file's name."""
        blob = json.dumps(asdict(self), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def describe(self) -> str:
        caps = " ".join(f"{k}={v}" for k, v in self.isa_limits) or "none"
        if self.device == "cuda":
            return f"{self.processor} (CUDA), torch {self.torch}"
        return (
            f"{self.processor}, flags {' '.join(self.flags) or '-'}, ISA caps {caps}, {self.threads} threads, "
            f"torch {self.torch}" + (f"; {self.kernels}" if self.kernels else "")
        )

    def to_json(self) -> dict[str, object]:
        data = asdict(self)
        data["isa_limits"] = dict(self.isa_limits)
        data["key"] = self.key()
        return data


def this_machine(device: torch.device | str = "cpu") -> MachineIdentity:
    """The identity of the machine this process runs on, for ``device``."""
    device = torch.device(device)
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        return MachineIdentity("cuda", name, (), (), torch.__version__, torch.get_num_threads())
    model, flags = cpu_model_and_flags()
    limits = tuple(sorted(isa_limits().items()))
    rows = machine_wide_rows()
    kernels = "" if rows is None else f"bf16 linears from {rows} rows in fp32"
    return MachineIdentity("cpu", model, flags, limits, torch.__version__, torch.get_num_threads(), kernels)
