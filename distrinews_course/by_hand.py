"""Chapter 03 (DDP by hand): what every rung of scripts/by_hand/ shares that is not data parallelism itself.

The models and real AG News batches the rungs train on, the process group with a short timeout (and a control
group for the rungs' one agreement: does every rank have every gradient?), a timeline of gradient-ready and
all-reduce events (for the Gantt charts), the ring's bytes per collective, the peak resident memory of a block of
code, and, for the notebook, the race's launcher, the plots and the exercise checker's entry points (the checker
itself: course/by_hand_check.py). The data-parallel code (broadcast, hooks, buckets, the sharded optimizer, the
sharded weights) stays in the scripts, in sight.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import threading
import time
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from distrinews_lib.errors import UserError

from . import ROOT
from .memory_probe import reset_peak, status_mb

SCRIPTS = ROOT / "scripts" / "by_hand"
RUNGS = ("naive", "flat", "overlapped", "bucketed", "zero1", "zero2", "zero3")
# The models the ladder trains (all on the same real AG News texts):
#   tiny  the course's classifier (DistilBERT dim 64, 2 layers, DistilBERT's 30,522-word vocabulary): 93% of its
#         gradient bytes are the word embedding, the gradient that backward produces LAST;
#   wide  a DistilBERT classifier with 4 layers of dim 128 over a 4,096-id hash vocabulary: its bytes are spread over
#         the layers, so buckets can leave while backward still runs (the overlap and timing model);
#   tied  a small GPT-2 whose LM head IS its token embedding: one parameter receives two gradient contributions;
#   twoheads  two equal heads on one trunk, computed in a rank-dependent order: each rank's gradients become ready in a
#         different order (what a launch in readiness order gets wrong); `unused` leaves head b out, on rank 1 or all.
MODELS = ("tiny", "wide", "tied", "twoheads")
SEQ_LEN = 64
HASH_VOCAB = 4096


def tokenizer_for(kind: str):
    from distrinews_lib.data.tokenization import HashTokenizer, tiny_tokenizer

    return tiny_tokenizer() if kind == "tiny" else HashTokenizer(HASH_VOCAB, "head", model_max_length=512)


class Output(dict):
    """A model's output as a dict (torch's DDP looks for the tensors in it) whose values read as attributes."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


class TwoHeads(torch.nn.Module):
    """A bag-of-words trunk and two heads of the same shape (1 MiB of weights each, so each fills a 1 MiB bucket):
    rank 0 computes head a first, rank 1 head b first, so backward completes their gradients in opposite orders.
    unused="rank1": rank 1 never uses head b; unused="all": no rank does."""

    def __init__(self, unused: str | None = None):
        super().__init__()
        self.embed = torch.nn.Embedding(HASH_VOCAB, 64)
        self.trunk = torch.nn.Linear(64, 256)
        self.head_a, self.head_b = torch.nn.Linear(256, 1024), torch.nn.Linear(256, 1024)
        self.unused = unused

    def forward(self, input_ids, attention_mask, labels):
        mask = attention_mask.unsqueeze(-1).to(self.embed.weight.dtype)
        h = torch.tanh(self.trunk((self.embed(input_ids) * mask).sum(1) / mask.sum(1).clamp(min=1)))
        rank = dist.get_rank() if dist.is_initialized() else 0
        heads = [self.head_a, self.head_b] if rank % 2 == 0 else [self.head_b, self.head_a]
        if self.unused == "all" or (self.unused == "rank1" and rank == 1):
            heads = [self.head_a]
        loss = sum(torch.nn.functional.cross_entropy(head(h), labels) for head in heads)
        return Output(loss=loss)


def build_model(kind: str, seed: int, unused: str | None = None):
    """A fresh model of `kind`, initialised from `seed` (`unused`: see TwoHeads)."""
    from transformers import DistilBertConfig, DistilBertForSequenceClassification, GPT2Config, GPT2LMHeadModel

    from distrinews_lib.models.build import TINY_CONFIG, quiet_transformers

    quiet_transformers()
    torch.manual_seed(seed)
    if kind == "tiny":
        cfg = DistilBertConfig(vocab_size=30522, num_labels=4, pad_token_id=0, **TINY_CONFIG)
        return DistilBertForSequenceClassification(cfg)
    if kind == "wide":
        cfg = DistilBertConfig(
            vocab_size=HASH_VOCAB,
            num_labels=4,
            pad_token_id=0,
            dim=128,
            n_layers=4,
            n_heads=4,
            hidden_dim=512,
            max_position_embeddings=SEQ_LEN,
            dropout=0.1,
        )
        return DistilBertForSequenceClassification(cfg)
    if kind == "tied":
        cfg = GPT2Config(
            vocab_size=HASH_VOCAB,
            n_positions=SEQ_LEN,
            n_embd=64,
            n_layer=2,
            n_head=2,
            n_inner=256,
            tie_word_embeddings=True,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
        )
        return GPT2LMHeadModel(cfg)
    if kind == "twoheads":
        return TwoHeads(unused)
    raise UserError(f"unknown model {kind!r}: choose one of {', '.join(MODELS)}")


