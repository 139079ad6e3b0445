"""How scripts/memory_footprint.py measures one run: the run's name, its model and batches, the step loop that times
it, and the side measurements (FLOPs, recomputation's CPU price, DeepSpeed's gradient bytes). The script keeps what
chapter 06 is about: how each variant (DDP, ZeRO-1, FSDP2, DeepSpeed) wraps the model, and the fresh process a run
is measured in.

    from distrinews_course.memory_probe import parse_run
    parse_run("ddp@32x128+ckpt", batch=8, seq=64)   # {"variant": "ddp", "batch": 32, "seq": 128, "ckpt": True, ...}
"""

from __future__ import annotations

import gc
import re
import time

import torch

from distrinews_course.by_hand.models import without_dropout
from distrinews_course.proc_self import loss_of, nbytes
from distrinews_lib.data import batching, sources, tokenization
from distrinews_lib.data.texts import AG_NEWS_LABELS
from distrinews_lib.data.tokenization import tiny_tokenizer
from distrinews_lib.models.build import build_model
from distrinews_lib.training.config import RunConfig

VARIANTS = ("ddp", "zero1", "fsdp2_reshard_off", "fsdp2_reshard_on", "deepspeed_1", "deepspeed_2", "deepspeed_3")
RUN = re.compile(r"^(?P<variant>[a-z0-9_]+)(@(?P<batch>\d+)x(?P<seq>\d+))?(?P<flags>(\+(ckpt|view))*)(#\d+)?$")


def parse_run(text: str, batch: int, seq: int) -> dict:
    """A run's name, VARIANT[@BATCHxSEQ][+ckpt][+view][#K], read into its settings; a clear refusal otherwise."""
    m = RUN.match(text.strip())
    if not m or m["variant"] not in VARIANTS:
        raise SystemExit(
            f"memory_footprint.py: cannot read the run {text!r}; write VARIANT[@BATCHxSEQ][+ckpt][+view][#K] "
            f"with VARIANT one of {', '.join(VARIANTS)} (e.g. ddp@32x128+ckpt)"
        )
    flags = m["flags"].split("+")[1:]
    return {
        "name": text.strip(),
        "variant": m["variant"],
        "batch": int(m["batch"] or batch),
        "seq": int(m["seq"] or seq),
        "ckpt": "ckpt" in flags,
        "view": "view" in flags,
    }


def make_model(name: str, seed: int, ckpt: bool = False):
    """The course's tiny model, or DistilBERT-base's shape with random weights; dropout off, so that every variant
    computes the same thing and their final weights can be compared."""
    if name == "tiny":
        model = build_model(RunConfig(model="tiny", seed=seed), AG_NEWS_LABELS)[0]
    else:
        from transformers import AutoModelForSequenceClassification, DistilBertConfig

        torch.manual_seed(seed)
        model = AutoModelForSequenceClassification.from_config(DistilBertConfig(num_labels=4))
    without_dropout(model)
    if ckpt:
        recompute(model, True)
    return model


def recompute(model, on: bool) -> None:
    """Activation recomputation (gradient checkpointing) on or off for the model's layers."""
    if on:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_disable()


def tokenized(runs: list[dict], n: int):
    """The first `n` texts of the embedded AG News sample, tokenized to the longest run's length, and the pad id."""
    splits = sources.load_embedded()
    tok = tiny_tokenizer()
    longest = max(int(r["seq"]) for r in runs)
    ids = tokenization.tokenize_texts(splits.train_texts[:n], tok, longest)
    return tokenization.TokenizedDataset(ids, splits.train_labels[:n]), tok.pad_token_id


def batches(ds, pad_id, run, steps, rank, world) -> list:
    """This rank's share of the same global batches in every run of this shape: real AG News texts, fixed order,
    padded to exactly `seq` tokens (so that the sequence length is the one asked for)."""
    collate = batching.PadCollator(pad_id, pad_to_multiple_of=run["seq"])
    out = []
    for s in range(steps):
        start = (s * world + rank) * run["batch"]
        b = collate([ds[i % len(ds)] for i in range(start, start + run["batch"])])
        b["input_ids"], b["attention_mask"] = b["input_ids"][:, : run["seq"]], b["attention_mask"][:, : run["seq"]]
        out.append(b)
    return out


