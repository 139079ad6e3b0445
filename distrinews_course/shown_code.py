"""Lines of the course's scripts that a chapter shows as they are: read from the files each time, never retyped, so
the page cannot drift from the code its runs ran.

    print(shown_code.lines_of(shown_code.SHARDING_WRAPPERS))  # chapter 06: the four memory wrappers
    print(shown_code.lines_of(shown_code.ZERO2_CHANGES))  # chapter 03: what ZeRO-2 changes in the bucketed rung
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# chapter 06: (file, a string the line holds) for each wrapper its runs use, in the order the chapter teaches them
SHARDING_WRAPPERS = [
    ("scripts/memory_footprint.py", "DDP(model, gradient_as_bucket_view="),
    ("scripts/memory_footprint.py", "ZeroRedundancyOptimizer(params, optimizer_class="),
    ("scripts/memory_footprint.py", "for layer in model.distilbert.transformer.layer:"),
    ("scripts/memory_footprint.py", "fully_shard(layer, mesh=mesh, reshard_after_forward="),
    ("scripts/memory_footprint.py", "fully_shard(model, mesh=mesh, reshard_after_forward="),
    ("distrinews_course/memory_probe.py", "model.gradient_checkpointing_enable("),
]

# chapter 03: ZeRO-2 as the lines it changes in the bucketed rung: bucketed's all-reduce, then what zero2.py does
ZERO2_CHANGES = [
    ("scripts/by_hand/bucketed.py", "work = dist.all_reduce(flat, async_op=True)"),
    ("scripts/by_hand/zero2.py", "return torch.optim.AdamW(self.shards"),
    ("scripts/by_hand/zero2.py", "for p in self.buckets[i]:"),
    ("scripts/by_hand/zero2.py", "p.grad = None  # from now on"),
    ("scripts/by_hand/zero2.py", "mine = torch.empty(self.shard_sizes[i]"),
    ("scripts/by_hand/zero2.py", "work = dist.reduce_scatter_tensor(mine, flat"),
    ("scripts/by_hand/zero2.py", "dist.all_gather_into_tensor(everyone, mine)"),
]


def lines_of(anchors, root: Path = ROOT) -> str:
    """Each anchor's line (the first line of its file that holds it), stripped of its indent (a line after one that
    opens a block keeps one level), under a `# file` line wherever the file changes. A missing anchor is a ValueError
    naming it: a script that no longer makes the call fails the chapter instead of showing code its runs do not run."""
    out, last = [], None
    for rel, anchor in anchors:
        hit = next((line for line in (Path(root) / rel).read_text().splitlines() if anchor in line), None)
        if hit is None:
            raise ValueError(f"{rel} has no line with {anchor!r}: the code shown would not be the code run")
        if rel != last:
            out.append(f"# {rel}")
            last = rel
        out.append(("    " if out[-1].endswith(":") else "") + hit.strip())
    return "\n".join(out)
