#!/usr/bin/env python
"""Two nodes on one machine: a real two-node torchrun job over a real network interface.

    sudo .venv/bin/python scripts/multinode/two_nodes.py -- --config cpu_smoke --data embedded --epochs 2
    ... --max-restarts 1 --kill-node 1 --kill-at-step 7 --relaunch -- ARGS   # a node dies and a replacement joins
    ... --nnodes 1:2 --join-later -- ARGS                                    # starts on one node, a second one joins

What it does:
1. scripts/multinode/netns.sh up: two network namespaces, node0 (10.77.0.1) and node1 (10.77.0.2), joined by a
   veth pair named veth0 on both sides; torn down again in a `finally`, on Ctrl-C and on SIGTERM too;
2. in each namespace, with its own host name and its own working directory (WORKDIR/node0, WORKDIR/node1: the
   "node-local disks", which also hold each node's tokenizer cache), scripts/multinode/node.py starts one torchrun
   agent: --nnodes=2, c10d rendezvous at node0:29500, GLOO_SOCKET_IFNAME=veth0, --nproc ranks per node;
3. the training script writes to WORKDIR/shared/run (the "shared filesystem"), or with --local-output to a
   relative `run` folder, which lands on each node's own disk;
4. every line is shown prefixed with its node; WORKDIR/cluster.json records the events with their times.

Without root (or where namespaces are not allowed) it says so and runs both agents on loopback (127.0.0.1):
the same rendezvous and ranks, but no network between separate stacks.

The training arguments come after `--`; --output and --checkpoint are added here.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
NETNS = HERE / "netns.sh"
NODE = HERE / "node.py"
SUBNET = "10.77.0"
sys.path.insert(0, str(ROOT))


def say(msg: str) -> None:
    print(f"[cluster] {msg}", flush=True)


def namespaces_usable() -> tuple[bool, str]:
    """(usable, reason): root, `ip` and `unshare`, and the kernel lets us create a namespace."""
    if os.name != "posix" or not sys.platform.startswith("linux"):
        return False, "network namespaces are a Linux feature"
    if os.geteuid() != 0:
        return False, "creating network namespaces needs root (this runs as uid %d)" % os.geteuid()
    for tool in ("ip", "unshare"):
        if subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True).returncode != 0:
            return False, f"the `{tool}` command is missing (iproute2 / util-linux)"
    r = subprocess.run(["bash", str(NETNS), "check"], capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        return False, "the kernel refused `ip netns add` (a container without CAP_SYS_ADMIN?): " + (
            r.stderr.strip() or "no reason given"
        )
    return True, "root and `ip netns` work"


class Node:
    """One node's launcher process (node.py) and its output."""

    def __init__(self, cluster: "Cluster", index: int, launch: int):
        self.cluster, self.index, self.launch = cluster, index, launch
        self.proc: subprocess.Popen | None = None
        self.lines: list[tuple[float, str]] = []
        self.thread: threading.Thread | None = None

    @property
    def name(self) -> str:
        return f"node{self.index}"

    def start(self, extra: list[str]) -> None:
        c = self.cluster
        a = c.args
        cwd = c.workdir / self.name
        cwd.mkdir(parents=True, exist_ok=True)
        overrides = {
            0: {},
            1: {"master_addr": a.node1_master_addr, "master_port": a.node1_master_port, "nnodes": a.node1_nnodes},
        }[self.index]
        node_args = [
            sys.executable,
            str(NODE),
            "--nnodes",
            overrides.get("nnodes") or a.nnodes,
            "--node-rank",
            str(self.index),
            "--nproc",
            str(a.nproc),
            "--master-addr",
            overrides.get("master_addr") or c.master_addr,
            "--master-port",
            str(overrides.get("master_port") or c.port),
            "--rdzv-id",
            c.rdzv_id,
            "--ifname",
            c.ifname,
            "--max-restarts",
            str(a.max_restarts),
            "--join-timeout",
            str(a.join_timeout),
            "--connect-timeout",
            str(a.connect_timeout),
            *extra,
            str(ROOT / "scripts" / a.script),
            *c.train_args(),
        ]
        if c.netns:
            cmd = ["bash", str(NETNS), "exec", c.prefix, str(self.index), *node_args]
        else:
            cmd = node_args
        env = dict(os.environ, PYTHONUNBUFFERED="1", DISTRINEWS_CACHE=str(cwd / "cache"))
        env.setdefault("OMP_NUM_THREADS", "1")
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        self.proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        c.event(f"{self.name} started" + (f" (launch {self.launch})" if self.launch > 1 else ""), pid=self.proc.pid)
        self.thread = threading.Thread(target=self._pump, daemon=True)
        self.thread.start()

    def _pump(self) -> None:
        log = open(self.cluster.workdir / f"{self.name}.log", "a")
        for raw in self.proc.stdout:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            now = time.time()
            self.lines.append((now, line))
            log.write(line + "\n")
            log.flush()
            self.cluster.echo(f"{self.name} | {line}")
            for key, event in (
                ("pulling the plug", "killed"),
                ("resumed from", "resumed"),
                ("resume auto: no snapshot", "started fresh"),
                ("[identity]", "identity"),
                ("error: ", "error"),
                ("] stopped: ", "stopped"),
                ("[launcher", "launcher"),
            ):
                if key in line:
                    self.cluster.event(f"{self.name} {event}", line=line, t=now)
        log.close()

    def poll(self):
        return self.proc.poll() if self.proc else None

    def output(self) -> str:
        return "\n".join(line for _, line in self.lines)


