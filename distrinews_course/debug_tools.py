"""Which of chapter 12's tools work on this machine, and why one does not: py-spy's permission to read another
process (ptrace), the debug server's packages, and the rest (which need nothing but torch)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path


def _cap_sys_ptrace() -> bool | None:
    """Does this process hold CAP_SYS_PTRACE (bit 19 of its effective capabilities)? None where /proc cannot say."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> 19 & 1)
    except OSError:
        pass
    return None


def ptrace_scope() -> str:
    """Yama's ptrace_scope: 0 (any process of the same user), 1 (only descendants), 2 (admin only), 3 (none), or
    'no Yama' where the kernel has no such switch."""
    try:
        return Path("/proc/sys/kernel/yama/ptrace_scope").read_text().strip()
    except OSError:
        return "no Yama"


def support(pyspy_worked: bool | None, pyspy_why: str | None = None) -> list:
    """(tool, what it needs, here) rows; pyspy_worked: what `py-spy dump` did in this chapter's run (None: not
    tried)."""
    missing = [m for m in ("jinja2", "aiohttp", "tabulate") if importlib.util.find_spec(m) is None]
    root, cap, scope = os.geteuid() == 0 if hasattr(os, "geteuid") else False, _cap_sys_ptrace(), ptrace_scope()
    if pyspy_worked is None:
        spy = "not tried"
    elif pyspy_worked:
        spy = f"worked (root: {root}, CAP_SYS_PTRACE: {cap}, ptrace_scope: {scope})"
    else:
        spy = f"refused: {pyspy_why} (root: {root}, CAP_SYS_PTRACE: {cap}, ptrace_scope: {scope})"
    server = "ready" if not missing else f"missing {', '.join(missing)} (pip install -r requirements.txt)"
    return [
        ("Flight Recorder", "TORCH_FR_BUFFER_SIZE=N before init_process_group", "works (torch only)"),
        ("debug server", "start_debug_server(); Jinja2, aiohttp, tabulate", server),
        ("py-spy dump", "pip install py-spy; permission to ptrace the rank", spy),
        ("DETAIL", "TORCH_DISTRIBUTED_DEBUG=DETAIL", "works (torch only)"),
        ("monitored_barrier", "gloo; replaces a barrier in the code", "works (torch only)"),
        ("@record error file", "@record on main(); torchrun", "works (torch only)"),
        ("hang doctor", "--debug_hangs (or python -m distrinews_lib.hang_doctor)", "works (torch only)"),
    ]


def ptrace_note(pyspy_worked: bool, pyspy_why: str | None = None) -> str:
    """What this run could show of py-spy's permission: where it was allowed, not the refusal a container without
    SYS_PTRACE gives; where it was refused, that the other tools showed the stacks without it."""
    root = os.geteuid() == 0 if hasattr(os, "geteuid") else False
    if pyspy_worked:
        return (
            f"NOTE: this machine let py-spy trace the ranks (root: {root}, CAP_SYS_PTRACE: {_cap_sys_ptrace()}), so "
            f"this run could not show a refusal; where py-spy is refused, the debug server's /stacks and the hang "
            f"doctor show the same stacks without ptrace."
        )
    return (
        f"NOTE: py-spy was refused here ({pyspy_why}); the debug server's /stacks and the hang doctor showed the "
        f"stacks without ptrace (section 2)."
    )


def support_table(rows: list) -> str:
    width = [max(len(r[i]) for r in rows) for i in range(2)]
    head = f"{'tool':<{width[0]}}  {'needs':<{width[1]}}  on this machine"
    return "\n".join([head] + [f"{a:<{width[0]}}  {b:<{width[1]}}  {c}" for a, b, c in rows])
