"""Every rung of scripts/by_hand/ as a learner's own script uses it: after a bare dist.init_process_group("gloo", ...),
in 2 processes (chapter 08's two-level rungs in 4: 2 nodes x 2 ranks, the layout given to the rung), on the edge cases
where a hand-built DDP goes wrong, each against torch's DistributedDataParallel from the same start on the same
batches.

    python tests/workers/rung_cases.py --out cases.json [--rungs naive,zero3] [--families frozen,dtype]

Each case runs in a fresh group of processes (forked from this one, which has imported torch and nothing more), which
meet in a FileStore and call init_process_group themselves: a case that leaves a collective unmatched cannot touch
the next, and a rank that never returns is killed after --timeout_s and reported as hung. Per case the JSON gives
each rank's end: "equal" (the largest weight difference from torch's DDP, and whether it is 0), "refused" (the
exception's type and message) or "crashed"/"hung".
"""

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch._dynamo  # noqa: F401  (DDP imports it on first use: 2 s in every forked child, once here)
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts" / "by_hand"
sys.path.insert(0, str(SCRIPTS))  # zero2.py imports bucketed.py's rule, hsdp.py zero3.py, as run as scripts
sys.path.insert(0, str(ROOT))
from distrinews_course.by_hand import rung_class  # noqa: E402
from distrinews_lib.errors import UserError  # noqa: E402

MODS = {}  # rung -> its module, loaded once here, before the children fork
RUNGS = ("naive", "flat", "overlapped", "bucketed", "zero1", "zero2", "zero3")
TWO_LEVEL = ("hierarchical", "hsdp")  # 2 nodes x 2 ranks: 4 processes
PER_NODE = 2
STEPS, BATCH, TOKENS, VOCAB, DIM = 3, 8, 6, 257, 11  # odd sizes: no flat buffer, bucket or block splits evenly in 2


class Output(dict):
    def __getattr__(self, name):
        return self[name]


class Small(torch.nn.Module):
    """An embedding, a stack of layers where ZeRO-3 looks for them (transformer.h: one block each) and two heads of
    the same shape. order: rank 1 computes head b before head a, so its gradients become ready in another order.
    unused: head b takes no part in the loss on every step ("all"), from the second step on ("from2"), or on rank 1
    only ("rank1"). frozen: the embedding and the first layer's bias need no gradient."""

    def __init__(self, unused=None, order=False, frozen=False):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, DIM)
        self.transformer = torch.nn.Module()
        self.transformer.h = torch.nn.ModuleList([torch.nn.Linear(DIM, DIM) for _ in range(2)])
        self.head_a, self.head_b = torch.nn.Linear(DIM, 4), torch.nn.Linear(DIM, 4)
        self.unused, self.order, self.calls = unused, order, 0
        if frozen:
            self.embed.weight.requires_grad_(False)
            self.transformer.h[0].bias.requires_grad_(False)

    def forward(self, input_ids, labels):
        self.calls += 1
        h = self.embed(input_ids).mean(1)
        for layer in self.transformer.h:
            h = torch.tanh(layer(h))
        rank = dist.get_rank()
        heads = [self.head_b, self.head_a] if self.order and rank == 1 else [self.head_a, self.head_b]
        skip = (
            self.unused == "all"
            or (self.unused == "from2" and self.calls > 1)
            or (self.unused == "rank1" and rank == 1)
        )
        if skip:
            heads = [self.head_a]
        return Output(loss=sum(torch.nn.functional.cross_entropy(head(h), labels) for head in heads))


# family -> [(case, model options, run options)]; run options: dtype, bucket_mb, micro (backward passes per step)
FAMILIES = {
    "frozen": [("frozen", {"frozen": True}, {})],
    "buckets": [
        ("bucket 0 MiB", {}, {"bucket_mb": 0.0}),
        ("bucket smaller than a parameter", {}, {"bucket_mb": 1e-5}),
        ("buckets mixing sizes", {}, {"bucket_mb": 0.005}),
    ],
    "uneven": [("odd number of elements", {}, {})],
    "unused": [
        ("unused on every step", {"unused": "all"}, {}),
        ("unused from step 2 on", {"unused": "from2"}, {}),
        ("unused on rank 1 only", {"unused": "rank1"}, {}),
    ],
    "dtype": [("float64", {}, {"dtype": "float64"}), ("bfloat16", {}, {"dtype": "bfloat16"})],
    "accumulation": [("two backward passes per step", {}, {"micro": 2})],
    "order": [("gradients ready in another order per rank", {"order": True}, {})],
    # the two-level rungs only: a world that does not split into nodes, and ranks that disagree on the layout
    "layout": [
        ("4 ranks in nodes of 3", {}, {"ranks_per_node": 3}),
        ("the ranks disagree on the layout", {}, {"ranks_per_node": "rank0:4"}),
    ],
}
BUCKETS = {"buckets"}  # families about bucket sizes: the rungs that have buckets (not the two-level ones)
LAYOUT = {"layout"}  # families about the node layout: the two-level rungs only


