#!/usr/bin/env python
"""A cluster in a box: N "nodes" on this machine, each a network namespace with a link of its own to a switch,
shaped to the rate you dial, and one rank of a script on each node.

    sudo .venv/bin/python scripts/cluster/box.py --nodes 2 --link 400mbit -- scripts/by_hand/race.py --out r.json
    ... --link none                       # the links unshaped: as fast as the kernel moves bytes between namespaces
    ... --check                           # can this machine build a box? exit 0, or 1 and the reason in one line

The box:
- a switch: a namespace holding a bridge, br0;
- node i (i = 0..N-1): a namespace with `lo` and `eth0` (address 10.88.0.<i+1>), joined to the switch by a veth pair:
  its own cable, as each machine of a cluster has its own NIC;
- each cable shaped in BOTH directions by a token-bucket filter (`tc qdisc ... tbf rate RATE`): on the node's eth0
  (what the node sends) and on the switch's end (what it receives). While bytes wait in the filter the CPU is free to
  compute, as it is behind a real NIC. This kernel has no netem: bandwidth is the dial, latency is what it is;
- node i runs rank i of the script (RANK=i, WORLD_SIZE=N, MASTER_ADDR=10.88.0.1, GLOO_SOCKET_IFNAME=eth0), through
  distrinews_course.harden, as the course's launcher runs every rank.
A rank may dial every link to another rate between two measurements: distrinews_course.link.dial("200mbit") asks
the box (a request file in $DISTRINEWS_LINK_CONTROL), which applies it with `tc qdisc change` and answers.

Everything the box makes is removed when it ends: on success, on a rank's failure, on Ctrl-C and on SIGTERM (the
course's launcher stops a command that way). A box left behind by a SIGKILL is removed by the next box.
Needs Linux, iproute2 (`ip`, `tc`), util-linux (`nsenter`) and root; without root it tries an unprivileged user
namespace (`unshare -rnm`), where the kernel allows one. Where neither works, it says why in one line (exit 3), and
the chapters show their unshaped runs instead.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))

from distrinews_course.link import bits_per_s as parse_rate  # noqa: E402  (one rule for what a rate is)
from distrinews_lib.errors import UserError  # noqa: E402

SUBNET = "10.88.0"
PREFIX = "box"  # namespaces are named box<pid>-sw, box<pid>-n0, ...: the next box can tell a leftover
NOT_POSSIBLE = 3  # exit code: no box can be built on this machine (the reason is printed)
USERNS_ENV = "DISTRINEWS_BOX_USERNS"  # set when this process is the copy re-run inside `unshare -rnm`


class BoxError(UserError):
    """A box cannot be built or run here; the message says why and what to do."""


def say(msg: str) -> None:
    print(f"[box] {msg}", flush=True)


def tbf_args(bits: float) -> list[str]:
    """tc's tbf at `bits` per second. The burst holds at least 256 KiB: the kernel hands veth 64 KiB segments
    (TSO), and a filter whose bucket is smaller than a segment never sends it (measured: 32 KiB cut 400mbit to
    35 MB/s). The queue holds 100 ms of traffic; TCP's window adapts to it."""
    burst = max(256 * 1024, int(bits / 8 * 0.002))
    return ["rate", f"{int(bits)}bit", "burst", str(burst), "latency", "100ms"]


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


