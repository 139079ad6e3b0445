"""Chapter 03 (DDP by hand): what every rung of scripts/by_hand/ shares that is not data parallelism itself.

The models and real AG News batches the rungs train on, the process group with a short timeout, a timeline of
gradient-ready and all-reduce events (for the Gantt charts), and, for the notebook, the exercise checker and the
plots. The data-parallel code (broadcast, hooks, buckets, the sharded optimizer) stays in the scripts, in sight.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from ..errors import UserError

SCRIPTS = Path(__file__).resolve().parent.parent.parent / "scripts" / "by_hand"
RUNGS = ("naive", "flat", "overlapped", "bucketed", "zero1")
# The models the ladder trains (all on the same real AG News texts):
#   tiny  the course's classifier (DistilBERT dim 64, 2 layers, DistilBERT's 30,522-word vocabulary): 93% of its
#         gradient bytes are the word embedding, the gradient that backward produces LAST;
#   wide  a DistilBERT classifier with 4 layers of dim 128 over a 4,096-id hash vocabulary: its bytes are spread over
#         the layers, so buckets can leave while backward still runs (the overlap and timing model);
#   tied  a small GPT-2 whose LM head IS its token embedding: one parameter receives two gradient contributions.
MODELS = ("tiny", "wide", "tied")
SEQ_LEN = 64
HASH_VOCAB = 4096


def tokenizer_for(kind: str):
    from ..data.tokenization import HashTokenizer, tiny_tokenizer

    return tiny_tokenizer() if kind == "tiny" else HashTokenizer(HASH_VOCAB, "head", model_max_length=512)


def build_model(kind: str, seed: int):
    """A fresh model of `kind`, initialised from `seed`."""
    from transformers import DistilBertConfig, DistilBertForSequenceClassification, GPT2Config, GPT2LMHeadModel

    from ..models.build import TINY_CONFIG, quiet_transformers

    quiet_transformers()
    torch.manual_seed(seed)
    if kind == "tiny":
        cfg = DistilBertConfig(vocab_size=30522, num_labels=4, pad_token_id=0, **TINY_CONFIG)
        return DistilBertForSequenceClassification(cfg)
    if kind == "wide":
        cfg = DistilBertConfig(vocab_size=HASH_VOCAB, num_labels=4, pad_token_id=0, dim=128, n_layers=4, n_heads=4,
                               hidden_dim=512, max_position_embeddings=SEQ_LEN, dropout=0.1)
        return DistilBertForSequenceClassification(cfg)
    if kind == "tied":
        cfg = GPT2Config(vocab_size=HASH_VOCAB, n_positions=SEQ_LEN, n_embd=64, n_layer=2, n_head=2, n_inner=256,
                         tie_word_embeddings=True, pad_token_id=0, bos_token_id=1, eos_token_id=2)
        return GPT2LMHeadModel(cfg)
    raise UserError(f"unknown model {kind!r}: choose one of {', '.join(MODELS)}")


def batches(kind: str, rank: int, world: int, steps: int, batch_size: int) -> list:
    """This rank's `steps` batches of real AG News texts (the embedded sample), disjoint from the other ranks'."""
    from ..data.sources import load_embedded
    from ..data.tokenization import encode_texts

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
            x[j, :len(ids[r])], mask[j, :len(ids[r])] = torch.tensor(ids[r]), 1
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
    p.add_argument("--no-broadcast", dest="broadcast", action="store_false",
                   help="skip the broadcast of rank 0's initial weights (to see what goes wrong)")
    return p.parse_args(argv)


def init(timeout_s: float = 30) -> tuple[int, int]:
    """Join the gloo process group torchrun set up, with a short timeout: a rank that skips a collective makes the
    others fail with a message after `timeout_s`, instead of hanging."""
    from ..distributed import torchrun_env

    rank, _, world, init_method = torchrun_env()
    torch.set_num_threads(1)  # one core per rank: the two ranks share a 2-core machine
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout_s))
    return rank, world


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
        """Record an async collective: launched now, ended when its future completes. Returns the work."""
        if self.on:
            event = {"kind": "comm", "name": name, "start": self.now(), "end": None, "bytes": nbytes}
            self.events.append(event)
            work.get_future().then(lambda fut: event.__setitem__("end", self.now()))
        return work


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
        torchrun(SCRIPTS / "race.py", 2, [*map(str, args), "--out", out_json], timeout=timeout, echo=echo,
                 env={"OMP_NUM_THREADS": 1})
    except LaunchError as err:
        # The scripts' own one-paragraph messages (main_guard); else the exception lines of the ranks' tracebacks.
        # A paragraph may start mid-line, after another rank's unfinished line on the same pipe.
        lines = [l[l.index("error: "):] if "error: " in l else l for l in err.result.lines]
        errors = [l for i, l in enumerate(lines) if l.startswith("error:")
                  or (l.startswith("       ") and i and lines[i - 1].startswith(("error:", "       ")))]
        errors = errors or [l for l in lines if re.match(r"^(\[rank\d+\]: )?\w+(Error|Exception)\b", l)]
        raise LaunchError("\n".join(dict.fromkeys(errors[:12])) or str(err), err.result) from None
    return json.loads(out_json.read_text())


def is_blank(path) -> bool:
    """True while an exercise file still holds the blank (the learner has not written the code yet)."""
    return "raise NotImplementedError" in Path(path).read_text()


def check_exercise(rung: str, path, out_dir="outputs/by_hand", *, timeout: float = 180) -> dict | None:
    """Run rung `rung` with the function written in `path` instead of the script's own, on the tiny and the tied
    model, against torch's DDP: prints which parameter first differs at which step, or that every weight is equal.
    Returns the race's JSON (None while the exercise is blank). Raises AssertionError with the reason when the
    learner's code fails or differs."""
    from .launch import LaunchError

    if is_blank(path):
        print(f"{path}: still the blank (raise NotImplementedError). Write your code in the cell above, run it, "
              "then run this cell again.")
        return None
    out = Path(out_dir) / f"exercise_{rung}.json"
    try:
        res = run_race(["--rungs", rung, "--exercise", f"{rung}:{path}", "--check_only", "--timeout_s", 20], out,
                       timeout=timeout)
    except LaunchError as err:
        raise AssertionError(f"your {rung} code did not run to the end:\n{err}") from None
    problems = []
    for model, rungs in res["check"].items():
        r = rungs[rung]
        if r["first_diff"]:
            d = r["first_diff"]
            problems.append(f"{model} model: step {d['step']}, parameter {d['param']} differs from torch's DDP by "
                            f"{d['diff']:.3g} (every earlier step was equal)" if d["step"] > 1 else
                            f"{model} model: already at step 1, parameter {d['param']} differs by {d['diff']:.3g}")
        else:
            print(f"{model:>5} model: {res['steps']} steps, every weight equal to torch's DDP "
                  f"(max difference {r['max_weight_diff']:.3g}), {r['allreduces_per_step']:.0f} collectives per step")
    if problems:
        raise AssertionError(f"your {rung} code trains, but not like torch's DDP:\n  " + "\n  ".join(problems))
    return res


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
                ax.barh(0, e["end"] - e["start"], left=e["start"], color="tab:orange", height=0.6, alpha=0.6,
                        edgecolor="black", linewidth=0.3)
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


def rung_summary(res: dict) -> dict:
    """The benchmark's shape: {rung: {step_time_ratio_vs_ddp, max_weight_diff, allreduces_per_step}}."""
    out = {}
    for rung in res["rungs"]:
        diffs = [res["check"][m][rung]["max_weight_diff"] for m in res["check"] if rung in res["check"][m]]
        out[rung] = {"step_time_ratio_vs_ddp": res["timing"]["ratio_vs_ddp"][rung], "max_weight_diff": max(diffs),
                     "allreduces_per_step": res["timing"]["collectives_per_step"][rung]}
    return out
