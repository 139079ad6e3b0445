"""The first cell's checks: what this machine offers for DDP, and the fixes that make it work the first time
on Kaggle's "GPU T4 x2" and on Colab.

    from distrinews_course import gpu_env
    report = gpu_env.first_cell()      # course.setup() calls it: prints the report, applies the fixes

It reports
- the GPUs (count, names, compute capability, native bf16 or fp16 + GradScaler), and the torch, CUDA,
  NCCL and transformers versions;
- free /dev/shm (small in containers, and Kaggle users cannot raise it);
- whether every pair of GPUs can access each other peer-to-peer (P2P).
and then
- sets NCCL_P2P_DISABLE=1 where P2P is missing between two GPUs (NCCL then uses shared memory from the
  start; P2P on such 2-GPU boxes has hung - the cost is "just reduced performance", per NCCL's maintainer),
  or where a P2P copy that the driver advertises fails or hangs; a value the user set is left alone;
- sets NCCL_SHM_DISABLE=1 when P2P is off and /dev/shm is too small for NCCL's shared-memory transport;
- stops ranks left over from an interrupted launch (course/leftovers.py), which hold GPU memory
  and a rendezvous port. Every launch of course.launch uses torchrun --standalone, which picks
  a free port: EADDRINUSE on 29500 only hits a hand-typed torchrun, and the report says if 29500 is busy.

inspect() only looks (no side effects); apply() changes os.environ and says why, line by line.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass, field

import torch

from distrinews_lib.machine import versions

from . import leftovers

SHM = "/dev/shm"
SMALL_SHM = 1 << 30  # below 1 GiB free: say so (DataLoader workers would need it; the course uses none)
NCCL_SHM_MIN = 128 << 20  # NCCL's shared-memory transport needs a few MB per channel and peer; below this, off
_P2P_COPY_CHECK = """
import sys, torch
a = torch.arange(1 << 20, dtype=torch.float32, device="cuda:%d")
b = a.to("cuda:%d")
torch.cuda.synchronize("cuda:%d"); torch.cuda.synchronize("cuda:%d")
sys.exit(0 if torch.equal(a.cpu(), b.cpu()) else 1)
"""


@dataclass
class GpuInfo:
    index: int
    name: str
    capability: tuple
    memory_gib: float | None = None

    @property
    def native_bf16(self) -> bool:
        return tuple(self.capability) >= (8, 0)

    def describe(self) -> str:
        cap = f"{self.capability[0]}.{self.capability[1]}"
        amp = "native bf16" if self.native_bf16 else "no native bf16: fp16 + GradScaler"
        mem = f", {self.memory_gib:.0f} GiB" if self.memory_gib else ""
        return f"{self.name} (compute {cap}{mem}; {amp})"


@dataclass
class EnvReport:
    gpus: list = field(default_factory=list)  # GpuInfo per visible GPU
    versions: dict = field(default_factory=dict)  # torch, cuda, nccl, transformers
    shm_free_bytes: int | None = None
    shm_total_bytes: int | None = None
    p2p: dict = field(default_factory=dict)  # "0-1" -> True/False (driver's answer)
    p2p_copy: dict = field(default_factory=dict)  # "0-1" -> "ok" / "failed" / "hung" (only where P2P is advertised)
    port_29500_busy: bool | None = None
    on_kaggle: bool = False
    on_colab: bool = False
    actions: list = field(default_factory=list)  # what apply() changed, each with its reason
    notes: list = field(default_factory=list)
    leftovers: list = field(default_factory=list)  # PIDs stopped

    @property
    def n_gpus(self) -> int:
        return len(self.gpus)

    @property
    def p2p_missing(self) -> list:
        return [pair for pair, ok in self.p2p.items() if not ok]

    @property
    def p2p_broken(self) -> list:
        return [pair for pair, state in self.p2p_copy.items() if state != "ok"]

    def lines(self) -> list:
        v = self.versions
        out = [
            f"versions     : torch {v.get('torch')} | CUDA {v.get('cuda') or '-'} | NCCL {v.get('nccl') or '-'} | "
            f"transformers {v.get('transformers')}"
        ]
        if not self.gpus:
            out.append("GPUs         : none visible (CPU only: DDP runs on CPU processes over gloo)")
        for g in self.gpus:
            out.append(f"GPU {g.index:<9}: {g.describe()}")
        if self.n_gpus >= 2:
            pairs = ", ".join(
                f"{pair.replace('-', '<->')} {'yes' if ok else 'NO'}"
                + (f" (copy {self.p2p_copy[pair]})" if pair in self.p2p_copy else "")
                for pair, ok in self.p2p.items()
            )
            out.append(f"peer-to-peer : {pairs}")
        if self.shm_free_bytes is not None:
            out.append(
                f"/dev/shm     : {self.shm_free_bytes / 2**20:,.0f} MiB free of {self.shm_total_bytes / 2**20:,.0f} MiB"
            )
        if self.port_29500_busy:
            out.append(
                "port 29500   : in use (launch.torchrun uses --standalone with a free port; a hand-typed torchrun "
                "needs --standalone or another --master_port)"
            )
        out.append(
            "leftovers    : "
            + (
                f"stopped {len(self.leftovers)} process(es) of an interrupted launch "
                f"(PIDs {', '.join(map(str, self.leftovers))})"
                if self.leftovers
                else "none"
            )
        )
        out += [f"set          : {a}" for a in self.actions]
        out += [f"note         : {n}" for n in self.notes]
        return out


# --------------------------------------------------------------------------- looking


def gpus() -> list:
    if not torch.cuda.is_available():
        return []
    out = []
    for i in range(torch.cuda.device_count()):
        try:
            mem = torch.cuda.get_device_properties(i).total_memory / 2**30
        except Exception:
            mem = None
        out.append(GpuInfo(i, torch.cuda.get_device_name(i), tuple(torch.cuda.get_device_capability(i)), mem))
    return out


def peer_access(n: int) -> dict:
    """'i-j' -> whether the driver says GPU i can access GPU j's memory directly (and back)."""
    return {
        f"{i}-{j}": bool(torch.cuda.can_device_access_peer(i, j) and torch.cuda.can_device_access_peer(j, i))
        for i in range(n)
        for j in range(i + 1, n)
    }