def without_dropout(model):
    """Every dropout of `model` set to p=0 (chapter 06's memory model and scripts/memory_footprint.py, and the dialed
    race: its random masks are CPU work that moves no byte). Returns the model."""
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    return model


def step_seconds(kind: str, batch_size: int, dropout: bool = True, steps: int = 3) -> dict:
    """A step of a fresh `kind` model on `batch_size` real texts with no communication at all, on one thread (a
    rank's share of this machine): median seconds of its forward, backward and AdamW step, after a warm-up step."""
    model = build_model(kind, seed=0)
    if not dropout:
        without_dropout(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    times = {"forward": [], "backward": [], "optimizer": []}
    try:
        for batch in batches(kind, 0, 1, steps + 1, batch_size):
            t0 = time.perf_counter()
            loss = model(**batch).loss
            t1 = time.perf_counter()
            loss.backward()
            t2 = time.perf_counter()
            opt.step()
            opt.zero_grad(set_to_none=True)
            for part, t in zip(times, (t1 - t0, t2 - t1, time.perf_counter() - t2)):
                times[part].append(t)
    finally:
        torch.set_num_threads(threads)
    return {part: statistics.median(v[1:]) for part, v in times.items()}


def batches(kind: str, rank: int, world: int, steps: int, batch_size: int) -> list:
    """This rank's `steps` batches of real AG News texts (the embedded sample), disjoint from the other ranks'."""
    from distrinews_lib.data.sources import load_embedded
    from distrinews_lib.data.tokenization import encode_texts

    splits = load_embedded()
    n = steps * batch_size * world
    texts, labels = splits.train_texts[:n], splits.train_labels[:n]
    if len(texts) < n:
        raise UserError(f"{steps} steps x {batch_size} x {world} ranks need {n} texts; the sample has {len(texts)}")
    tok = tokenizer_for(kind)
    ids = encode_texts(tok, texts, SEQ_LEN, "head")
    out = []
    for s in range(steps):
        rows = [rank + world * (s * batch_size + i) for i in range(batch_size)]  # rank r takes every world-th text
        x = torch.zeros(batch_size, SEQ_LEN, dtype=torch.long)
        mask = torch.zeros(batch_size, SEQ_LEN, dtype=torch.long)
        for j, r in enumerate(rows):
            x[j, : len(ids[r])], mask[j, : len(ids[r])] = torch.tensor(ids[r]), 1
        if kind == "tied":  # next-token prediction on the same texts; padding is not predicted
            out.append({"input_ids": x, "attention_mask": mask, "labels": x.masked_fill(mask == 0, -100)})
        else:
            out.append({"input_ids": x, "attention_mask": mask, "labels": torch.tensor([labels[r] for r in rows])})
    return out


def parse_args(doc: str, argv=None):
    p = argparse.ArgumentParser(description=doc.strip().splitlines()[0])
    p.add_argument("--model", default="tiny", choices=MODELS)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch_size", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weight_decay", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--bucket_mb", type=float, default=1.0)
    p.add_argument("--timeout_s", type=float, default=30, help="a collective that waits longer fails (never a hang)")
    p.add_argument(
        "--no-broadcast",
        dest="broadcast",
        action="store_false",
        help="skip the broadcast of rank 0's initial weights (to see what goes wrong)",
    )
    return p.parse_args(argv)


def init(timeout_s: float = 30, store=None) -> tuple[int, int]:
    """Join the gloo process group torchrun set up (or meet in `store`), with a short timeout: a rank that skips a
    collective makes the others fail with a message after `timeout_s`, instead of hanging. Also makes the control
    group, whose timeout leaves room for a rank stuck that long in the default group to arrive."""
    from distrinews_lib.distributed import torchrun_env

    global _CONTROL
    rank, _, world, init_method = torchrun_env()
    torch.set_num_threads(1)  # one core per rank: the two ranks share a 2-core machine
    where = {"store": store} if store is not None else {"init_method": init_method}
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s), **where)
    _CONTROL = dist.new_group(backend="gloo", timeout=timedelta(seconds=2 * timeout_s + 5))
    return rank, world


