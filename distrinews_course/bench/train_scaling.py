"""bench_train's ddp section: 1 vs N processes on the same global batch and steps, in ONE torchrun launch of the
entry script's --ddp-worker. World-1 contenders run train_single.py on rank 0 (harness.alone()) while the other
ranks wait; world-N contenders run train_ddp.py on every rank, with a DDP communication hook that times each
bucket's all-reduce. The parent side builds the contenders, launches and summarises; ddp_worker is each rank."""

from __future__ import annotations

import contextlib
import gc
import io
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from distrinews_lib.data.texts import AG_NEWS_LABELS
from distrinews_lib.errors import UserError
from distrinews_lib.models.build import build_model
from distrinews_lib.training import flops, precision
from distrinews_lib.training.config import RunConfig

from . import harness, provenance, throughput, timing
from .train_measure import DDP_SCRIPT, REPO, SINGLE, run_script
from .train_setup import materialise_model, parse_argv, script_argv
from .train_stats import fmt, paired, rotate, summarise


def ddp_configs(plan: dict, nproc: int) -> list:
    """Contenders of the DDP launch: for every global batch G, G on 1 process (train_single.py) and G/N on each
    of N processes (train_ddp.py); plus DDP knobs on the first global batch."""
    out = []
    for gi, g in enumerate(plan["global_batches"]):
        if g % nproc:
            raise UserError(
                f"global batch {g} is not divisible by {nproc} processes; pick --ddp_nproc that divides it."
            )
        steps = plan["steps"][gi] if isinstance(plan["steps"], (list, tuple)) else plan["steps"]
        common = dict(global_batch=g, steps=steps, warmup=plan["warmup"], flags=[])
        out.append(dict(common, name=f"G{g} x1 (train_single.py)", world=1, batch_per_rank=g))
        out.append(dict(common, name=f"G{g} x{nproc}", world=nproc, batch_per_rank=g // nproc))
        if plan.get("knobs") and gi == 0:
            for flag in ("--bucket_cap_mb 1", "--no-gradient_as_bucket_view"):
                out.append(
                    dict(
                        out[-1] if flag.startswith("--bucket") else out[-2],
                        name=f"G{g} x{nproc} {flag}",
                        flags=flag.split(),
                    )
                )
    return out


# The in-process contenders get ONE GPU: with several visible, Trainer would wrap the model in
# nn.DataParallel over all of them. main() narrows CUDA_VISIBLE_DEVICES before anything touches CUDA;
# the DDP section's launch gets the original set back.
ORIGINAL_CUDA_VISIBLE_DEVICES = os.environ.get("CUDA_VISIBLE_DEVICES")


def one_gpu_for_this_process() -> None:
    os.environ["CUDA_VISIBLE_DEVICES"] = (ORIGINAL_CUDA_VISIBLE_DEVICES or "0").split(",")[0]


class original_cuda_devices:
    """Child processes started inside this block see every GPU this script was given (not just the first)."""

    def __enter__(self):
        self.saved = os.environ.get("CUDA_VISIBLE_DEVICES")
        _set_cuda_visible(ORIGINAL_CUDA_VISIBLE_DEVICES)

    def __exit__(self, *exc):
        _set_cuda_visible(self.saved)


def _set_cuda_visible(value):
    if value is None:
        os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    else:
        os.environ["CUDA_VISIBLE_DEVICES"] = value


def all_gpu_count() -> int:
    """GPUs this script was given (this process itself sees only the first)."""
    if not torch.cuda.is_available():
        return 0
    with original_cuda_devices():
        out = subprocess.run(
            [sys.executable, "-c", "import torch; print(torch.cuda.device_count())"],
            capture_output=True,
            text=True,
            timeout=120,
            env=dict(os.environ),
        )
    return int(out.stdout.strip() or 1)


def ddp_section(plan, args, data_arg: str, device_type: str, log, workdir: Path, torchrun) -> dict:
    """The section, from the parent. torchrun(nproc, argv, **options) launches the entry script's ranks with argv
    (--ddp-worker SPEC): scripts/bench_train.py passes course.launch.torchrun bound to itself."""
    nproc = args.ddp_nproc or (all_gpu_count() or 2)
    configs = ddp_configs(plan, nproc)
    need = max((c["warmup"] + c["steps"]) * c["global_batch"] for c in configs)
    if need > args.n_train:
        raise UserError(
            f"the ddp section needs {need} training texts; --data {data_arg} has {args.n_train}. "
            "Use a larger folder, or --data embedded."
        )
    model_arg = materialise_model(plan["model"], workdir / f"ddp_{plan['model']}", args.seed)
    spec = dict(
        model=model_arg,
        model_name=plan["model"],
        data=data_arg,
        max_length=args.max_length,
        seed=args.seed,
        quiet_cores=args.quiet_cores,
        quiet_timeout=args.quiet_timeout,
        quiet_budget=args.quiet_budget / 2,
        rounds=plan["rounds"],
        configs=configs,
        workdir=str(workdir / "ddp_runs"),
        timeout=args.ddp_timeout,
        peak_tflops=args.peak_tflops,
        out=str(workdir / "ddp.json"),
    )
    spec_path = workdir / "ddp_spec.json"
    spec_path.write_text(json.dumps(spec))
    for c in configs:  # every contender's command line is checked here, before the launch
        parse_argv(worker_argv(spec, c, device_type), ddp=c["world"] > 1)
    log(
        f"\n== ddp: 1 vs {nproc} processes, {'gloo, 1 thread each' if device_type == 'cpu' else 'nccl, 1 GPU each'}; "
        f"{len(configs)} contenders x {plan['rounds']} rounds in one torchrun launch"
    )
    t = time.time()
    with original_cuda_devices():
        res = torchrun(
            nproc, ["--ddp-worker", str(spec_path)], timeout=args.ddp_timeout, echo=True, cpu_threads=1, cwd=REPO
        )
    raw = json.loads(Path(spec["out"]).read_text())
    raw["launch_seconds"] = round(time.time() - t, 1)
    raw["launch_command"] = " ".join(res.command[res.command.index("-m") :])
    raw["nproc"] = nproc
    return summarize_ddp(raw, log)


def worker_argv(spec: dict, c: dict, device_type: str) -> list:
    out = Path(spec["workdir"]) / c["name"].replace(" ", "_").replace("(", "").replace(")", "")
    return script_argv(
        model=spec["model"],
        data_arg=spec["data"],
        batch_size=c["batch_per_rank"],
        steps=c["warmup"] + c["steps"],
        num_samples=(c["warmup"] + c["steps"]) * c["global_batch"],
        max_length=spec["max_length"],
        seed=spec["seed"],
        threads=1 if device_type == "cpu" else None,
        out=out,
        device_type=device_type,
        flags=c["flags"],
        ddp=c["world"] > 1,
    )


def summarize_ddp(raw: dict, log) -> dict:
    by_name = {}
    for rec in raw["results"]:
        by_name.setdefault(rec["name"], []).append(rec)
    configs = {c["name"]: c for c in raw["configs"]}
    out = {
        "settings": {k: v for k, v in raw.items() if k not in ("results", "configs")},
        "contenders": {},
        "scaling": [],
        "knobs": {},
    }
    for name, rs in by_name.items():
        out["contenders"][name] = {
            "config": configs[name],
            **summarise(rs, ("samples_per_s", "tokens_per_s", "model_tflops", "foreign_cores", "comm_fraction")),
            "command": rs[0].get("command"),
            "rounds": rs,
        }
    log("  -- ddp: medians over rounds; speedup = N-process / 1-process samples/s on the same global batch")
    for name, c in out["contenders"].items():
        comm = c["comm_fraction"]["median"]
        log(
            f"     {name:48s} {c['samples_per_s']['median']:9.1f} samples/s"
            + (f" | all-reduce in flight {100 * comm:.0f}% of the window" if comm is not None else "")
        )
    for g in sorted({c["global_batch"] for c in configs.values()}):
        base = next(n for n, c in configs.items() if c["global_batch"] == g and c["world"] == 1)
        for n, c in configs.items():
            if c["global_batch"] != g or c["world"] == 1 or c["flags"]:
                continue
            p = paired(by_name[n], by_name[base])
            pdc = paired(by_name[n], by_name[base], "samples_per_s_dedicated_estimate")
            sp, spc = p["median_of_rounds"], p["median_of_clean_rounds"]
            row = {
                "global_batch": g,
                "processes": c["world"],
                "batch_per_rank": c["batch_per_rank"],
                "contender": n,
                "baseline": base,
                "speedup": sp,
                "speedup_ratio_of_medians": p["ratio_of_medians"],
                "efficiency": sp / c["world"] if sp else None,
                "per_round": p["per_round"],
                "clean_rounds": p["clean_rounds"],
                "speedup_clean_rounds": spc,
                "efficiency_clean_rounds": spc / c["world"] if spc else None,
                # samples per CPU-second of the average rank: no waiting, no neighbours; an upper bound
                "speedup_cpu_time_upper_bound": paired(by_name[n], by_name[base], "samples_per_cpu_s")[
                    "median_of_rounds"
                ],
                # per step, the slowest rank's CPU time: waits for a slower rank count, neighbours do not
                "speedup_dedicated_core_estimate": pdc["median_of_rounds"],
                "comm_fraction": out["contenders"][n]["comm_fraction"]["median"],
            }
            out["scaling"].append(row)
            log(
                f"     speedup {n!r} vs {base!r}: {sp:.2f}x, efficiency {100 * sp / c['world']:.0f}% | clean rounds "
                f"({p['clean_rounds']}): {spc if spc is None else round(spc, 2)} | dedicated-core estimate "
                f"{fmt(pdc['median_of_rounds'])}x"
            )
    for n, c in configs.items():
        if c["flags"]:
            ref = next(
                m
                for m, d in configs.items()
                if d["global_batch"] == c["global_batch"] and d["world"] == c["world"] and not d["flags"]
            )
            p = paired(by_name[n], by_name[ref])
            per_step = lambda name: by_name[name][0].get("allreduces", 0) / configs[name]["steps"]  # noqa: E731
            out["knobs"][n] = {
                "vs": ref,
                "ratio": p["median_of_rounds"],
                "per_round": p["per_round"],
                # a knob that leaves the buckets as they were can only measure noise (e.g. 1 MB buckets
                # on the tiny model: the 7.8 MB embedding joins the 0.4 MB rest in one bucket)
                "allreduces_per_step": {n: per_step(n), ref: per_step(ref)},
                "clean_rounds": p["clean_rounds"],
                "ratio_clean_rounds": p["median_of_clean_rounds"],
                "ratio_dedicated_core_estimate": paired(by_name[n], by_name[ref], "samples_per_s_dedicated_estimate")[
                    "median_of_rounds"
                ],
            }
            log(
                f"     knob {n!r} / {ref!r}: {fmt(p['median_of_rounds'], 3)}x "
                f"(clean rounds: {p['median_of_clean_rounds']})"
            )
    return out


def ddp_worker(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    if not torch.cuda.is_available():
        torch.set_num_threads(1)
    with harness.shared_process_group(timeout_s=spec["timeout"]) as (backend, why):
        rank, world = dist.get_rank(), dist.get_world_size()
        device = (
            torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if backend == "nccl" else torch.device("cpu")
        )
        with contextlib.redirect_stdout(io.StringIO()):
            shape = flops.model_shape(build_model(RunConfig(model=spec["model"], seed=spec["seed"]), AG_NEWS_LABELS)[0])
        gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
        gate = timing.QuietGate(spec["quiet_cores"], spec["quiet_timeout"], spec["quiet_budget"])
        results = []
        if rank == 0:
            print(f"   worker: {world} ranks | {why} | {torch.get_num_threads()} thread(s) each", flush=True)
        for r in range(spec["rounds"]):
            if rank == 0:
                print(f"  round {r + 1}/{spec['rounds']} (load average {provenance.load_average()})", flush=True)
            for c in rotate(spec["configs"], r):
                argv = worker_argv(spec, c, device.type)
                amp = precision.resolve_amp(parse_argv(argv, ddp=c["world"] > 1).amp, device)
                peak = spec["peak_tflops"] or (
                    flops.peak_tflops(gpu, flops.matmul_dtype(amp.mode, device.type)) if gpu else None
                )
                res = _worker_contender(c, argv, device, shape, peak, gate, rank, world)
                if rank == 0:
                    res.update(
                        name=c["name"],
                        round=r,
                        world=c["world"],
                        load_average=provenance.load_average(),
                        command=(
                            "python scripts/train_single.py "
                            if c["world"] == 1
                            else f"torchrun --nproc_per_node={world} scripts/train_ddp.py "
                        )
                        + " ".join(argv),
                    )
                    results.append(res)
                    rate = timing.format_rate(
                        res["samples_per_s"], res["tokens_per_s"], res["model_tflops"], res["mfu"]
                    )
                    print(
                        f"  {c['name']:48s} {rate}"
                        f" | others {fmt(res['foreign_cores'])} cores"
                        + (
                            f" | all-reduce {100 * res['comm_fraction']:.0f}% of the window"
                            if res.get("comm_fraction") is not None
                            else ""
                        ),
                        flush=True,
                    )
                if rank == 0:
                    shutil.rmtree(argv[argv.index("--output") + 1], ignore_errors=True)
                gc.collect()
        if rank == 0:
            Path(spec["out"]).write_text(
                json.dumps(
                    provenance.as_jsonable(
                        {
                            "backend": backend,
                            "backend_reason": why,
                            "world_size": world,
                            "model": spec["model_name"],
                            "configs": spec["configs"],
                            "rounds": spec["rounds"],
                            "results": results,
                        }
                    )
                )
            )
        dist.barrier()


def _worker_contender(c: dict, argv: list, device, shape, peak, gate, rank: int, world: int) -> dict:
    """One timed run of a contender on every rank; rank 0 returns the combined figures."""
    W, K = c["warmup"], c["steps"]
    if c["world"] == 1:  # train_single.py on rank 0; the other ranks wait in the barrier below
        mine = None
        c0, t0 = time.process_time(), time.perf_counter()
        if rank == 0:
            with harness.alone():
                window, probe, _ = run_script(SINGLE, argv, warmup=W, steps=K, device=device, wait=gate.wait)
            mine = (window.result(shape, peak), window.marks, probe.step_cpu_seconds(K), probe.quiet)
        dist.barrier()
        waiting = None if rank == 0 else (time.process_time() - c0) / max(time.perf_counter() - t0, 1e-9)
        gathered = [None] * world
        dist.all_gather_object(gathered, (mine, waiting))
        if rank != 0:
            return {}
        res, marks, step_cpu, quiet = gathered[0][0]
        waiting_share = sum(w for _, w in gathered[1:] if w) if world > 1 else 0.0
        b0, b1 = marks[W][2], marks[W + K][2]  # a mark is (wall, cpu, machine busy, kernel) seconds
        res["waiting_ranks_cpu_share"] = waiting_share
        res["foreign_cores"] = timing.foreign_cores(
            b0, b1, res["cpu_s"] + waiting_share * res["seconds"], res["seconds"]
        )
        dedicated = sum(step_cpu)
    else:

        def wait():  # rank 0 waits for a quiet CPU; every rank starts the window together
            q = gate.wait() if rank == 0 else None
            dist.barrier()
            return q

        window, probe, _ = run_script(DDP_SCRIPT, argv, warmup=W, steps=K, device=device, wait=wait, comm=True)
        part = (window.result(shape, None), window.marks, probe.step_cpu_seconds(K), probe.quiet)
        gathered = [None] * world
        dist.all_gather_object(gathered, part)
        if rank != 0:
            return {}
        parts = [g[0] for g in gathered]
        b0, b1 = gathered[0][1][W][2], gathered[0][1][W + K][2]  # the machine's busy seconds at rank 0's marks
        # rank 0's all-reduce timings; the throughput of all ranks together
        res = {**parts[0], **throughput.over_ranks(parts, busy=(b0, b1), peak=peak)}
        quiet = gathered[0][3]
        # With a core per rank and nobody else on it, a DDP step lasts about as long as its slowest rank's step:
        # the sum over steps of the max over ranks is a dedicated-core estimate the neighbours cannot inflate.
        dedicated = sum(max(g[2][i] for g in gathered) for i in range(min(len(g[2]) for g in gathered)))
    res["waited_for_quiet"] = quiet
    res["dedicated_core_estimate_s"] = dedicated
    res["samples_per_s_dedicated_estimate"] = res["samples"] / dedicated if dedicated > 0 else None
    return res