class Cluster:
    def __init__(self, args):
        self.args = args
        self.workdir = Path(args.workdir).resolve()
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "shared").mkdir(exist_ok=True)
        self.prefix = f"dn{os.getpid() % 100000}"
        self.rdzv_id = f"distrinews-{os.getpid()}"
        self.events: list[dict] = []
        self.t0 = time.time()
        self.lock = threading.Lock()
        self.netns = False
        self.master_addr, self.port, self.ifname = "node0", 29500, "veth0"
        self.nodes: dict[int, Node] = {}
        self.finished: dict[int, int] = {}
        self.relaunches = 0
        self.bytes: dict = {}

    # ---------------------------------------------------------------- bookkeeping
    def echo(self, text: str) -> None:
        with self.lock:
            print(text, flush=True)

    def event(self, what: str, t: float | None = None, **info) -> None:
        t = t or time.time()
        with self.lock:
            self.events.append({"t": round(t - self.t0, 3), "event": what, **info})

    def train_args(self) -> list[str]:
        out = "run" if self.args.local_output else str(self.workdir / "shared" / "run")
        return [*self.args.train, "--output", out, "--checkpoint", f"{out}/model.pt"]

    # ---------------------------------------------------------------- network
    def network_up(self) -> None:
        usable, why = namespaces_usable()
        if self.args.loopback or not usable:
            reason = "--loopback was asked for" if self.args.loopback else why
            say(
                f"network namespaces not used: {reason}. FALLBACK: both agents on loopback (127.0.0.1, interface lo), "
                "each with its own working directory; the rendezvous and the ranks are the same, but the two nodes "
                "share one network stack, so no real network is crossed."
            )
            from distrinews_lib.distributed import free_port

            self.master_addr, self.port, self.ifname = "127.0.0.1", free_port(), "lo"
            self.event("loopback", reason=reason)
            return
        r = subprocess.run(["bash", str(NETNS), "up", self.prefix], capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise SystemExit(f"[cluster] netns.sh up failed: {r.stderr.strip() or r.stdout.strip()}")
        self.netns = True
        say(r.stdout.strip())
        say(f"node0 = {SUBNET}.1, node1 = {SUBNET}.2, both on interface veth0; rendezvous at node0:{self.port}")
        self.event("netns up", prefix=self.prefix)

    def traffic(self) -> dict:
        """Bytes each node sent and received on veth0 and on lo (read before the namespaces go)."""
        out = {}
        for i in (0, 1):
            for dev in ("veth0", "lo"):
                r = subprocess.run(
                    ["ip", "-n", f"{self.prefix}-node{i}", "-j", "-s", "link", "show", dev],
                    capture_output=True,
                    text=True,
                    timeout=10,
                )
                try:
                    stats = json.loads(r.stdout)[0]["stats64"]
                    out[f"node{i}/{dev}"] = {"tx_bytes": stats["tx"]["bytes"], "rx_bytes": stats["rx"]["bytes"]}
                except (ValueError, LookupError):
                    pass
        return out

    def network_down(self) -> None:
        if self.netns:
            self.bytes = self.traffic()
            if self.bytes:
                say(
                    "bytes sent over each interface: "
                    + ", ".join(f"{k} {v['tx_bytes'] / 2**20:.1f} MiB" for k, v in self.bytes.items())
                )
            subprocess.run(["bash", str(NETNS), "down", self.prefix], capture_output=True, text=True, timeout=60)
            self.netns = False
            say(f"namespaces {self.prefix}-node0/1 deleted")
            self.event("netns down")

    # ---------------------------------------------------------------- the run
    def start(self, index: int, extra=()) -> None:
        launch = sum(1 for e in self.events if e["event"].startswith(f"node{index} started")) + 1
        self.nodes[index] = Node(self, index, launch)
        self.nodes[index].start(list(extra))

    def run(self) -> int:
        a = self.args
        kill = ["--kill-at-step", str(a.kill_at_step)] if a.kill_at_step else []
        self.start(0, kill if a.kill_node == 0 else [])
        if a.join_later:
            self._wait_for_first_snapshot()
        if not a.only_node0 and 1 not in self.nodes:
            self.start(1, kill if a.kill_node == 1 else [])
        deadline = time.monotonic() + a.timeout
        while True:
            for i, node in list(self.nodes.items()):
                rc = node.poll()
                if rc is None or i in self.finished:
                    continue
                node.thread.join(timeout=5)
                self.event(f"node{i} exited", rc=rc)
                others_running = any(n.poll() is None for j, n in self.nodes.items() if j != i)
                if rc != 0 and a.relaunch and self.relaunches < a.relaunch and others_running:
                    self.relaunches += 1
                    say(
                        f"node{i} is gone (exit code {rc}). A replacement node{i} starts in {a.relaunch_delay:g} s "
                        "and joins the next rendezvous round (as a scheduler would put a spare node in)"
                    )
                    time.sleep(a.relaunch_delay)
                    self.start(i)
                else:
                    self.finished[i] = rc
            if all(i in self.finished for i in self.nodes):
                break
            if time.monotonic() > deadline:
                say(f"TIMEOUT: still running after {a.timeout} s; stopping every node")
                self.event("timeout")
                return 124
            time.sleep(0.2)
        codes = [self.finished[i] for i in sorted(self.finished)]
        say("exit codes: " + ", ".join(f"node{i} {self.finished[i]}" for i in sorted(self.finished)))
        return next((c for c in codes if c != 0), 0)

    def _wait_for_first_snapshot(self) -> None:
        snaps = (
            self.workdir / "node0" / "run" if self.args.local_output else self.workdir / "shared" / "run"
        ) / "snapshots"
        say(f"node1 will join once node0 has written its first snapshot in {snaps}")
        deadline = time.monotonic() + self.args.timeout
        while time.monotonic() < deadline and self.nodes[0].poll() is None:
            if list(snaps.glob("snap_*.pt")):
                self.event("first snapshot")
                return
            time.sleep(0.2)

    def stop_all(self) -> None:
        for node in self.nodes.values():
            if node.poll() is None:
                node.proc.terminate()  # node.py forwards it to torchrun, which stops its ranks
        end = time.monotonic() + 15
        for node in self.nodes.values():
            try:
                node.proc.wait(timeout=max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                node.proc.kill()

    def write_record(self, rc: int) -> None:
        record = {
            "mode": "netns" if any(e["event"] == "netns up" for e in self.events) else "loopback",
            "master_addr": self.master_addr,
            "port": self.port,
            "ifname": self.ifname,
            "exit_code": rc,
            "seconds": round(time.time() - self.t0, 2),
            "relaunches": self.relaunches,
            "traffic": self.bytes,
            "prefix": self.prefix,
            "events": self.events,
            "args": {k: v for k, v in vars(self.args).items() if k != "train"},
            "train_args": self.train_args(),
        }
        (self.workdir / "cluster.json").write_text(json.dumps(record, indent=2))


def parse(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    p.add_argument("--workdir", default="outputs/multinode", help="node0/, node1/ (node-local disks), shared/, logs")
    p.add_argument("--script", default="train_ddp.py", help="script in scripts/ to train with")
    p.add_argument("--nproc", type=int, default=1, help="ranks per node (1 on a 2-core machine)")
    p.add_argument("--nnodes", default="2", help="2, or 1:2 for an elastic run")
    p.add_argument("--max-restarts", type=int, default=0)
    p.add_argument("--loopback", action="store_true", help="do not use namespaces: both agents on 127.0.0.1")
    p.add_argument("--local-output", action="store_true", help="--output on each node's own disk instead of shared/")
    p.add_argument("--kill-node", type=int, choices=(0, 1), default=1, help="the node --kill-at-step takes down")
    p.add_argument(
        "--kill-at-step", type=int, default=None, help="that node dies (agent and ranks) after this optimizer step"
    )
    p.add_argument(
        "--relaunch", type=int, nargs="?", const=1, default=0, help="start a replacement for a node that died (N times)"
    )
    p.add_argument("--relaunch-delay", type=float, default=1.0)
    p.add_argument("--join-later", action="store_true", help="start node1 only after node0 wrote its first snapshot")
    p.add_argument("--only-node0", action="store_true", help="never start node1 (a node that never arrives)")
    p.add_argument("--node1-master-addr", default=None, help="bad input: node1 gets this MASTER_ADDR")
    p.add_argument("--node1-master-port", type=int, default=None, help="bad input: node1 gets this MASTER_PORT")
    p.add_argument("--node1-nnodes", default=None, help="bad input: node1 gets this --nnodes")
    p.add_argument("--join-timeout", type=int, default=120, help="seconds the rendezvous waits for every node")
    p.add_argument("--connect-timeout", type=int, default=30, help="seconds a node tries to reach node0:port")
    p.add_argument("--timeout", type=float, default=600, help="backstop for the whole run, seconds")
    p.add_argument("train", nargs=argparse.REMAINDER, help="-- then the training script's arguments")
    a = p.parse_args(argv)
    a.train = a.train[1:] if a.train[:1] == ["--"] else a.train
    return a


def main(argv=None) -> int:
    args = parse(argv)
    cluster = Cluster(args)

    def on_signal(signum, frame):
        raise SystemExit(128 + signum)

    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, on_signal)
    rc = 1
    try:
        cluster.network_up()
        rc = cluster.run()
        return rc
    finally:
        cluster.network_down()  # first: it kills whatever still runs inside the namespaces, at once
        cluster.stop_all()
        cluster.write_record(rc)


if __name__ == "__main__":
    sys.exit(main())