_CONTROL = None  # the control group (init() makes it): see stop_unless_every_rank_has


def control_group():
    """A second process group for the rungs' small agreements. Its collectives never pair with the gradients' own,
    which may still be in flight (and unmatched) on the default group when something went wrong."""
    if _CONTROL is None:
        raise RuntimeError("by_hand.init() makes the control group: call it first")
    return _CONTROL


def stop_unless_every_rank_has(dp, missing) -> None:
    """Every rank says which of dp.params got no gradient in this step (`missing`); if any rank misses one, EVERY rank
    stops here with the same message, instead of one rank raising while the others wait in a collective it will
    never join (then crash when it exits). One all-reduce of a bit per rank and parameter, on the control group."""
    index = {id(p): i for i, p in enumerate(dp.params)}
    bits = torch.zeros(len(dp.params), dtype=torch.int64)
    for p in missing:
        bits[index[id(p)]] = 1 << dist.get_rank()  # the SUM of one distinct bit per rank is their OR
    dist.all_reduce(bits, group=control_group())
    holes = bits.nonzero().flatten().tolist()
    if holes:
        first = int(bits[holes[0]])
        ranks = [r for r in range(dist.get_world_size()) if first >> r & 1]
        more = f" (and {len(holes) - 1} more)" if len(holes) > 1 else ""
        raise UserError(
            f"an unused parameter: {dp.names[dp.params[holes[0]]]}{more} got no gradient in this step on "
            f"rank {', '.join(map(str, ranks))} of {dist.get_world_size()}: it took no part in the loss "
            "there. Every rank stops here. Use every parameter in forward on every rank (torch's DDP "
            "needs find_unused_parameters=True for a model that does not)."
        )


def one_dtype(params) -> torch.dtype:
    """The parameters' one dtype (a flat buffer holds one); a clear error for a model that mixes them."""
    dtypes = {p.dtype for p in params}
    if len(dtypes) != 1:
        raise UserError(f"the parameters mix dtypes {sorted(map(str, dtypes))}: one flat buffer holds one dtype")
    return dtypes.pop()


def layers(model) -> list:
    """The model's stack of transformer layers, in forward order (ZeRO-3's blocks); [] for a model without one."""
    for name in ("distilbert.transformer.layer", "transformer.h"):
        module = model
        for part in name.split("."):
            module = getattr(module, part, None)
        if isinstance(module, torch.nn.ModuleList):
            return list(module)
    return []


def first_tensor_needing_grad(out):
    """The first tensor in a module's output (a tensor, tuple, list or dict) that autograd will send a gradient to."""
    if torch.is_tensor(out):
        return out if out.requires_grad else None
    values = out.values() if isinstance(out, dict) else out if isinstance(out, (tuple, list)) else ()
    return next((t for t in map(first_tensor_needing_grad, values) if t is not None), None)


# Bytes each rank sends for one collective on a buffer of `nbytes` (the whole tensor, as every rank sees it), in the
# bandwidth-optimal ring: an all-reduce is a reduce-scatter then an all-gather, each moving (N-1)/N of the buffer.
RING_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
}


def wire_bytes(op: str, nbytes: int, world: int) -> float:
    """Bytes one rank sends for collective `op` on a buffer of `nbytes` among `world` ranks (a ring); 0 alone."""
    return 0.0 if world <= 1 else RING_FACTOR[op](world) * nbytes


class Timeline:
    """When, during one step, backward ran, each gradient became ready and each all-reduce ran (for the Gantt chart).

    Seconds since start(); an async all-reduce's end is when its future completed (gloo's thread calls back)."""

    def __init__(self):
        self.t0, self.events, self.on = time.perf_counter(), [], False

    def start(self, on: bool = True) -> None:
        self.t0, self.events, self.on = time.perf_counter(), [], on

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def ready(self, name: str) -> None:
        if self.on:
            self.events.append({"kind": "ready", "name": name, "t": self.now()})

    @contextmanager
    def span(self, kind: str, name: str = ""):
        t = self.now()
        yield
        if self.on:
            self.events.append({"kind": kind, "name": name, "start": t, "end": self.now()})

    def comm(self, work, name: str, nbytes: int):
        """Record an async collective: launched now, ended when its future completes. Returns the work to wait on
        (the same one, or one whose wait() runs once however many threads call it: see when_done)."""
        if self.on:
            event = {"kind": "comm", "name": name, "start": self.now(), "end": None, "bytes": nbytes}
            self.events.append(event)
            return when_done(work, lambda: event.__setitem__("end", self.now()))
        return work