def load(rung):
    spec = importlib.util.spec_from_file_location(f"rung_{rung}", SCRIPTS / f"{rung}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def batches(rank, micro):
    g = torch.Generator().manual_seed(1000 + rank)  # each rank its own texts
    out = []
    for _ in range(STEPS):
        x, y = torch.randint(0, VOCAB, (BATCH, TOKENS), generator=g), torch.randint(0, 4, (BATCH,), generator=g)
        out.append([{"input_ids": x[k::micro], "labels": y[k::micro]} for k in range(micro)])
    return out


def train(model, step, data):
    for parts in data:
        for part in parts:
            model(**part).loss.backward()
        step()


def run_case(rung, model_kw, run_kw):
    """This rank's end of one case: torch's DDP, then the rung, from the same start on the same batches."""
    rank = dist.get_rank()
    dtype = getattr(torch, run_kw.get("dtype", "float32"))
    data = batches(rank, run_kw.get("micro", 1))
    bucket_mb = run_kw.get("bucket_mb", 0.001)  # a few buckets on this small model by default

    def fresh():
        torch.manual_seed(0)  # the same start on every rank and for both
        return Small(**model_kw).to(dtype)

    ref = fresh()
    ddp = DDP(ref, bucket_cap_mb=bucket_mb, find_unused_parameters=bool(model_kw.get("unused")))
    opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.01)

    def ddp_step():
        opt.step()
        opt.zero_grad(set_to_none=True)

    train(ddp, ddp_step, data)
    want = [p.detach().clone() for p in ref.parameters()]
    model = fresh()
    try:
        kw = {}
        if rung in TWO_LEVEL:
            per_node = run_kw.get("ranks_per_node", PER_NODE)
            if isinstance(per_node, str):  # "rank0:4": rank 0 says 4, the others the default
                per_node = int(per_node.split(":")[1]) if rank == 0 else PER_NODE
            kw["ranks_per_node"] = per_node
        dp = rung_class(MODS[rung], rung)(model, bucket_mb, **kw)
        optimizer = dp.optimizer(1e-2, 0.01)
        train(model, lambda: dp.step(optimizer), data)
        got = dp.full_weights() if hasattr(dp, "full_weights") else [p.detach() for p in model.parameters()]
    except UserError as err:
        return {"end": "refused", "type": type(err).__name__, "message": " ".join(str(err).split())}
    except Exception as err:  # noqa: BLE001  (anything else is the finding)
        return {
            "end": "crashed",
            "type": type(err).__name__,
            "message": str(err)[:300],
            "where": traceback.format_exc()[-600:],
        }
    diff = max(float((a.double() - b.double()).abs().max()) for a, b in zip(got, want))
    out = {"end": "equal", "max_diff": diff, "dtypes": sorted({str(t.dtype) for t in got})}
    if hasattr(dp, "buckets"):  # the bucket rungs: their buckets against torch's DDP's rule at the same cap
        order = list(reversed(dp.params))
        rule, _ = dist._compute_bucket_assignment_by_size(order, [int(bucket_mb * 2**20)], [False] * len(order))
        out["buckets"] = [[dp.names[p] for p in b] for b in dp.buckets]
        out["ddp_rule"] = [[dp.names[order[i]] for i in b] for b in rule]
    return out


def child(rank, world, store, out, rung, model_kw, run_kw, timeout_s):
    code = 0
    try:
        torch.set_num_threads(1)
        dist.init_process_group(
            "gloo", init_method=f"file://{store}", rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s)
        )
        res = run_case(rung, model_kw, run_kw)
        Path(out).write_text(json.dumps(res))
    except BaseException as err:  # noqa: BLE001
        Path(out).write_text(json.dumps({"end": "crashed", "type": type(err).__name__, "message": str(err)[:300]}))
        code = 1
    finally:
        os._exit(code)  # no interpreter teardown in a forked child: gloo's threads would race it


def run_group(rung, model_kw, run_kw, timeout_s, scratch):
    world = 2 * PER_NODE if rung in TWO_LEVEL else 2
    store, outs = Path(tempfile.mktemp(dir=scratch)), [Path(tempfile.mktemp(dir=scratch)) for _ in range(world)]
    pids = []
    for rank in range(world):
        pid = os.fork()
        if pid == 0:
            child(rank, world, store, outs[rank], rung, model_kw, run_kw, timeout_s)
        pids.append(pid)
    deadline, ends = time.monotonic() + 3 * timeout_s, [None] * world
    while time.monotonic() < deadline and not all(ends):
        for i, pid in enumerate(pids):
            if ends[i] is None and os.waitpid(pid, os.WNOHANG)[0]:
                ends[i] = json.loads(outs[i].read_text()) if outs[i].exists() else {"end": "crashed", "type": "exit"}
        time.sleep(0.02)
    for i, pid in enumerate(pids):
        if ends[i] is None:  # never returned: killed, and said so
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            ends[i] = {"end": "hung"}
    store.unlink(missing_ok=True)
    return ends


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--rungs", default=",".join(RUNGS + TWO_LEVEL))
    p.add_argument("--families", default=",".join(FAMILIES))
    p.add_argument("--timeout_s", type=float, default=20)
    args = p.parse_args()
    MODS.update({rung: load(rung) for rung in args.rungs.split(",")})
    results, t0 = [], time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        for family in args.families.split(","):
            for case, model_kw, run_kw in FAMILIES[family]:
                for rung in args.rungs.split(","):
                    if (family in BUCKETS and rung in TWO_LEVEL) or (family in LAYOUT and rung not in TWO_LEVEL):
                        continue
                    ranks = run_group(rung, model_kw, run_kw, args.timeout_s, scratch)
                    results.append({"family": family, "case": case, "rung": rung, "ranks": ranks})
    Path(args.out).write_text(json.dumps({"seconds": time.perf_counter() - t0, "cases": results}, indent=1))


if __name__ == "__main__":
    main()
