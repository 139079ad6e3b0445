"""Chapter 08's reference answers (read only by its solution cells; see README.md here)."""


def launch_line(node_addr):
    """The torchrun line the node at node_addr runs: two nodes, one rank each, job news42, rendezvous at node0:29500."""
    return [
        "torchrun",
        "--nnodes=2",
        "--nproc_per_node=1",
        "--rdzv_backend=c10d",
        "--rdzv_endpoint=10.0.0.1:29500",
        "--rdzv_id=news42",
        f"--local_addr={node_addr}",
        "scripts/train_ddp.py",
    ]


def write_hierarchical(path):
    """Exercise 4's answer where the learner's file would go: the cross-node half of scripts/by_hand/hierarchical.py.
    Returns the path."""
    return _from_the_rung("hierarchical", path)


def write_hsdp(path):
    """The HSDP exercise's answer where the learner's file would go: node_group() and replicate() of
    scripts/by_hand/hsdp.py. Returns the path."""
    return _from_the_rung("hsdp", path)


def _from_the_rung(rung, path):
    """The functions the exercise leaves blank, taken from the rung itself by chapter 03's answers (the same rule: the
    rung is the reference), written to `path`."""
    import importlib.util
    from pathlib import Path

    here = Path(__file__).resolve().parent
    spec = importlib.util.spec_from_file_location("answers_03_for_08", here / "03_ddp_by_hand.py")
    answers_03 = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(answers_03)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(answers_03.solution_source(rung, functions_only=True))
    return path


def never_arrives(join_timeout, startup_s):
    """Exercise 2's prediction, made before the run: the agent starts (this machine's start-up to a rank, as the
    two-node run measured it), then its rendezvous waits --join-timeout for node1 (it does not start a world of 1, and
    --join-timeout replaces torchrun's 600 s), then gives up."""
    return join_timeout + startup_s


def check_interface(ifname, interfaces):
    """Exercise 3: the IPv4 address of the interface the nodes talk on, or a refusal in one line (ValueError) that
    names it and, where it is missing, lists the node's interfaces."""
    if ifname not in interfaces:
        have = ", ".join(interfaces) or "none found"
        raise ValueError(f"--ifname '{ifname}' names no network interface on this node (it has: {have})")
    address = interfaces[ifname]
    if address is None:
        raise ValueError(f"the interface '{ifname}' has no IPv4 address on this node")
    return address
