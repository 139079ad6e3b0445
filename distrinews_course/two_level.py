"""Chapter 08's two-level cost model: N nodes x g ranks, a fast level inside a node (NVLink; the box's loopback) and a
slow link per node (its NIC; the box's shaped cable). Each level has its own alpha-beta (perf_model.Fit, fitted in the
box); a variant's step is its computation plus each of its collectives on the level it crosses, one after another.

    lay = Layout(nodes=2, per_node=2)
    p = predict("hsdp", blocks, lay, intra=fit_in, inter=fit_out, compute=parts)   # blocks: numbers per flat block
    p.link_bytes, p.step_s                  # what each node's link sends per step, and the step's seconds
    c = computation("hsdp", blocks, lay, fit_in, fit_fast, fast_step_s)  # its computation, from a step on a fast link

The variants (what each sends, per step, with M bytes of gradients and blocks B_i of a sharded model):
  ddp           one all-reduce of M over all N*g ranks: gloo's ring (and torch's DDP's, bucket by bucket);
  hierarchical  reduce-scatter of M inside the node, all-reduce of its 1/g shard across the nodes, all-gather inside;
  fsdp          ZeRO-3 / FSDP2 over all N*g ranks: each block all-gathered twice (forward, backward), its gradient
                reduce-scattered;
  hsdp          the same inside the node only, then an all-reduce of each gradient shard (B_i/g) across the nodes.

Which bytes leave a node. The ranks are numbered node by node (torchrun's order, and the box's), so a ring over every
rank (0 -> 1 -> ... -> N*g-1 -> 0) leaves each node by ONE edge, from its last rank to the next node's first: a node's
link carries what one rank sends. A ring across the nodes (one rank per node) leaves the node from each of its g
ranks at once: the link carries g of them. A ring inside the node never leaves it.

What a rank sends for a buffer of S bytes in a group of k ranks is the algorithm's: a ring all-reduce sends 2(k-1)/k S
(a reduce-scatter then an all-gather), an all-gather (k-1)/k S. A reduce-scatter on gloo is an all-reduce of the whole
buffer whose slice the rank keeps (torch's ProcessGroupGloo), so it sends 2(k-1)/k S too; NCCL's is a ring's half,
(k-1)/k S. The box measured both (chapter 08; tests/test_two_level.py holds the arithmetic).

The model lets nothing overlap: on the course's model 93% of the bytes are the word embedding's, which backward makes
last and forward needs first, so hardly any of them can hide under computation. On paper (section `paper` below) a
GPU's FSDP prefetches and overlaps; there the best case, every byte hidden while computation lasts, is shown too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .perf_model import Fit

VARIANTS = ("ddp", "hierarchical", "fsdp", "hsdp")
GROUPS = ("world", "intra", "cross")


@dataclass(frozen=True)
class Layout:
    nodes: int
    per_node: int

    @property
    def world(self) -> int:
        return self.nodes * self.per_node

    def size(self, group: str) -> int:
        return {"world": self.world, "intra": self.per_node, "cross": self.nodes}[group]


def sent_factor(op: str, k: int, backend: str = "gloo") -> float:
    """Bytes one rank sends for collective `op` on a buffer of S bytes among k ranks, as a multiple of S."""
    if k <= 1:
        return 0.0
    if op == "all_gather":
        return (k - 1) / k
    if op == "all_reduce" or (op == "reduce_scatter" and backend == "gloo"):
        return 2 * (k - 1) / k
    if op == "reduce_scatter":
        return (k - 1) / k
    raise ValueError(f"unknown collective {op!r}")


@dataclass(frozen=True)
class Op:
    op: str  # all_reduce, reduce_scatter, all_gather
    group: str  # world, intra or cross
    nbytes: float  # the whole buffer (for a reduce-scatter its input, for an all-gather its output)
    what: str = ""

    def rank_bytes(self, lay: Layout, backend: str = "gloo") -> float:
        """What each rank of the group sends."""
        return sent_factor(self.op, lay.size(self.group), backend) * self.nbytes

    def link_bytes(self, lay: Layout, backend: str = "gloo") -> float:
        """What each node's link sends (and receives) for this collective, every group of its kind at once."""
        if lay.nodes <= 1 or self.group == "intra":
            return 0.0
        if self.group == "world":  # one ring edge leaves each node: what one rank sends
            return self.rank_bytes(lay, backend)
        return lay.per_node * self.rank_bytes(lay, backend)  # cross: each of the node's g ranks sends its own

    def seconds(self, lay: Layout, intra: Fit, inter: Fit, backend: str = "gloo") -> float:
        """Its time: on the node's link when it leaves the node (the link's bytes at the link's rate), else inside the
        node (what a rank sends at the fast level's rate, every node's group at once, as the fit measured it)."""
        if self.link_bytes(lay, backend) > 0:
            return inter.seconds(self.link_bytes(lay, backend))
        if self.rank_bytes(lay, backend) > 0:
            return intra.seconds(self.rank_bytes(lay, backend))
        return 0.0


