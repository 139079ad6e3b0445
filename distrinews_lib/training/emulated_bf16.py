"""What --amp bf16 costs on a CPU that emulates it: torch converts to fp32 and back where the CPU has no bf16 in
hardware, and such a run says so in one warning line, with the slowdown measured on this machine. Only a run that asks
for bf16 on a CPU imports it.
"""

from __future__ import annotations

import time

import torch

from .. import machine


def bf16_linear_slowdown(n: int = 256, reps: int = 8) -> float:
    """A short probe (~0.05 s): how many times longer a Linear layer's forward takes under bf16 autocast than in fp32
    on this CPU (what a training step does most)."""
    layer, x = torch.nn.Linear(n, n), torch.randn(2 * n, n)

    def seconds(dtype):
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype is torch.bfloat16):
            layer(x)  # the first call pays for set-ups
            t = time.perf_counter()
            for _ in range(reps):
                layer(x)
            return time.perf_counter() - t

    return seconds(torch.bfloat16) / seconds(torch.float32)


def emulated_bf16_warning(flags: set[str] | None = None) -> str | None:
    """None where this CPU has bf16 in hardware (or cannot tell); else one line: emulated, and how much slower."""
    if machine.cpu_native_bf16(flags) is not False:
        return None
    return (
        f"warning: --amp bf16 on {machine.cpu_name()}, which has no bf16 in hardware (none of "
        f"{', '.join(machine.BF16_CPU_FLAGS)} in its flags): torch emulates it; a Linear layer under bf16 "
        f"autocast just ran {bf16_linear_slowdown():.1f}x slower than in fp32 here, "
        "and a whole epoch of the tiny model "
        "4.7x slower on such an AMD EPYC. The run goes on; --amp off is faster on this machine."
    )