class WaitOnce:
    """A work handle whose wait() runs the real one once, whichever thread calls it first; later calls wait for that
    one. gloo's reduce-scatter copies its result into the output inside wait(): a second wait, late in another thread,
    would copy it again over what the rung has since added to it (an accumulated gradient)."""

    def __init__(self, work):
        self.work, self._lock, self._done = work, threading.Lock(), False

    def wait(self, *args):
        with self._lock:
            if not self._done:
                self.work.wait(*args)
                self._done = True
        return True

    def is_completed(self) -> bool:
        return self._done

    def __getattr__(self, name):
        return getattr(self.work, name)


def when_done(work, callback):
    """callback() once `work` has completed: through its future, or (gloo's reduce-scatter has none) a thread that
    waits for it. Returns the handle the caller must wait on from now on: that thread and the caller share one wait."""
    try:
        future = work.get_future()
    except RuntimeError:
        once = work if isinstance(work, WaitOnce) else WaitOnce(work)

        def wait_then_call():
            try:
                once.wait()
            except Exception:  # noqa: BLE001  (a failed collective: whoever waits for it in the rung reports it)
                return
            callback()

        threading.Thread(target=wait_then_call, daemon=True).start()
        return once
    future.then(lambda fut: callback())
    return work


class PeakMemory:
    """This process's peak resident memory during a block of code, above its resident memory just before (Linux:
    VmHWM, reset through /proc/self/clear_refs; None elsewhere). Chapter 06's way of measuring (memory_footprint.py):
    settle_allocator() first, so that freed tensors go back to Linux instead of staying in glibc's heap."""

    def __enter__(self):
        import gc

        gc.collect()
        self.peak_mb = None
        try:
            self.before = status_mb("VmRSS")
        except OSError:  # no /proc: not Linux
            self.before = None
        if not reset_peak():
            self.before = None
        return self

    def __exit__(self, *exc):
        if self.before is not None:
            self.peak_mb = status_mb("VmHWM") - self.before
        return False


def settle_allocator() -> None:
    """glibc: every allocation of 128 KiB or more gets pages of its own, returned to Linux when freed (by default the
    threshold rises after the first large free, and freed tensors then stay resident in the heap)."""
    try:
        import ctypes

        ctypes.CDLL(None).mallopt(-3, 128 * 1024)  # M_MMAP_THRESHOLD (fixing it turns the dynamic threshold off)
    except (OSError, AttributeError):
        pass


def param_names(model) -> dict:
    return {p: n for n, p in model.named_parameters()}


def optimizer_state_bytes(optimizer) -> int:
    """Bytes of every tensor the optimizer keeps (AdamW: exp_avg and exp_avg_sq, and the step counters)."""
    return sum(t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t))


# ----------------------------------------------------------------------------------------------- the notebook side


def run_race(args: list, out_json, *, timeout: float = 300, echo: bool = False) -> dict:
    """Launch scripts/by_hand/race.py on 2 gloo ranks; returns its JSON. A failure raises LaunchError, whose message
    carries the script's own one-paragraph error (a wrong exercise, a rank that skipped a collective...)."""
    from .launch import LaunchError, torchrun

    out_json = Path(out_json)
    out_json.unlink(missing_ok=True)
    try:
        torchrun(
            SCRIPTS / "race.py",
            2,
            [*map(str, args), "--out", out_json],
            timeout=timeout,
            echo=echo,
            env={"OMP_NUM_THREADS": 1},
        )
    except LaunchError as err:
        # The scripts' own one-paragraph messages (main_guard); else the exception lines of the ranks' tracebacks.
        # A paragraph may start mid-line, after another rank's unfinished line on the same pipe.
        lines = [l[l.index("error: ") :] if "error: " in l else l for l in err.result.lines]
        errors = [
            l
            for i, l in enumerate(lines)
            if l.startswith("error:")
            or (l.startswith("       ") and i and lines[i - 1].startswith(("error:", "       ")))
        ]
        errors = errors or [l for l in lines if re.match(r"^(\[rank\d+\]: )?\w+(Error|Exception)\b", l)]
        raise LaunchError("\n".join(dict.fromkeys(errors[:12])) or str(err), err.result) from None
    return json.loads(out_json.read_text())