def p2p_copy_check(i: int, j: int, timeout_s: float = 30.0, runner=subprocess.run) -> str:
    """Copy 4 MB from GPU i to GPU j in a separate process: 'ok', 'failed' or 'hung' (a broken P2P path
    hangs rather than errs, so it must not run in the notebook's own process)."""
    try:
        proc = runner([sys.executable, "-c", _P2P_COPY_CHECK % (i, j, i, j)], capture_output=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return "hung"
    return "ok" if proc.returncode == 0 else "failed"


def shm_space(path: str = SHM) -> tuple:
    try:
        usage = shutil.disk_usage(path)
    except OSError:
        return None, None
    return usage.free, usage.total


def port_busy(port: int = 29500) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def inspect(check_copy: bool = True) -> EnvReport:
    """Look at this machine; change nothing (the P2P copy check runs in a child process)."""
    report = EnvReport(
        gpus=gpus(),
        versions=versions(),
        port_29500_busy=port_busy(),
        on_kaggle=os.path.isdir("/kaggle") or "KAGGLE_KERNEL_RUN_TYPE" in os.environ,
        on_colab="COLAB_RELEASE_TAG" in os.environ,
    )
    report.shm_free_bytes, report.shm_total_bytes = shm_space()
    if report.n_gpus >= 2:
        report.p2p = peer_access(report.n_gpus)
        if check_copy:
            report.p2p_copy = {
                pair: p2p_copy_check(*map(int, pair.split("-"))) for pair, ok in report.p2p.items() if ok
            }
    return report


# --------------------------------------------------------------------------- fixing


def apply(report: EnvReport, environ=None) -> list:
    """Set what this machine needs for NCCL, each with its reason (appended to report.actions and returned).
    Variables the user set already are left as they are (and the report says so)."""
    environ = os.environ if environ is None else environ
    actions = []

    def set_var(name: str, value: str, why: str):
        if name in environ:
            report.notes.append(
                f"{name}={environ[name]} was set already and is kept (this machine would get {name}={value}: {why})"
            )
            return
        environ[name] = value
        actions.append(f"{name}={value}: {why}")

    p2p_off = False
    if report.p2p_missing:
        pairs = ", ".join(p.replace("-", " and ") for p in report.p2p_missing)
        set_var(
            "NCCL_P2P_DISABLE",
            "1",
            f"GPUs {pairs} cannot access each other peer-to-peer; NCCL uses shared memory "
            "from the start instead of probing P2P (which has hung on such 2-GPU boxes). "
            "Cost: somewhat slower all-reduces, nothing else",
        )
        p2p_off = True
    elif report.p2p_broken:
        pairs = ", ".join(f"{p.replace('-', ' and ')} ({report.p2p_copy[p]})" for p in report.p2p_broken)
        set_var(
            "NCCL_P2P_DISABLE",
            "1",
            f"the driver advertises P2P, but a peer copy between GPUs {pairs}; NCCL over "
            "P2P would hang the same way. Cost: somewhat slower all-reduces",
        )
        p2p_off = True
    p2p_off = p2p_off or environ.get("NCCL_P2P_DISABLE") == "1"
    small_shm = report.shm_free_bytes is not None and report.shm_free_bytes < NCCL_SHM_MIN
    if report.n_gpus >= 2 and p2p_off and small_shm:
        set_var(
            "NCCL_SHM_DISABLE",
            "1",
            f"P2P is off and /dev/shm has only {report.shm_free_bytes / 2**20:.0f} MiB free, "
            "too little for NCCL's shared-memory transport; NCCL goes through sockets instead",
        )
    if report.shm_free_bytes is not None and report.shm_free_bytes < SMALL_SHM:
        report.notes.append(
            f"/dev/shm is small ({report.shm_free_bytes / 2**20:.0f} MiB free): keep DataLoader "
            "num_workers=0 (the course's default), worker processes pass batches through it"
        )
    for g in report.gpus:
        if not g.native_bf16:
            report.notes.append(
                f"GPU {g.index} ({g.name}) has no bf16 in hardware: --amp auto uses fp16 + GradScaler, "
                "and --amp bf16 is refused"
            )
            break
    report.actions += actions
    return actions


def first_cell(quiet: bool = False, check_copy: bool = True, stop_leftovers: bool = True, log=print) -> EnvReport:
    """What the course's first cell runs (through course.notebook.setup): look, stop survivors, fix, print."""
    report = inspect(check_copy=check_copy)
    if stop_leftovers:
        report.leftovers = [p.pid for p in leftovers.stop_leftovers(log=None)]
        leftovers.mark_this_process_as_launcher()  # what this kernel launches from now on can be found if it dies
    apply(report)
    if not quiet:
        for line in report.lines():
            log(line)
    return report
