"""What a box (scripts/cluster/box.py) is made of: the namespaces of a switch and of N nodes, a cable per node shaped
by token-bucket filters in both directions, their removal whatever happens, the leftovers of a killed box, and the
thread that applies the rates the ranks dial. box.py puts the ranks on the nodes; this file builds the network.
Imported by box.py only, which puts the checkout on the path first."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

# one rule for what a rate is, and for its bucket (box.py puts ROOT on the path)
from distrinews_course.link import bits_per_s as parse_rate
from distrinews_course.link import burst_bytes
from distrinews_lib.errors import UserError

SUBNET = "10.88.0"
PREFIX = "box"  # namespaces are named box<pid>-sw, box<pid>-n0, ...: the next box can tell a leftover
NOT_POSSIBLE = 3  # exit code: no box can be built on this machine (the reason is printed)
USERNS_ENV = "DISTRINEWS_BOX_USERNS"  # set when this process is the copy re-run inside `unshare -rnm`


class BoxError(UserError):
    """A box cannot be built or run here; the message says why and what to do."""


def say(msg: str) -> None:
    print(f"[box] {msg}", flush=True)


def tbf_args(bits: float) -> list[str]:
    """tc's tbf at `bits` per second, with link.burst_bytes' bucket. The queue holds 100 ms of traffic; TCP's window
    adapts to it."""
    return ["rate", f"{int(bits)}bit", "burst", str(burst_bytes(bits)), "latency", "100ms"]


def _run(cmd: list[str], check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if check and p.returncode != 0:
        raise BoxError(f"`{' '.join(cmd)}` failed: {(p.stderr or p.stdout).strip()[:300]}")
    return p


def missing_tools() -> list[str]:
    return [t for t in ("ip", "tc", "nsenter", "unshare") if not shutil.which(t)]


def usable() -> tuple[bool, str]:
    """(True, how) when a box can be built here; else (False, why), in one line."""
    if not sys.platform.startswith("linux"):
        return False, "network namespaces are a Linux feature"
    gone = missing_tools()
    if gone:
        return False, (
            f"the command(s) {', '.join(gone)} are missing: install iproute2 (ip, tc) and util-linux (nsenter, unshare)"
        )
    if os.geteuid() == 0 or os.environ.get(USERNS_ENV):
        probe = f"{PREFIX}chk{os.getpid()}"
        p = _run(["ip", "netns", "add", probe], check=False)
        if p.returncode != 0:
            return False, f"`ip netns add` was refused ({p.stderr.strip()[:160]}): a container without CAP_SYS_ADMIN?"
        _run(["ip", "netns", "delete", probe], check=False)
        return True, "root" if os.geteuid() == 0 and not os.environ.get(
            USERNS_ENV
        ) else "an unprivileged user namespace"
    p = subprocess.run(["unshare", "-rnm", "true"], capture_output=True, text=True, timeout=30)
    if p.returncode != 0:
        return False, (
            "not root, and the kernel refuses unprivileged user namespaces (`unshare -rnm`: "
            f"{(p.stderr.strip() or 'refused')[:120]}): run as root, or use the unshaped runs"
        )
    return True, "an unprivileged user namespace (unshare -rnm)"


def netns_names() -> set[str]:
    out = _run(["ip", "netns", "list"], check=False).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def remove_leftovers() -> list[str]:
    """Boxes whose owner died (a SIGKILL) without removing them."""
    removed = []
    for name in sorted(netns_names()):
        m = re.match(rf"^{PREFIX}(\d+)-(sw|n\d+)$", name)
        if m and not _box_alive(int(m[1])):
            _kill_inside(name)
            _run(["ip", "netns", "delete", name], check=False)
            removed.append(name)
    return removed


def _box_alive(pid: int) -> bool:
    """Is `pid` a running box (not a zombie awaiting its parent, not a recycled pid of another program)?"""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, IndexError):
        return False
    return state != "Z" and b"box.py" in cmdline


def _kill_inside(ns: str) -> None:
    for pid in _run(["ip", "netns", "pids", ns], check=False).stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


class Box:
    """The namespaces, cables and filters of one box; `with Box(...)` removes them whatever happens."""

    def __init__(self, nodes: int, bits: float | None):
        self.n, self.bits, self.tag = nodes, bits, f"{PREFIX}{os.getpid()}"
        self.made: list[str] = []

    def ns(self, i) -> str:
        return f"{self.tag}-sw" if i == "sw" else f"{self.tag}-n{i}"

    def addr(self, i: int) -> str:
        return f"{SUBNET}.{i + 1}"

    def __enter__(self) -> "Box":
        try:
            self._up()
        except BaseException:
            self.down()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.down()

    def _add_ns(self, name: str) -> None:
        _run(["ip", "netns", "add", name])
        self.made.append(name)
        _run(["ip", "-n", name, "link", "set", "lo", "up"])

    def _up(self) -> None:
        sw = self.ns("sw")
        self._add_ns(sw)
        _run(["ip", "-n", sw, "link", "add", "br0", "type", "bridge"])
        _run(["ip", "-n", sw, "link", "set", "br0", "up"])
        for i in range(self.n):
            node, a, b = self.ns(i), f"{self.tag}e{i}", f"{self.tag}p{i}"
            self._add_ns(node)
            _run(["ip", "link", "add", a, "type", "veth", "peer", "name", b])
            _run(["ip", "link", "set", a, "netns", node])
            _run(["ip", "link", "set", b, "netns", sw])
            _run(["ip", "-n", node, "link", "set", a, "name", "eth0"])
            _run(["ip", "-n", sw, "link", "set", b, "master", "br0"])
            _run(["ip", "-n", node, "addr", "add", f"{self.addr(i)}/24", "dev", "eth0"])
            _run(["ip", "-n", node, "link", "set", "eth0", "up"])
            _run(["ip", "-n", sw, "link", "set", b, "up"])
        self.dial(self.bits, first=True)

    def qdiscs(self):
        """(namespace, device) of every filter: each node's eth0 (what it sends), the switch end (what it receives)."""
        for i in range(self.n):
            yield self.ns(i), "eth0"
            yield self.ns("sw"), f"{self.tag}p{i}"

    def dial(self, bits: float | None, first: bool = False) -> None:
        for ns, dev in self.qdiscs():
            if bits is None:
                if not first:
                    _run(["ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", dev, "root"], check=False)
            else:
                _run(["ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev, "root", "tbf", *tbf_args(bits)])
        self.bits = bits

    def down(self) -> None:
        for name in reversed(self.made):
            _kill_inside(name)
            _run(["ip", "netns", "delete", name], check=False)  # a namespace takes its veth ends with it
        self.made = []


class Dialer(threading.Thread):
    """Applies the rates the ranks ask for (distrinews_course.link.dial): request.<id> -> done.<id>."""

    def __init__(self, box: Box, folder: Path):
        super().__init__(daemon=True)
        self.box, self.folder, self.stop = box, folder, threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.02):
            for req in sorted(self.folder.glob("request.*")):
                ident = req.name.split(".", 1)[1]
                try:
                    text = req.read_text().strip()
                    self.box.dial(parse_rate(text))
                    answer = f"ok {text}"
                except (UserError, OSError) as err:
                    answer = f"error {err}"
                req.unlink(missing_ok=True)
                tmp = self.folder / f".done.{ident}"
                tmp.write_text(answer)
                tmp.rename(self.folder / f"done.{ident}")