def plot_gantt(timelines: dict, save_to=None):
    """One row pair per rung: backward (and each gradient's ready time) above, the collectives below."""
    from .plots import _pyplot

    plt = _pyplot()
    fig, axes = plt.subplots(len(timelines), 1, figsize=(10, 1.3 * len(timelines) + 0.8), sharex=True, squeeze=False)
    for ax, (name, events) in zip(axes[:, 0], timelines.items()):
        for e in events:
            if e["kind"] == "backward":
                ax.barh(1, e["end"] - e["start"], left=e["start"], color="tab:blue", height=0.6)
            elif e["kind"] == "ready":
                ax.plot([e["t"]], [1], "|", color="black", markersize=10)
            elif e["kind"] in ("comm", "comm_sync") and e.get("end") is not None:
                ax.barh(
                    0,
                    e["end"] - e["start"],
                    left=e["start"],
                    color="tab:orange",
                    height=0.6,
                    alpha=0.6,
                    edgecolor="black",
                    linewidth=0.3,
                )
            elif e["kind"] == "step":
                ax.barh(1, e["end"] - e["start"], left=e["start"], color="tab:green", height=0.6)
        ax.set_yticks([0, 1], ["all-reduce", "backward"])
        ax.set_ylabel(name, rotation=0, ha="right", va="center")
    axes[-1, 0].set_xlabel("seconds since the step began (rank 0; ticks: a gradient is ready; green: optimizer step)")
    fig.suptitle("backward compute vs all-reduces, one step of the wide model")
    fig.tight_layout()
    if save_to:
        Path(save_to).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(save_to, dpi=110)
    return fig


def overlap_fraction(events: list) -> float:
    """Share of the all-reduce time that ran while backward was still computing."""
    back = [e for e in events if e["kind"] == "backward"]
    comms = [e for e in events if e["kind"] in ("comm", "comm_sync") and e.get("end") is not None]
    total = sum(e["end"] - e["start"] for e in comms)
    if not back or total <= 0:
        return 0.0
    b0, b1 = back[0]["start"], back[0]["end"]
    inside = sum(max(0.0, min(e["end"], b1) - max(e["start"], b0)) for e in comms)
    return inside / total


def launched_during_backward(events: list) -> tuple[int, int]:
    """(all-reduces launched before backward ended, all-reduces) in one step's timeline: a rung whose hooks launch
    them counts every one, whatever the machine's load (the time they then spend under backward does not)."""
    end = next(e["end"] for e in events if e["kind"] == "backward")
    comms = [e for e in events if e["kind"] == "comm"]
    return sum(e["start"] < end for e in comms), len(comms)


def rung_summary(res: dict, zero: dict | None = None) -> dict:
    """The benchmark's shape: {contender: {step_time_ratio_vs_ddp, max_weight_diff, collectives_per_step,
    peak_mb_per_rank, ...}} for every rung, and torch's FSDP2 when a race ran the zero section. `res` is a race's
    JSON (its check and timing sections); `zero` the zero section's, when another launch ran it (default: res)."""
    zero = zero or res
    sharding = (zero.get("sharding") or {}).get("contenders", {})
    timings = [t for t in (res.get("timing"), zero.get("zero_timing")) if t]
    out = {}
    for name in [*res["rungs"], *(["fsdp2"] if "fsdp2" in sharding else [])]:
        diffs = [res["check"][m][name]["max_weight_diff"] for m in res["check"] if name in res["check"][m]]
        if name == "fsdp2" and zero.get("zero_check"):
            diffs.append(zero["zero_check"]["max_weight_diff"])
        timed = next((t for t in timings if name in t["ratio_vs_ddp"]), None)
        s = sharding.get(name, {})
        peaks = s.get("peak_mb_per_rank") or []
        out[name] = {
            "step_time_ratio_vs_ddp": timed and timed["ratio_vs_ddp"][name],
            "max_weight_diff": max(diffs) if diffs else None,
            "collectives_per_step": timed and timed["collectives_per_step"][name],
            "peak_mb_per_rank": max(peaks) if peaks and None not in peaks else None,
            "timed_with_foreign_cores": timed and timed["foreign_cores"],
        }
        if s:
            out[name].update(
                {
                    "bytes_per_step": s["bytes_per_step"],
                    "calculator_mb": s["calculator_mb"],
                    "max_weight_diff_vs_fsdp2": s.get("max_weight_diff_vs_fsdp2"),
                }
            )
    return out