def padded(numel: int, parts: int) -> int:
    """numel rounded up to a multiple of parts: every rank's shard the same length (as the rungs pad)."""
    return -(-numel // parts) * parts


def plan(variant: str, blocks: list[int], lay: Layout, element_bytes: int = 4) -> list[Op]:
    """The collectives of one step, in order. blocks: the numbers of elements of each flat buffer the variant sends
    (ddp: each bucket, or one flat buffer; hierarchical: one flat buffer; fsdp, hsdp: each block of the model)."""
    e, g, w = element_bytes, lay.per_node, lay.world
    if variant == "ddp":
        return [Op("all_reduce", "world", e * b, "all-reduce") for b in blocks]
    if variant == "hierarchical":
        total = padded(sum(blocks), g)
        return [
            Op("reduce_scatter", "intra", e * total, "reduce-scatter inside"),
            Op("all_reduce", "cross", e * total / g, "all-reduce across"),
            Op("all_gather", "intra", e * total, "all-gather inside"),
        ]
    if variant == "fsdp":
        out = []
        for b in blocks:
            s = e * padded(b, w)
            out += [Op("all_gather", "world", s, "gather (forward)"), Op("all_gather", "world", s, "gather (backward)")]
            out.append(Op("reduce_scatter", "world", s, "reduce-scatter"))
        return out
    if variant == "hsdp":
        out = []
        for b in blocks:
            s = e * padded(b, g)
            out += [Op("all_gather", "intra", s, "gather (forward)"), Op("all_gather", "intra", s, "gather (backward)")]
            out += [
                Op("reduce_scatter", "intra", s, "reduce-scatter inside"),
                Op("all_reduce", "cross", s / g, "all-reduce across"),
            ]
        return out
    raise ValueError(f"unknown variant {variant!r}: one of {', '.join(VARIANTS)}")


def optimizer_share(variant: str, lay: Layout) -> float:
    """The share of the parameters a rank's optimizer updates: all of them, or its shard (1/(N*g); HSDP's 1/g)."""
    return {"ddp": 1.0, "hierarchical": 1.0, "fsdp": 1 / lay.world, "hsdp": 1 / lay.per_node}[variant]


@dataclass
class Prediction:
    variant: str
    compute_s: float  # forward + backward + the optimizer on this rank's share, no communication
    intra_s: float  # the collectives inside the node
    inter_s: float  # the collectives that leave it
    link_bytes: float  # what each node's link sends per step
    ops: list = field(default_factory=list)
    inter_ops: int = 0  # how many of them leave the node (each pays the link's alpha)

    @property
    def step_s(self) -> float:
        return self.compute_s + self.intra_s + self.inter_s

    def as_dict(self) -> dict:
        return {
            "variant": self.variant,
            "compute_s": self.compute_s,
            "intra_s": self.intra_s,
            "inter_s": self.inter_s,
            "step_s": self.step_s,
            "link_bytes": self.link_bytes,
            "collectives": len(self.ops),
            "inter_ops": self.inter_ops,
        }


def predict(
    variant: str,
    blocks: list[int],
    lay: Layout,
    intra: Fit,
    inter: Fit,
    compute,
    backend: str = "gloo",
    element_bytes: int = 4,
) -> Prediction:
    """A step of `variant`: its computation, then every collective of plan() on its level, one after another. compute:
    the step's parts measured with no communication ({forward, backward, optimizer}: the optimizer on this rank's
    share), or the variant's own computation in seconds (computation())."""
    ops = plan(variant, blocks, lay, element_bytes)
    if isinstance(compute, dict):
        c = compute["forward"] + compute["backward"] + compute["optimizer"] * optimizer_share(variant, lay)
    else:
        c = float(compute)
    intra_s = sum(o.seconds(lay, intra, inter, backend) for o in ops if o.link_bytes(lay, backend) == 0)
    inter_s = sum(o.seconds(lay, intra, inter, backend) for o in ops if o.link_bytes(lay, backend) > 0)
    across = [o for o in ops if o.link_bytes(lay, backend) > 0]
    return Prediction(variant, c, intra_s, inter_s, sum(o.link_bytes(lay, backend) for o in ops), ops, len(across))


def step_at(pred: dict, inter: Fit) -> float:
    """A prediction (Prediction.as_dict()) on a link of another rate: its computation and its collectives inside the
    node unchanged, each collective across at `inter`'s alpha-beta:

        step = computation + inside + n_across x alpha_link + link_bytes / B_link
    """
    return pred["compute_s"] + pred["intra_s"] + inter.seconds(pred["link_bytes"], pred["inter_ops"])


def link_fit(alpha_s: float, bytes_per_s: float, mbit: float, dialed_mbit: float) -> Fit:
    """The link's fit at `mbit`, from its fit at the dialed rate: the same latency, the payload rate in proportion
    (a token-bucket filter passes bytes at the rate it is set to)."""
    return Fit(alpha_s, 1 / (bytes_per_s * mbit / dialed_mbit))


def computation(
    variant: str, blocks: list[int], lay: Layout, intra: Fit, inter_fast: Fit, fast_step_s: float, backend="gloo"
) -> float:
    """A variant's computation and whatever it does between its collectives (copies, bookkeeping, a rank waiting for
    another), measured: its step on a fast link (`fast_step_s`; the box unshaped, where `inter_fast` was fitted) less
    the time the model gives its collectives there."""
    p = predict(variant, blocks, lay, intra, inter_fast, 0.0, backend)
    return fast_step_s - p.intra_s - p.inter_s


def saving(slow: Prediction, fast: Prediction) -> float:
    """Seconds per step the faster variant saves over the slower one."""
    return slow.step_s - fast.step_s


def rate_for(link_bytes: float, seconds: float) -> float:
    """The payload rate (bytes per second) at which a node's link takes `seconds` to send `link_bytes`."""
    return link_bytes / seconds


# ----------------------------------------------------------------------------------------------------- on paper

# A node of 8 GPUs on NVLink (H100 SXM: 450 GB/s per GPU and direction, cluster_model.LINKS["nvlink4"]), 2 to 64 of
# them on a network of 100 to 400 Gbit/s per node. NCCL: ring all-reduce and all-gather, a ring's reduce-scatter.
PAPER_GPUS_PER_NODE = 8
PAPER_NODES = (2, 4, 8, 16, 32, 64)
PAPER_GBIT = (100, 200, 400)
NVLINK_GB_S, NVLINK_ALPHA_US, NET_ALPHA_US = 450.0, 5.0, 10.0


def paper_fits(gbit: float) -> tuple[Fit, Fit]:
    """(inside a node, across nodes) for a node of 8 GPUs on NVLink and a NIC of `gbit` Gbit/s per node."""
    return Fit(NVLINK_ALPHA_US * 1e-6, 1 / (NVLINK_GB_S * 1e9)), Fit(NET_ALPHA_US * 1e-6, 1 / (gbit / 8 * 1e9))


def paper_step(variant: str, params: float, nodes: int, gbit: float, compute_s: float, overlap: bool) -> dict:
    """One step of a model of `params` parameters (bf16 weights and gradients: 2 bytes each, one flat block) on
    `nodes` x 8 GPUs: the communication, and the step with it either after the computation (overlap False) or, in
    the best case, hidden under it while the computation lasts (overlap True)."""
    lay = Layout(nodes, PAPER_GPUS_PER_NODE)
    intra, inter = paper_fits(gbit)
    p = predict(variant, [int(params)], lay, intra, inter, {"forward": 0, "backward": 0, "optimizer": 0}, "nccl", 2)
    comm = p.intra_s + p.inter_s
    step = max(compute_s, comm) if overlap else compute_s + comm
    return {
        "variant": variant,
        "nodes": nodes,
        "gbit": gbit,
        "comm_s": comm,
        "step_s": step,
        "link_bytes": p.link_bytes,
    }


def paper_table(params: float, compute_s: float, overlap: bool = True, gbits=PAPER_GBIT) -> list[dict]:
    """FSDP (full sharding) against HSDP at every point of PAPER_NODES x gbits: each one's step and what HSDP saves,
    in seconds and as a share of FSDP's step."""
    rows = []
    for gbit in gbits:
        for n in PAPER_NODES:
            f = paper_step("fsdp", params, n, gbit, compute_s, overlap)
            h = paper_step("hsdp", params, n, gbit, compute_s, overlap)
            rows.append(
                {
                    "nodes": n,
                    "gpus": n * PAPER_GPUS_PER_NODE,
                    "gbit": gbit,
                    "fsdp_s": f["step_s"],
                    "hsdp_s": h["step_s"],
                    "saved_s": f["step_s"] - h["step_s"],
                    "saved_share": (f["step_s"] - h["step_s"]) / f["step_s"],
                    "fsdp_link_bytes": f["link_bytes"],
                    "hsdp_link_bytes": h["link_bytes"],
                }
            )
    return rows


def paper_table_text(params: float, compute_s: float, nodes=(2, 8, 64), gbits=(100, 400)) -> str:
    """paper_table as the chapter prints it: per number of nodes, FSDP's and HSDP's seconds a step and what HSDP
    saves, at each network rate; an ESTIMATE from published figures."""
    rows = {(r["nodes"], r["gbit"]): r for r in paper_table(params, compute_s, gbits=gbits)}
    head = f"{'nodes':>5} {'GPUs':>5}" + "".join(
        f" | {g:>3} Gbit/s: {'FSDP':>5} {'HSDP':>5} {'saved':>5}" for g in gbits
    )
    lines = [head]
    for n in nodes:
        lines.append(
            f"{n:>5} {PAPER_GPUS_PER_NODE * n:>5}"
            + "".join(
                f" | {'':>11} {rows[n, g]['fsdp_s']:>5.2f} {rows[n, g]['hsdp_s']:>5.2f} "
                f"{100 * rows[n, g]['saved_share']:>4.0f}%"
                for g in gbits
            )
        )
    return "\n".join(lines)