def step_loop(my_batches, forward_backward, opt_step):
    """Each step's wall seconds and this process's CPU seconds. With one compute thread, the CPU seconds are the work
    the step cost, which other programs sharing the cores hardly add to: they stretch its wall time."""
    times, cpu, saved = [], [], 0
    for i, batch in enumerate(my_batches):
        t, c = time.perf_counter(), time.process_time()
        saved_i, grads = forward_backward(batch, count=i == 0)
        saved = max(saved, saved_i)
        opt_step()
        times.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    return (times, cpu), saved, grads


def count_flops(model_name: str, seed: int, ckpt: bool, batch) -> int:
    """The FLOPs of one forward and backward, counted op by op (no step): what a step computes, which no other
    program on the machine can change (its time, they can). On a fresh copy of the model outside DDP: counting
    needs no collective, so no rank can wait for another."""
    from torch.utils.flop_counter import FlopCounterMode

    copy = make_model(model_name, seed, ckpt)
    with FlopCounterMode(display=False) as counter:
        loss_of(copy, batch).backward()
    return counter.get_total_flops()


def paired_cpu_ratios(model_name: str, seed: int, batch, pairs: int = 5) -> list:
    """Recomputation's price in CPU seconds, measured in pairs: on a fresh copy of the model (outside DDP, as
    count_flops), a forward and backward without recomputation, then one with it, `pairs` times over after one pair
    that warms both paths up; each pair's ratio. Other programs on the cores slow both halves of a pair alike, where
    two runs one after the other can meet different loads (chapter 06 once read 0.97x from such a pair of runs)."""
    model = make_model(model_name, seed)
    model.train()  # recomputation applies in training only
    ratios = []
    for k in range(pairs + 1):
        cpu = []
        for on in (False, True):
            recompute(model, on)
            model.zero_grad(set_to_none=True)
            c = time.process_time()
            loss_of(model, batch).backward()
            cpu.append(time.process_time() - c)
        if k:
            ratios.append(cpu[1] / cpu[0])
    return ratios


def ds_gradient_bytes(opt, params) -> int:
    """The gradients DeepSpeed holds between backward and step: full .grad tensors (stage 1 keeps them
    until the step) plus its reduced, partitioned gradient buffers (stages 2 and 3), counted once each."""
    seen, total = set(), 0
    tensors = [p.grad for p in params]
    for holder in ("averaged_gradients", "_DeepSpeedZeroOptimizer_Stage3__param_id_to_grad_partition"):
        found = getattr(opt, holder, None) or {}
        for value in found.values() if isinstance(found, dict) else found:
            tensors += value if isinstance(value, (list, tuple)) else [value]
    for t in tensors:
        if torch.is_tensor(t) and t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += nbytes(t)
    return total


def settle_allocator() -> None:
    """glibc: every allocation of 128 KiB or more gets pages of its own, returned to Linux when freed. By default
    glibc raises that threshold after the first large free, and later tensors then come from a heap that keeps
    freed memory resident: the process's resident memory would count memory no tensor holds any more."""
    try:
        import ctypes

        ctypes.CDLL(None).mallopt(-3, 128 * 1024)  # M_MMAP_THRESHOLD (fixing it turns the dynamic threshold off)
    except (OSError, AttributeError):
        pass


def warm_up(model_name: str, seed: int, lr: float, template, ds, pad_id) -> None:
    """One tiny step (2 examples of 8 tokens) in the parent, so that no child pays, in its peak, for the pages of
    code and the one-time set-ups the first forward, backward and AdamW step touch."""
    for ckpt in (False, True):
        model = make_model(model_name, seed, ckpt)
        model.load_state_dict(template)
        opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
        (batch,) = batches(ds, pad_id, {"batch": 2, "seq": 8}, 1, 0, 1)
        loss_of(model, batch).backward()
        opt.step()
        del model, opt
    gc.collect()
