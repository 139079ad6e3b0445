"""Chapter 11's language models, measured: the validation perplexity before training and after each epoch, the
time per epoch, for the causal and the masked LM, trained by scripts/train_ddp.py on N processes.

    python scripts/bench_lm.py                 # benchmarks/lm.json (clm and mlm, 2 processes, the chapter's settings)
    python scripts/bench_lm.py --quick         # a few blocks, outputs/bench/lm_quick.json (CI keeps it working)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from distrinews_course.bench.provenance import provenance  # noqa: E402
from distrinews_course.launch import torchrun  # noqa: E402
from distrinews_course.plots import load_metrics  # noqa: E402
from distrinews_lib import plan  # noqa: E402
from distrinews_lib.training import config, evaluation  # noqa: E402


def measure(task: str, args, out_dir: Path) -> dict:
    flags = [
        "--config",
        "cpu_smoke",
        "--task",
        task,
        "--epochs",
        args.epochs,
        "--num_samples",
        args.samples,
        "--eval_samples",
        args.eval_samples,
        "--batch_size",
        args.batch,
        "--lr",
        args.lr,
        "--threads",
        1,
        "--no-progress",
    ]
    cfg = config.parse("bench_lm", [str(f) for f in flags + ["--output", out_dir, "--resume", "off"]], ddp=True)
    run = plan.prepare(plan.decide(cfg), log=lambda *a: None)
    loader = torch.utils.data.DataLoader(run.val_ds, batch_size=128, collate_fn=run.val_ds.collator_for(None))
    initial = evaluation.evaluate(run.model, loader, device=torch.device("cpu"), task=run.task)
    start = time.time()
    torchrun(
        REPO / "scripts" / "train_ddp.py",
        args.nproc,
        [*flags, "--output", out_dir, "--checkpoint", out_dir / "m.pt"],
        echo=False,
        timeout=1800,
        cwd=REPO,
    )
    m = load_metrics(out_dir)
    ppl = [initial.perplexity] + [e["val_perplexity"] for e in m["epochs"]]
    return {
        "task": task,
        "model": m["model"]["resolved"],
        "parameters": m["model"]["num_parameters"],
        "vocabulary": len(run.tokenizer),
        "train_blocks": len(run.train_ds),
        "val_blocks": len(run.val_ds),
        "block_size": cfg.block_size,
        "processes": args.nproc,
        "perplexity_by_epoch": ppl,
        "drop": ppl[0] / ppl[-1],
        "epoch_time_s": [e["epoch_time_s"] for e in m["epochs"]],
        "launch_wall_s": round(time.time() - start, 1),
        "data": m["data"]["title"],
        "flags": [str(f) for f in flags],
    }


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--tasks", default="clm,mlm")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--samples", type=int, default=4000)
    p.add_argument("--eval_samples", type=int, default=500)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if args.quick:
        args.epochs, args.samples, args.eval_samples = 1, 200, 60
    out = Path(args.out) if args.out else REPO / ("outputs/bench/lm_quick.json" if args.quick else "benchmarks/lm.json")
    result = {"benchmark": "lm", **provenance(), "quick": args.quick, "settings": vars(args), "runs": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for task in args.tasks.split(","):
            result["runs"][task] = r = measure(task, args, Path(tmp) / task)
            print(
                f"{task}: perplexity {' -> '.join(f'{x:.0f}' for x in r['perplexity_by_epoch'])} ({r['drop']:.0f}x), "
                f"{', '.join(f'{t:.1f}' for t in r['epoch_time_s'])} s per epoch, {args.nproc} processes",
                flush=True,
            )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, default=str))
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
