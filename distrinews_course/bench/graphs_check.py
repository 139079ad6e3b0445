"""The CUDA-graphs path (--compile_mode reduce-overhead) end to end through the course's own scripts, as a user
runs them: the loss curve step by step against eager's, a run that resumes from its snapshot and goes on, and
train_ddp.py with it. On a GPU the graphs are recorded and replayed; on a CPU reduce-overhead only compiles, so
the same checks run there (CI) on the compiled path.

    python -m distrinews_course.bench.graphs_check --out graphs.json       # GPU: DistilBERT-tiny, bf16, NCCL

The curves come from each run's TensorBoard events (--report_to tensorboard: the loss of every optimizer step).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from distrinews_course import ROOT
from distrinews_course.launch import run_python, torchrun
from distrinews_course.plots import read_tensorboard

SCRIPTS = ROOT / "scripts"
# bf16 carries 8 bits of mantissa: two runs that round differently drift apart by about 1e-2 of the loss over a few
# steps (compiled kernels fuse and reorder operations); fp32 on a CPU drifts by far less.
TOLERANCE = {"cuda": 0.05, "cpu": 1e-3}


def no_dropout_tiny(folder: Path) -> str:
    """The tiny preset's model without dropout, saved as a local folder: compiled code draws its dropout masks from
    another generator than eager code, so only a model without dropout can show the same curve step by step."""
    from transformers import AutoModelForSequenceClassification, DistilBertConfig

    from distrinews_lib.data.tokenization import tiny_tokenizer
    from distrinews_lib.models.build import TINY_CONFIG

    if not (folder / "config.json").is_file():
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        torch.manual_seed(0)
        no_dropout = {**TINY_CONFIG, "dropout": 0.0, "attention_dropout": 0.0, "seq_classif_dropout": 0.0}
        AutoModelForSequenceClassification.from_config(DistilBertConfig(**no_dropout, num_labels=4)).save_pretrained(
            folder
        )
        tiny_tokenizer().save_pretrained(folder)
    return str(folder)


def common_args(out: Path, *, cuda: bool, steps: int, batch: int, max_length: int, model: str = "tiny") -> list:
    """Both runs pad to the widths the graphs path uses (a quarter of max_length), so they see the same tensors."""
    return [
        "--config", "single_gpu" if cuda else "cpu_smoke", "--model", model, "--data", "embedded",
        "--lr", "1e-3", "--epochs", "2", "--num_samples", str(steps * batch), "--eval_samples", "64",
        "--batch_size", str(batch), "--max_length", str(max_length), "--pad_multiple", str(max_length // 4),
        "--no-progress", "--report_to", "tensorboard", "--snapshot_every", "0", "--output", str(out),
        "--checkpoint", str(out / "model.pt"), "--threads", "1",
    ]  # fmt: skip


def step_losses(run_dir: Path) -> list:
    return [v for _, v in sorted(read_tensorboard(run_dir).get("train/loss_step", []))]


def check(out_dir: Path, *, steps: int = 6, batch: int = 16, max_length: int = 64, nproc: int | None = None) -> dict:
    """Eager and graphs runs of train_single.py (2 epochs of `steps` steps), a graphs run stopped after epoch 1 and
    resumed from its snapshot, and train_ddp.py with graphs on `nproc` processes (GPUs, else 2 gloo processes)."""
    cuda = torch.cuda.is_available()
    graphs = ["--compile_mode", "reduce-overhead"]
    nproc = nproc or (torch.cuda.device_count() if cuda else 2)
    res, t0 = {"device": "cuda" if cuda else "cpu", "steps_per_epoch": steps}, time.time()
    model = no_dropout_tiny(out_dir / "model")
    a = lambda name: common_args(  # noqa: E731
        out_dir / name, cuda=cuda, steps=steps, batch=batch, max_length=max_length, model=model
    )

    run_python(SCRIPTS / "train_single.py", a("eager"), timeout=900, echo=False)
    run_python(SCRIPTS / "train_single.py", [*a("graphs"), *graphs], timeout=900, echo=False)
    eager, compiled = step_losses(out_dir / "eager"), step_losses(out_dir / "graphs")
    diffs = [abs(x - y) for x, y in zip(eager, compiled)]
    res["loss_curve"] = {
        "eager": eager,
        "graphs": compiled,
        "max_abs_difference": max(diffs) if diffs else None,
        "tolerance": TOLERANCE[res["device"]],
        "same": bool(diffs) and len(eager) == len(compiled) == 2 * steps and max(diffs) <= TOLERANCE[res["device"]],
    }
    # resume: epoch 1 only, then the same command for 2 epochs with --resume auto continues from epoch 1's snapshot
    first = [*a("resumed"), *graphs]
    first[first.index("--epochs") + 1] = "1"
    run_python(SCRIPTS / "train_single.py", first, timeout=900, echo=False)
    out = run_python(SCRIPTS / "train_single.py", [*a("resumed"), *graphs, "--resume", "auto"], timeout=900, echo=False)
    m = json.loads((out_dir / "resumed" / "metrics.json").read_text())
    res["resume"] = {
        "epochs": [e["epoch"] for e in m["epochs"]],
        "said_resumed": "resum" in out.output.lower(),
        "ok": [e["epoch"] for e in m["epochs"]] == [1, 2] and (out_dir / "resumed" / "model.pt").is_file(),
    }
    backend = "nccl" if cuda else "gloo"
    ddp = torchrun(SCRIPTS / "train_ddp.py", nproc, [*a("ddp"), *graphs, "--backend", backend], timeout=900, echo=False)
    same = "parameters identical on all" in ddp.output and ": True" in ddp.output.split("parameters identical")[-1]
    res["ddp"] = {"processes": nproc, "backend": backend, "params_identical": same, "ok": same}
    res["ok"] = res["loss_curve"]["same"] and res["resume"]["ok"] and res["ddp"]["ok"]
    res["seconds"] = round(time.time() - t0, 1)
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--run_dir", default=None)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="graphs_") as tmp:
        res = check(Path(args.run_dir or tmp), steps=args.steps)
    Path(args.out).write_text(json.dumps(res, indent=1))
    print(
        f"graphs path on {res['device']}: loss curve max |eager - graphs| {res['loss_curve']['max_abs_difference']:.2g}"
        f" (tolerance {res['loss_curve']['tolerance']}), resume {res['resume']['ok']}, "
        f"DDP x{res['ddp']['processes']} {res['ddp']['backend']} {res['ddp']['ok']}: {'ok' if res['ok'] else 'FAILED'}"
    )
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
