"""Chapter 08's node groups, shown: scripts/multinode/node_groups.py run in a cluster in a box of N nodes x g ranks,
each rank all-reducing 4 MiB in its node's group and in its group across the nodes, and what each put on the node's
link.

    rows = node_groups.run()             # one row per rank: its groups' ranks, the sums, the link's MiB meanwhile
    print(node_groups.table(rows)); settle(node_groups.claims(rows))
"""

from __future__ import annotations

import json

from . import ROOT
from . import two_level as tl
from .claims import Claim

SCRIPT = ROOT / "scripts" / "multinode" / "node_groups.py"
MESSAGE_MIB = 4.0  # what the script all-reduces in each group (2**20 float32)
# The link counts more than the ring's payload: TCP/IP's headers and ACKs, the barriers, and whatever else crossed it
# in the window: 0.3% more on a quiet box, 2-12% more in one CI run under load. At least the payload, at most a
# quarter more (twice the most seen: a tighter bound would fail some day under load, as the box shares 2 cores): a
# link that carried part of a message, or half as much again as the ring needs (a group across the world), fails.
OVERHEAD = 0.25
TAG = "[groups] "  # what starts each rank's row in the script's output


def run(nodes: int = 2, per_node: int = 2, timeout: float = 120) -> list[dict]:
    """The script in a box of `nodes` x `per_node` ranks, links unshaped: every rank's row, in rank order."""
    from . import link

    res = link.run_in_box(SCRIPT, nodes=nodes, ranks_per_node=per_node, timeout=timeout)
    return rows_of("\n".join(res.lines))


def rows_of(output: str) -> list[dict]:
    """Every '[groups] {...}' row in the ranks' output, in rank order. The ranks share one pipe, so two rows can land
    on one line: each is read where it starts, as far as its JSON goes."""
    dec, rows = json.JSONDecoder(), []
    at = output.find(TAG)
    while at >= 0:
        try:
            row, end = dec.raw_decode(output, at + len(TAG))
            rows.append(row)
        except ValueError:  # a row cut by another rank's text: claims() says a rank's row is missing
            end = at + len(TAG)
        at = output.find(TAG, end)
    return sorted(rows, key=lambda r: r["rank"])


def table(rows: list[dict]) -> str:
    out = [
        f"{'rank':>4} {'node':>4} {'local':>5} | {'node group':<10} {'sum':>4} {'link MiB':>8} | "
        f"{'across':<10} {'sum':>4} {'link MiB':>8}"
    ]
    for r in rows:
        a, b = r["within"], r["across"]
        out.append(
            f"{r['rank']:>4} {r['node']:>4} {r['local']:>5} | {str(a['ranks']):<10} {a['sum']:>4.0f} "
            f"{a['link_mib']:>8.2f} | {str(b['ranks']):<10} {b['sum']:>4.0f} {b['link_mib']:>8.2f}"
        )
    return "\n".join(out)


def across_mib(nodes: int, per_node: int) -> float:
    """What a node's link sends while every group across the nodes all-reduces MESSAGE_MIB: each of its g ranks sends
    a ring's 2(N-1)/N of the message (two_level's cross all-reduce)."""
    op = tl.Op("all_reduce", "cross", MESSAGE_MIB)
    return op.link_bytes(tl.Layout(nodes, per_node))


def claims(rows: list[dict], nodes: int = 2, per_node: int = 2) -> list[Claim]:
    """Each all-reduce summed the ranks the numbering says (a node's: k*g..k*g+g-1; across: the same local rank on
    every node) and no other: the group lists the rows print are what new_group was given, so only the sums test
    them. The node group's all-reduce left the link idle (under 1% of the message:
    the barriers' few bytes), the one across put on each node's link what the ring predicts: at least that, and at
    most OVERHEAD more (the packets' headers and ACKs)."""
    printed = [r["rank"] for r in rows]
    if printed != list(range(nodes * per_node)):
        return [Claim(f"every one of the {nodes * per_node} ranks printed its groups (got ranks {printed})", False)]
    want_node = {r["rank"]: [r["node"] * per_node + i for i in range(per_node)] for r in rows}
    want_across = {r["rank"]: [r["local"] + k * per_node for k in range(nodes)] for r in rows}
    idle = max(r["within"]["link_mib"] for r in rows)
    carried = [r["across"]["link_mib"] for r in rows]
    expected = across_mib(nodes, per_node)
    return [
        Claim(
            f"each rank's all-reduce in its node group summed its node's {per_node} ranks only, and the one across its "
            f"local rank on each of the {nodes} nodes only",
            all(
                r["within"]["sum"] == sum(want_node[r["rank"]]) and r["across"]["sum"] == sum(want_across[r["rank"]])
                for r in rows
            ),
        ),
        Claim(
            f"the all-reduces inside the nodes left the links idle ({idle:.2f} MiB at most, of {MESSAGE_MIB:g} MiB "
            "all-reduced)",
            idle < 0.01 * MESSAGE_MIB,
        ),
        Claim(
            f"the ones across put {min(carried):.2f}-{max(carried):.2f} MiB on each node's link: its {per_node} ranks "
            f"each sent a ring's 2(N-1)/N of {MESSAGE_MIB:g} MiB ({expected / per_node:.2f} MiB), {expected:.2f} MiB "
            f"a node, plus the packets' headers and ACKs ({100 * (max(carried) / expected - 1):.1f}% more at most; "
            f"{100 * OVERHEAD:.0f}% allowed)",
            all(0.995 * expected <= c <= (1 + OVERHEAD) * expected for c in carried),
        ),
    ]
