"""The cluster in a box (scripts/cluster/box.py) from both sides: a notebook launches a script across N "nodes" whose
links it dials, and a rank inside the box dials every link to another rate between two measurements.

    ok, why = link.usable()                              # can this machine build a box? (root, or a user namespace)
    res = link.run_in_box("scripts/by_hand/race.py", [...], nodes=2, rate="400mbit", timeout=600)
    res = link.run_in_box(script, [...], nodes=2, ranks_per_node=2, rate="300mbit")   # two levels: 2 nodes x 2 ranks
    link.dial("200mbit")                                 # inside a box, on one rank: every link, both directions
    link.link_bytes()                                    # inside a box: bytes this node's link has sent and received
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

from distrinews_lib.errors import UserError

from . import ROOT

RATE = re.compile(r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit)$")
UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
BOX = ROOT / "scripts" / "cluster" / "box.py"
# TCP over Ethernet carries 1448 bytes of payload in a 1514-byte frame (MTU 1500, TCP timestamps on): what a
# program can push through a link of rate R is at most this share of R.
PAYLOAD_SHARE = 1448 / 1514


def burst_bytes(bits: float) -> int:
    """The token bucket of a link of `bits` per second: at least 256 KiB, since the kernel hands veth 64 KiB segments
    (TSO) and a bucket smaller than a segment never sends it (measured: 32 KiB cut 400mbit to 35 MB/s); 2 ms of
    traffic on fast links. A message of about this size passes at the machine's speed once the bucket has refilled:
    only messages several times larger show the link's rate."""
    return max(256 * 1024, int(bits / 8 * 0.002))


def rate_bound(rows: list, bits: float) -> list:
    """The collective timings (rows with "bytes") whose time a link of `bits` sets: messages at least 4x its bucket.
    A smaller one rides the bucket at the machine's speed, and on a busy machine that speed is the CPU's: fitting it
    moved the rate read back from 400mbit to 440 Mbit/s of payload, above what the link can carry."""
    return [r for r in rows if r["bytes"] >= 4 * burst_bytes(bits)]


def usable() -> tuple[bool, str]:
    """(True, how) if a box can be built here, else (False, the reason in one line)."""
    try:
        p = subprocess.run([sys.executable, str(BOX), "--check"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as err:
        return False, f"scripts/cluster/box.py --check did not answer: {err}"
    line = (p.stdout.strip().splitlines() or ["no answer"])[-1].removeprefix("[box] ")
    return p.returncode == 0, line


def run_in_box(
    script,
    args=(),
    *,
    nodes: int = 2,
    ranks_per_node: int = 1,
    rate: str = "none",
    timeout: float = 600,
    echo: bool = False,
    check: bool = True,
    cwd=None,
):
    """Launch `script args` with `ranks_per_node` ranks on each of `nodes` namespaces, every link shaped to `rate`;
    returns the launch's LaunchResult (raises LaunchError on a failure, with the ranks' last lines)."""
    from .launch import run

    cmd = [sys.executable, BOX, "--nodes", str(nodes), "--ranks-per-node", str(ranks_per_node), "--link", rate, "--"]
    per = f" x {ranks_per_node} ranks" if ranks_per_node > 1 else ""
    return run(
        [*cmd, str(script), *map(str, args)],
        timeout=timeout,
        echo=echo,
        check=check,
        cwd=cwd,
        what=f"{Path(str(script)).name} on a box of {nodes} nodes{per}, links {rate}",
    )


def bits_per_s(rate: str) -> float | None:
    """'400mbit' -> 4e8 bits/s, tc's units; 'none' -> None (unshaped). Anything else: UserError naming the forms
    accepted. The box reads --link and every dial() with it, and the chapters their rates: one rule for a rate."""
    t = str(rate).strip().lower()
    if t in ("none", "off", "unshaped"):
        return None
    m = RATE.match(t)
    if not m or float(m[1]) <= 0:
        raise UserError(
            f"--link {rate!r} is not a rate: write a number and a unit, e.g. 50mbit, 400mbit, 1gbit, "
            "2.5gbit (tc's units: bit, kbit, mbit, gbit; bits per second), or none for an unshaped link"
        )
    bits = float(m[1]) * UNITS[m[2]]
    if not 1e5 <= bits <= 1e11:
        raise UserError(f"--link {rate}: keep the rate between 100kbit and 100gbit (got {bits:.3g} bit/s)")
    return bits


# ------------------------------------------------------------------------------------------------ inside the box


def in_box() -> bool:
    return bool(os.environ.get("DISTRINEWS_LINK_CONTROL"))


def current_rate() -> str | None:
    """The rate the box started the links at ('none' when unshaped), or None outside a box."""
    return os.environ.get("DISTRINEWS_BOX_LINK") if in_box() else None


def dial(rate: str, timeout: float = 20) -> None:
    """Set every link of this box to `rate` (e.g. '200mbit', or 'none'), both directions, and wait until it holds.
    Call it from ONE rank, between collectives (the others wait at a barrier)."""
    folder = os.environ.get("DISTRINEWS_LINK_CONTROL")
    if not folder:
        raise RuntimeError("link.dial() works inside scripts/cluster/box.py only (no DISTRINEWS_LINK_CONTROL here)")
    ident = uuid.uuid4().hex
    tmp = Path(folder) / f".request.{ident}"
    tmp.write_text(rate)
    tmp.rename(Path(folder) / f"request.{ident}")
    done = Path(folder) / f"done.{ident}"
    deadline = time.monotonic() + timeout
    while not done.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"the box did not apply the link rate {rate} within {timeout:.0f} s")
        time.sleep(0.01)
    answer = done.read_text()
    done.unlink(missing_ok=True)
    if not answer.startswith("ok"):
        raise RuntimeError(f"the box refused the link rate {rate}: {answer.removeprefix('error ')}")


def link_bytes(dev: str = "eth0") -> dict:
    """{"tx": bytes, "rx": bytes} this node's link has sent and received so far: the kernel's counters of its end of the
    cable (/sys/class/net/eth0/statistics, in the node's own sysfs, which the box mounts). Every byte counted: the
    payload, its TCP/IP/Ethernet headers, the acknowledgements, and every rank of the node together."""
    import socket

    base = Path("/sys/class/net") / dev
    try:
        mine = socket.if_nametoindex(dev)  # asked of this process's network namespace: the node's
        theirs = int((base / "ifindex").read_text())
    except OSError as err:
        raise RuntimeError(f"no link {dev} here ({err}): link_bytes() counts a node's link inside the box") from None
    if mine != theirs:  # /sys is this machine's, not the node's: its eth0 would be another device
        raise RuntimeError(f"/sys/class/net/{dev} is not this node's (ifindex {theirs}, the node's is {mine})")
    return {k: int((base / "statistics" / f"{k}_bytes").read_text()) for k in ("tx", "rx")}
