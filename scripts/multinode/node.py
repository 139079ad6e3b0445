#!/usr/bin/env python
"""What runs on EACH node of a multi-node job: checks the setup, then starts this node's torchrun agent.

    # on node0 (10.77.0.1) and on node1, the same command but the node rank:
    python scripts/multinode/node.py --nnodes 2 --node-rank 0 --master-addr node0 --ifname veth0 \\
        scripts/train_ddp.py --output /shared/run --resume auto ...

It prints, then runs, the plain torchrun command (c10d rendezvous at MASTER_ADDR:MASTER_PORT, this node's
address as --local_addr, GLOO_SOCKET_IFNAME set), with scripts/multinode/rank_hook.py in front of the script
so that every rank says who it is. Around torchrun it turns the usual multi-node mistakes into one paragraph
each, within a bounded time, instead of a long wait and a traceback:

- MASTER_ADDR that does not resolve, a --ifname this node does not have, node rank 0 started on a machine
  that is not MASTER_ADDR: refused at once (exit 2);
- MASTER_ADDR:MASTER_PORT that cannot be reached (wrong address, wrong port, node 0 not started): said after
  --connect-timeout seconds, naming what failed (refused: nothing listens on that port; timed out: no
  machine answers) (exit 2);
- nodes started with different --nnodes: every node publishes its settings in the rendezvous store and reads
  the others'; a mismatch stops this node's torchrun with both values named (exit 2);
- a node that never arrives: torchrun gives up after --join-timeout seconds; this says which nodes did
  arrive (exit 2).

Settings also come from the environment, as scripts/run_ddp.sh and Slurm set them: NNODES, NODE_RANK,
MASTER_ADDR, MASTER_PORT, NPROC_PER_NODE, GLOO_SOCKET_IFNAME, RDZV_ID. Multi-node rendezvous details:
- TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 is set for torchrun: the ranks then build their process group on a store
  that rank 0 hosts afresh for each rendezvous round. With the agent's shared store (torch's default), a
  replacement node that joins a later round (a node died and came back) waits for a MASTER_ADDR key that the
  surviving agent wrote only in the first round, and both sides time out (seen here with torch 2.13: "wait
  timeout ... keys: /torch.rendezvous.<id>.1/MASTER_ADDR"); the shared store also keys each attempt by the
  agent's own restart count, which differs between a survivor (1) and a replacement (0): pytorch#135712.
- --local_addr is this node's address on the shared network: the rendezvous orders the nodes by it (so node0,
  10.77.0.1, becomes node rank 0) and hands rank 0's to every rank as MASTER_ADDR for the process group.
"""

from __future__ import annotations

import argparse
import collections
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

from preflight import Preflight, Refused  # scripts/multinode/preflight.py, beside this file

HERE = Path(__file__).resolve().parent
HOOK = HERE / "rank_hook.py"
EXPLAINED = 2  # exit code for a setup mistake this launcher explained


def log(msg: str) -> None:
    print(f"[launcher {socket.gethostname()}] {msg}", flush=True)


def parse(argv=None):
    env = os.environ
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--nnodes", default=env.get("NNODES", "1"), help="number of nodes, or MIN:MAX for an elastic run (env NNODES)"
    )
    p.add_argument(
        "--node-rank",
        type=int,
        default=int(env["NODE_RANK"]) if env.get("NODE_RANK", "").isdigit() else None,
        help="0 on the node that hosts the rendezvous (MASTER_ADDR); optional (env NODE_RANK)",
    )
    p.add_argument(
        "--nproc", type=int, default=int(env.get("NPROC_PER_NODE", "1")), help="ranks on this node (env NPROC_PER_NODE)"
    )
    p.add_argument(
        "--master-addr", default=env.get("MASTER_ADDR"), help="node 0's address or host name (env MASTER_ADDR)"
    )
    p.add_argument(
        "--master-port",
        type=int,
        default=int(env.get("MASTER_PORT", "29500")),
        help="rendezvous port (env MASTER_PORT)",
    )
    p.add_argument(
        "--rdzv-id", default=env.get("RDZV_ID", "distrinews"), help="the job's id: the same on every node (env RDZV_ID)"
    )
    p.add_argument(
        "--ifname",
        default=env.get("GLOO_SOCKET_IFNAME"),
        help="network interface the ranks talk over (env GLOO_SOCKET_IFNAME)",
    )
    p.add_argument(
        "--max-restarts", type=int, default=0, help="torchrun --max-restarts: group restarts after a failure"
    )
    p.add_argument("--join-timeout", type=int, default=300, help="seconds the rendezvous waits for every node")
    p.add_argument("--connect-timeout", type=int, default=60, help="seconds to reach MASTER_ADDR:MASTER_PORT")
    p.add_argument(
        "--last-call", type=int, default=2, help="MIN:MAX runs: seconds to wait for more nodes once MIN are there"
    )
    p.add_argument(
        "--heartbeat",
        type=int,
        default=2,
        help="seconds between an agent's keep-alives; a node silent for 3 is dropped",
    )
    p.add_argument(
        "--kill-at-step",
        type=int,
        default=None,
        help="demo: this node dies (agent and ranks, SIGKILL) after optimizer step K",
    )
    p.add_argument("script", help="the training script, e.g. scripts/train_ddp.py")
    p.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    a = p.parse_args(argv)
    if not a.master_addr:
        p.error("set --master-addr (or MASTER_ADDR): node 0's address, the same on every node")
    return a


