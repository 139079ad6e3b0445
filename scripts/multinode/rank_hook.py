"""Runs in every rank before the training script: says who this rank is, then runs the script unchanged.

    torchrun ... scripts/multinode/rank_hook.py scripts/train_ddp.py ARGS...

Each rank prints one line (all ranks, not only rank 0: the point is to see them differ), e.g.

    [identity] RANK 1 | LOCAL_RANK 0 | node node1 10.77.0.2 (veth0) | WORLD_SIZE 2 | node rank 1 of 2 | store 10.77.0.1:40117 | attempt 0

RANK counts ranks across all nodes, LOCAL_RANK within this node (it picks the GPU), "node rank" is the
agent's place in the rendezvous (GROUP_RANK), "store" is where the ranks meet to build the process group
(MASTER_ADDR:MASTER_PORT, hosted by rank 0), "attempt" is TORCHELASTIC_RESTART_COUNT of this node's agent.

For the course's demo of a dying machine: with DISTRINEWS_KILL_NODE_AT_STEP=K in the environment (set by
scripts/multinode/two_nodes.py on one node's first launch only), the ranks of this node SIGKILL their torchrun
agent right after optimizer step K, and then themselves: the agent and every rank on the node vanish at once,
as when a machine loses power. The training script knows nothing about it.
"""  # noqa: E501

from __future__ import annotations

import os
import runpy
import signal
import socket
import struct
import sys


def interface_address(ifname: str) -> str | None:
    """IPv4 address of a network interface (Linux), or None."""
    try:
        import fcntl

        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", ifname[:15].encode()))  # SIOCGIFADDR
        return socket.inet_ntoa(packed[20:24])
    except (OSError, ImportError):
        return None


def route_address(host: str, port: int) -> str | None:
    """The local address this machine would use to reach host (no packet is sent)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, port))
            return s.getsockname()[0]
    except OSError:
        return None


def identity() -> str:
    env = os.environ
    ifname = env.get("GLOO_SOCKET_IFNAME") or env.get("NCCL_SOCKET_IFNAME")
    addr = interface_address(ifname) if ifname else None
    if addr is None and env.get("MASTER_ADDR"):
        addr = route_address(env["MASTER_ADDR"], int(env.get("MASTER_PORT", "29500")))
    via = f" ({ifname})" if ifname else ""
    return (
        f"[identity] RANK {env.get('RANK')} | LOCAL_RANK {env.get('LOCAL_RANK')} | node {socket.gethostname()} "
        f"{addr or '?'}{via} | WORLD_SIZE {env.get('WORLD_SIZE')} | node rank {env.get('GROUP_RANK', '?')} of "
        f"{env.get('GROUP_WORLD_SIZE', '?')} | store {env.get('MASTER_ADDR')}:{env.get('MASTER_PORT')} | "
        f"attempt {env.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    )


def kill_node_after(step: int) -> None:
    """After optimizer step `step`, SIGKILL this node's torchrun agent (our parent) and then this rank."""
    from torch.optim.optimizer import register_optimizer_step_post_hook

    agent = os.getppid()
    done = [0]

    def after_step(optimizer, args, kwargs):
        done[0] += 1
        if done[0] == step:
            print(
                f"[node {socket.gethostname()}] RANK {os.environ.get('RANK')}: pulling the plug after step {done[0]}: "
                f"SIGKILL to this node's torchrun agent (pid {agent}) and its ranks",
                flush=True,
            )
            os.kill(agent, signal.SIGKILL)
            os.kill(os.getpid(), signal.SIGKILL)

    register_optimizer_step_post_hook(after_step)


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: rank_hook.py SCRIPT [ARGS...]   (under torchrun)")
    print(identity(), flush=True)
    from distrinews_course import harden  # this launcher's ranks die with their agent, like course.launch's

    harden.apply()
    kill_at = os.environ.get("DISTRINEWS_KILL_NODE_AT_STEP", "")
    if kill_at.isdigit() and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
        kill_node_after(int(kill_at))
    script = os.path.abspath(sys.argv[1])
    sys.argv = [script, *sys.argv[2:]]
    sys.path.insert(0, os.path.dirname(script))
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