def rank_env(box: Box, rank: int, port: int, control: Path) -> dict:
    env = dict(os.environ)
    env.update(
        RANK=str(rank),
        LOCAL_RANK="0",
        WORLD_SIZE=str(box.n),
        LOCAL_WORLD_SIZE="1",
        GROUP_RANK=str(rank),
        MASTER_ADDR=box.addr(0),
        MASTER_PORT=str(port),
        GLOO_SOCKET_IFNAME="eth0",
        TORCH_GLOO_LAZY_INIT=env.get("TORCH_GLOO_LAZY_INIT", "1"),
        PYTHONUNBUFFERED="1",
        DISTRINEWS_LINK_CONTROL=str(control),
        DISTRINEWS_BOX_NODES=str(box.n),
        DISTRINEWS_BOX_LINK="none" if box.bits is None else f"{int(box.bits)}bit",
    )
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def run_ranks(box: Box, script: list[str], control: Path) -> int:
    """Rank i of the script on node i; the first rank to fail stops the others (as torchrun does)."""
    port = 29400 + os.getpid() % 500
    # Each node gets its own host name (node<i>) and an /etc/hosts naming every node, and a resolv.conf that answers
    # at once: no DNS server is reachable from a node, and a lookup that waits for one costs seconds.
    hosts, resolv = control / "hosts", control / "resolv.conf"
    hosts.write_text("127.0.0.1 localhost\n" + "".join(f"{box.addr(i)} node{i}\n" for i in range(box.n)))
    resolv.write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
    setup = (
        'mount --bind "$0" /etc/hosts && mount --bind "$1" /etc/resolv.conf && hostname "$2" && shift 2 && exec "$@"'
    )
    procs = []
    for i in range(box.n):
        cmd = [
            "nsenter",
            f"--net=/run/netns/{box.ns(i)}",
            "unshare",
            "--mount",
            "--uts",
            "sh",
            "-c",
            setup,
            str(hosts),
            str(resolv),
            f"node{i}",
            sys.executable,
            "-u",
            "-m",
            "distrinews_course.harden",
            *script,
        ]
        procs.append(subprocess.Popen(cmd, env=rank_env(box, i, port, control), cwd=os.getcwd()))
    while True:
        codes = [p.poll() for p in procs]  # every rank, every time: the first failure stops the others at once
        failed = next((i for i, c in enumerate(codes) if c not in (None, 0)), None)
        if failed is not None or all(c == 0 for c in codes):
            break
        time.sleep(0.05)
    if failed is None:
        return 0
    code = procs[failed].returncode
    say(f"rank {failed} (node {failed}) exited with code {code}; stopping the other ranks")
    _stop(procs)
    return code if code > 0 else 128 - code


def _stop(procs) -> None:
    for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
        live = [p for p in procs if p.poll() is None]
        for p in live:
            p.send_signal(sig)
        for p in live:
            try:
                p.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                pass


def _terminate(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def reexec_in_userns(argv: list[str]) -> int:
    """Not root: run this same command inside a new user + network + mount namespace, where we may create network
    namespaces (a tmpfs over /run/netns gives `ip netns` a place for them)."""
    inner = 'mount -t tmpfs tmpfs /run 2>/dev/null || true; mkdir -p /run/netns; exec "$@"'
    env = dict(os.environ, **{USERNS_ENV: "1"})
    return subprocess.call(
        [
            "unshare",
            "-rnm",
            "--propagation",
            "private",
            "sh",
            "-c",
            inner,
            "sh",
            sys.executable,
            os.path.abspath(__file__),
            *argv,
        ],
        env=env,
    )


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--nodes", type=int, default=2, help="nodes (one rank each), 2 or more")
    p.add_argument("--link", default="none", help="each node's link rate, both directions: 400mbit, 1gbit, ... or none")
    p.add_argument("--check", action="store_true", help="only say whether a box can be built here (exit 0 or 3)")
    p.add_argument("script", nargs=argparse.REMAINDER, help="-- then the script and its arguments")
    args = p.parse_args(argv)
    script = args.script[1:] if args.script[:1] == ["--"] else args.script
    try:
        bits = parse_rate(args.link)
        if args.nodes < 2 or args.nodes > 16:
            raise BoxError(f"--nodes {args.nodes}: a box holds 2 to 16 nodes")
        ok, how = usable()
        if not ok:
            say(f"no box on this machine: {how}")
            return NOT_POSSIBLE
        if args.check:
            say(f"a box can be built here ({how})")
            return 0
        if not script:
            raise BoxError("no script to run: put it after --, e.g. -- scripts/by_hand/race.py --out race.json")
        if os.geteuid() != 0 and not os.environ.get(USERNS_ENV):
            return reexec_in_userns(argv)
    except UserError as err:  # a BoxError, or a rate that is not one
        say(f"error: {err}")
        return 2
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):  # SIGINT too: a background job may inherit it ignored
        signal.signal(sig, _terminate)
    left = remove_leftovers()
    if left:
        say(f"removed a box left behind by a killed run: {', '.join(left)}")
    t0 = time.time()
    try:
        with Box(args.nodes, bits) as box, tempfile.TemporaryDirectory(prefix="box_link_") as control:
            dialer = Dialer(box, Path(control))
            dialer.start()
            say(f"{args.nodes} nodes, each link {args.link} both ways ({box.ns('sw')} switch); rank 0 at {box.addr(0)}")
            code = run_ranks(box, script, Path(control))
            dialer.stop.set()
    except KeyboardInterrupt as why:
        say(f"stopped ({why or 'Ctrl-C'}); the box is removed")
        return 130
    except UserError as err:  # a BoxError, or a rate that is not one
        say(f"error: {err}")
        return 2
    say(f"done in {time.time() - t0:.1f} s, exit code {code}; the box is removed")
    return code


if __name__ == "__main__":
    sys.exit(main())