def local_addresses() -> list[str]:
    try:
        out = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True, timeout=5).stdout
        return [f"{line.split()[1]} {line.split()[3].split('/')[0]}" for line in out.splitlines()]
    except (OSError, subprocess.SubprocessError, IndexError):
        return []


def is_local(ip: str) -> bool:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((ip, 0))
        return True
    except OSError:
        return False


def check_setup(a) -> tuple[str, str]:
    """(MASTER_ADDR's IP, this node's address). Raises Refused for what can be decided at once."""
    sys.path.insert(0, str(HERE))
    from rank_hook import interface_address, route_address

    try:
        master_ip = socket.getaddrinfo(a.master_addr, a.master_port, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
    except socket.gaierror as err:
        raise Refused(
            f"MASTER_ADDR '{a.master_addr}' does not resolve on this node ({err.strerror}). Use node 0's "
            "address or a host name every node can resolve (on Slurm: the first name of "
            "`scontrol show hostnames $SLURM_JOB_NODELIST`)."
        )
    if a.node_rank == 0 and not is_local(master_ip):
        mine = "; ".join(local_addresses()) or "unknown"
        raise Refused(
            f"node rank 0 hosts the rendezvous, so MASTER_ADDR must be one of its own addresses, but "
            f"'{a.master_addr}' ({master_ip}) is not (this node has: {mine}). Start node rank 0 on "
            f"MASTER_ADDR, or set MASTER_ADDR to this node's address."
        )
    if a.ifname:
        names = sorted(name for _, name in socket.if_nameindex())
        if a.ifname not in names:
            raise Refused(
                f"GLOO_SOCKET_IFNAME/--ifname '{a.ifname}' names no network interface on this node "
                f"(it has: {', '.join(names) or 'none found'}). Name the interface the nodes reach each other on."
            )
        local = interface_address(a.ifname)
        if not local:
            raise Refused(f"the interface '{a.ifname}' has no IPv4 address on this node.")
    else:
        local = route_address(master_ip, a.master_port)
        if not local:
            raise Refused(f"this node has no route to MASTER_ADDR {a.master_addr} ({master_ip}).")
    lo, _, hi = a.nnodes.partition(":")
    hi = hi or lo
    if not (lo.isdigit() and hi.isdigit() and 1 <= int(lo) <= int(hi)):
        raise Refused(f"--nnodes '{a.nnodes}': give a number of nodes (2) or MIN:MAX (1:2).")
    return master_ip, local


def torchrun_command(a, local: str) -> list[str]:
    conf = [
        f"join_timeout={a.join_timeout}",
        f"read_timeout={a.connect_timeout + 15}",
        f"last_call_timeout={a.last_call}",
        f"keep_alive_interval={a.heartbeat}",
        "keep_alive_max_attempt=3",
    ]
    if a.node_rank is not None:
        conf.insert(0, f"is_host={int(a.node_rank == 0)}")  # explicit: in a namespace the host-name guess can miss
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nnodes={a.nnodes}",
        f"--nproc_per_node={a.nproc}",
        "--rdzv_backend=c10d",
        f"--rdzv_endpoint={a.master_addr}:{a.master_port}",
        f"--rdzv_id={a.rdzv_id}",
        f"--rdzv_conf={','.join(conf)}",
        f"--local_addr={local}",
        f"--max-restarts={a.max_restarts}",
        "--monitor-interval=0.5",
    ]
    # No --node_rank: with c10d the rendezvous numbers the nodes itself (ordered by --local_addr); --node-rank here
    # only says which node hosts the rendezvous store.
    return [*cmd, str(HOOK), a.script, *a.args]


