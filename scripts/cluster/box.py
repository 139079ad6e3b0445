#!/usr/bin/env python
"""A cluster in a box: N "nodes" on this machine, each a network namespace with a link of its own to a switch,
shaped to the rate you dial, and g ranks of a script on each node (one by default).

    sudo .venv/bin/python scripts/cluster/box.py --nodes 2 --link 400mbit -- scripts/by_hand/race.py --out r.json
    ... --nodes 2 --ranks-per-node 2      # two levels: 2 nodes x 2 ranks, as 2 machines of 2 GPUs each
    ... --link none                       # the links unshaped: as fast as the kernel moves bytes between namespaces
    ... --check                           # can this machine build a box? exit 0, or 3 and the reason in one line

The box (scripts/cluster/namespaces.py builds it):
- a switch: a namespace holding a bridge, br0;
- node i (i = 0..N-1): a namespace with `lo` and `eth0` (address 10.88.0.<i+1>), joined to the switch by a veth pair:
  its own cable, as each machine of a cluster has its own NIC;
- each cable shaped in BOTH directions by a token-bucket filter (`tc qdisc ... tbf rate RATE`): on the node's eth0
  (what the node sends) and on the switch's end (what it receives). While bytes wait in the filter the CPU is free to
  compute, as it is behind a real NIC. This kernel has no netem: bandwidth is the dial, latency is what it is;
- node i runs ranks i*g .. i*g+g-1 of the script (RANK, LOCAL_RANK, WORLD_SIZE=N*g, LOCAL_WORLD_SIZE=g, GROUP_RANK=i,
  MASTER_ADDR=10.88.0.1, GLOO_SOCKET_IFNAME=eth0, as torchrun --nnodes=N --nproc_per_node=g sets them), through
  distrinews_course.harden, as the course's launcher runs every rank. The g ranks of a node share its address, so
  the kernel carries what they send each other over the node's loopback, unshaped (the fast level: NVLink inside a
  machine); what crosses to another node leaves through eth0 and its filter (the slow level: the NIC). Each rank
  sees its node's own /sys (a sysfs mounted in its namespace): /sys/class/net/eth0/statistics counts that link.
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
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))

from namespaces import NOT_POSSIBLE, USERNS_ENV, Box, BoxError, Dialer, parse_rate, remove_leftovers, say, usable

from distrinews_lib.errors import UserError

MAX_RANKS = 32  # N x g processes share this machine's cores


def rank_env(box: Box, node: int, local: int, per_node: int, port: int, control: Path) -> dict:
    env = dict(os.environ)
    env.update(
        RANK=str(node * per_node + local),
        LOCAL_RANK=str(local),
        WORLD_SIZE=str(box.n * per_node),
        LOCAL_WORLD_SIZE=str(per_node),
        GROUP_RANK=str(node),
        MASTER_ADDR=box.addr(0),
        MASTER_PORT=str(port),
        GLOO_SOCKET_IFNAME="eth0",
        TORCH_GLOO_LAZY_INIT=env.get("TORCH_GLOO_LAZY_INIT", "1"),
        PYTHONUNBUFFERED="1",
        DISTRINEWS_LINK_CONTROL=str(control),
        DISTRINEWS_BOX_NODES=str(box.n),
        DISTRINEWS_BOX_RANKS_PER_NODE=str(per_node),
        DISTRINEWS_BOX_LINK="none" if box.bits is None else f"{int(box.bits)}bit",
    )
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def run_ranks(box: Box, script: list[str], control: Path, per_node: int = 1) -> int:
    """Ranks i*g .. i*g+g-1 of the script on node i; the first rank to fail stops the others (as torchrun does)."""
    port = 29400 + os.getpid() % 500
    # Each node gets its own host name (node<i>) and an /etc/hosts naming every node, and a resolv.conf that answers
    # at once: no DNS server is reachable from a node, and a lookup that waits for one costs seconds. Its own sysfs
    # too, as `ip netns exec` mounts one: /sys/class/net then lists the node's devices, not this machine's.
    hosts, resolv = control / "hosts", control / "resolv.conf"
    hosts.write_text("127.0.0.1 localhost\n" + "".join(f"{box.addr(i)} node{i}\n" for i in range(box.n)))
    resolv.write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
    setup = (
        'mount --bind "$0" /etc/hosts && mount --bind "$1" /etc/resolv.conf && hostname "$2" && '
        '{ mount -t sysfs sysfs /sys 2>/dev/null || true; } && shift 2 && exec "$@"'
    )
    procs, where = [], []
    for i in range(box.n):
        for local in range(per_node):
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
            env = rank_env(box, i, local, per_node, port, control)
            procs.append(subprocess.Popen(cmd, env=env, cwd=os.getcwd()))
            where.append(i)
    while True:
        codes = [p.poll() for p in procs]  # every rank, every time: the first failure stops the others at once
        failed = next((r for r, c in enumerate(codes) if c not in (None, 0)), None)
        if failed is not None or all(c == 0 for c in codes):
            break
        time.sleep(0.05)
    if failed is None:
        return 0
    code = procs[failed].returncode
    say(f"rank {failed} (node {where[failed]}) exited with code {code}; stopping the other ranks")
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
    p.add_argument("--nodes", type=int, default=2, help="nodes, 2 or more")
    p.add_argument(
        "--ranks-per-node",
        type=int,
        default=1,
        help="ranks on each node (1 by default): they talk over the node's loopback, the nodes over their links",
    )
    p.add_argument("--link", default="none", help="each node's link rate, both directions: 400mbit, 1gbit, ... or none")
    p.add_argument("--check", action="store_true", help="only say whether a box can be built here (exit 0 or 3)")
    p.add_argument("script", nargs=argparse.REMAINDER, help="-- then the script and its arguments")
    args = p.parse_args(argv)
    script = args.script[1:] if args.script[:1] == ["--"] else args.script
    try:
        bits = parse_rate(args.link)
        if args.nodes < 2 or args.nodes > 16:
            raise BoxError(f"--nodes {args.nodes}: a box holds 2 to 16 nodes")
        if args.ranks_per_node < 1 or args.nodes * args.ranks_per_node > MAX_RANKS:
            raise BoxError(
                f"--ranks-per-node {args.ranks_per_node}: give 1 or more, and at most {MAX_RANKS} ranks in all "
                f"(here {args.nodes} nodes x {args.ranks_per_node}): they share this machine's cores"
            )
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
            g = args.ranks_per_node
            ranks = f" x {g} ranks (their loopback unshaped)" if g > 1 else ""
            say(
                f"{args.nodes} nodes{ranks}, each link {args.link} both ways ({box.ns('sw')} switch); rank 0 at "
                f"{box.addr(0)}"
            )
            code = run_ranks(box, script, Path(control), g)
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
