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