def explain(rc: int, tail: str, a, pre: Preflight) -> str | None:
    where = f"{a.master_addr}:{a.master_port}"
    if "RendezvousTimeoutError" in tail:
        return (
            f"the rendezvous at {where} did not complete within --join-timeout {a.join_timeout} s: --nnodes={a.nnodes} "
            f"but the nodes that arrived were: {pre.arrived()}. A node never arrived: start node.py/torchrun on every "
            "node with the same MASTER_ADDR, MASTER_PORT, --rdzv-id and --nnodes, and check that each can reach "
            f"{where}."
        )
    if "RendezvousClosedError" in tail:
        return (
            f"the rendezvous at {where} is already closed: the other nodes finished or gave up before this "
            "node joined. Start all nodes of a job together (or resubmit the whole job)."
        )
    if "RendezvousConnectionError" in tail or "connection to the C10d store has failed" in tail:
        return (
            f"this node lost (or never had) its connection to the rendezvous store at {where}, which node rank 0's "
            "torchrun hosts: node 0 stopped or is unreachable."
        )
    if rc < 0:
        return f"torchrun on this node was killed by signal {-rc} ({signal.Signals(-rc).name}): this node is gone."
    return None


def main(argv=None) -> int:
    from distrinews_lib import quick_imports

    quick_imports.install()  # its preflight imports torch: with the garbage collector paused
    a = parse(argv)
    try:
        master_ip, local = check_setup(a)
    except Refused as err:
        log("refused: " + str(err))
        return EXPLAINED
    env = dict(os.environ, TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1", PYTHONUNBUFFERED="1")
    env.setdefault("TORCH_GLOO_LAZY_INIT", "1")  # gloo connects on first use: sturdier right after a restart
    env.setdefault("OMP_NUM_THREADS", "1")
    if a.ifname:
        env["GLOO_SOCKET_IFNAME"] = a.ifname
    env.pop("DISTRINEWS_KILL_NODE_AT_STEP", None)
    if a.kill_at_step:
        env["DISTRINEWS_KILL_NODE_AT_STEP"] = str(a.kill_at_step)
    cmd = torchrun_command(a, local)
    shown = ["torchrun", *cmd[3:]]
    log(
        f"{socket.gethostname()} {local}{f' ({a.ifname})' if a.ifname else ''}: "
        f"GLOO_SOCKET_IFNAME={a.ifname or '(unset)'}"
    )
    print("+ " + " ".join(shown), flush=True)

    try:  # stop torchrun (which stops its ranks) if whoever started us dies
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGTERM)
    except (OSError, AttributeError):
        pass
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    refused = threading.Event()

    def stop_torchrun(sig=signal.SIGTERM):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass

    def on_refused():
        refused.set()
        stop_torchrun()

    def on_signal(signum, frame):
        stop_torchrun()

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, on_signal)
    pre = Preflight(a, master_ip, local, on_refused)
    pre.start()
    tail = collections.deque(maxlen=200)
    for raw in proc.stdout:
        line = raw.decode("utf-8", "replace")
        tail.append(line)
        sys.stdout.write(line)
        sys.stdout.flush()
    try:
        rc = proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        stop_torchrun(signal.SIGKILL)
        rc = proc.wait()
    pre.stop.set()
    if refused.is_set() and pre.error:
        log("refused: " + pre.error)
        return EXPLAINED
    if rc == 0:
        log("torchrun finished: exit code 0")
        return 0
    why = explain(rc, "".join(tail), a, pre)
    if why:
        log("failed: " + why)
        return EXPLAINED if rc > 0 else 128 - rc
    log(f"failed: torchrun exited with code {rc}; its 'Root Cause' section above names the failing rank and error.")
    return rc


if __name__ == "__main__":
    sys.exit(main())
