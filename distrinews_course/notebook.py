"""What every course notebook does first: find the project, pick the preset for this machine, and
check claims out loud.

    from distrinews_course.notebook import setup, check
    env = setup(PRESET, NPROC)          # chdir to the project root, print what this machine is
    check(acc > 0.5, "the model beats chance")   # prints 'checked: ...' or fails the notebook
    solution(exercise_1, SOLUTIONS)     # an exercise's solution: runs when SOLUTIONS (or CI) asks

Exercises: every chapter ends with a few. Each has a solution cell that defines a function (which runs
something and asserts what it found) and hands it to solution(): skipped by default so the learner can
try first, run when the notebook's SOLUTIONS parameter is True (scripts/run_course.py --solutions) or
when DISTRINEWS_SOLUTIONS=1 is set (CI, through conftest.py).

Answers stay off the page: the code a learner is asked to write has its reference version in
notebooks/answers/<chapter>.py, which only answer() reads, and answer() only inside a solution that runs. The
solution cells are collapsed in the notebook (metadata jupyter.source_hidden) and behind "show the solution" on the
site.
"""

from __future__ import annotations

import difflib
import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from distrinews_lib.distributed import gpu_count, nccl_fits
from distrinews_lib.hub import hub_reachable
from distrinews_lib.training.config import auto_preset

from . import ROOT, gpu_env


@dataclass
class CourseEnv:
    root: Path
    preset: str  # cpu_smoke, single_gpu or kaggle_t4x2
    nproc: int  # processes for DDP launches: every GPU, else 2 CPU processes
    n_gpus: int
    gpu_names: list
    on_kaggle: bool
    on_colab: bool
    hub: bool  # Hugging Face hub reachable
    data_dir: str | None

    @property
    def smoke(self) -> bool:
        """True on the CPU smoke preset: small data, tiny model, minutes for the whole course."""
        return self.preset == "cpu_smoke"

    @property
    def backend(self) -> str:
        return "nccl" if nccl_fits(self.n_gpus, self.nproc) else "gloo"


def find_root(start: Path | None = None) -> Path:
    """The folder holding distrinews_lib/ and scripts/ (notebooks run from notebooks/; on Kaggle and Colab from where
    the archive's install copies the course, scripts/pack_install.sh)."""
    start = Path(start or Path.cwd()).resolve()
    hosted = [Path("/kaggle/working/distrinews"), Path("/kaggle/working"), Path("/content/distrinews")]
    candidates = [start, *start.parents, *hosted]
    for c in candidates:
        if (c / "distrinews_lib").is_dir() and (c / "scripts").is_dir():
            return c
    raise FileNotFoundError(
        "could not find the DistriNews project (a folder with distrinews_lib/ and scripts/) from "
        f"{start}. Open the notebook from the project's notebooks/ folder, or clone the project first."
    )


def setup(preset: str = "auto", nproc="auto", quiet: bool = False, min_nproc: int = 1) -> CourseEnv:
    """The chapter's environment. A chapter that compares 1 process with N gives min_nproc=2: where this machine
    gives fewer (one GPU, or --nproc 1) it runs on min_nproc CPU processes instead, and says so in one line."""
    root = find_root()
    os.chdir(root)  # %%writefile scripts/... and checkpoints/... are relative to the project root
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    n_gpus = gpu_count()
    env = CourseEnv(
        root=root,
        preset=auto_preset() if preset in ("auto", None, "") else preset,
        nproc=(n_gpus or 2) if nproc in ("auto", None, "") else int(nproc),
        n_gpus=n_gpus,
        gpu_names=[torch.cuda.get_device_name(i) for i in range(n_gpus)],
        on_kaggle=Path("/kaggle").is_dir() or "KAGGLE_KERNEL_RUN_TYPE" in os.environ,
        on_colab="COLAB_RELEASE_TAG" in os.environ,
        hub=hub_reachable(),
        data_dir=os.environ.get("DISTRINEWS_DATA_DIR"),
    )
    if not quiet:
        data = (
            "Hugging Face hub"
            if env.hub
            else (env.data_dir or "the real AG News sample inside distrinews_lib (offline)")
        )
        print(
            f"project root : {env.root}\npreset       : {env.preset}\n"
            f"DDP          : {env.nproc} processes, {env.backend}\nhub reachable: {env.hub}\ndata (auto)  : {data}"
        )  # the versions and the GPUs: gpu_env.first_cell's lines, just below
        if env.on_kaggle and not env.hub:
            print(
                "Kaggle: switch Internet on (Settings > Internet) to train distilbert-base-uncased on the real AG News."
            )
        if env.on_kaggle and env.n_gpus < 2:
            print("Kaggle: pick the 'GPU T4 x2' accelerator (Settings > Accelerator) to run DDP on two GPUs.")
    gpu_env.first_cell(quiet=quiet)  # versions, GPUs, /dev/shm, P2P (-> NCCL_P2P_DISABLE); stops leftover ranks
    if env.nproc < min_nproc:
        why = f"{env.n_gpus} GPU" if env.n_gpus == 1 and nproc in ("auto", None, "") else f"NPROC={env.nproc}"
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the launches of this kernel: CPU processes, as on a laptop
        env = replace(env, preset="cpu_smoke", nproc=min_nproc, n_gpus=0, gpu_names=[])
        print(
            f"this chapter compares 1 process with {min_nproc}, and this machine gives {why}: it runs on "
            f"{min_nproc} CPU processes (gloo), preset cpu_smoke. Its GPU figures need {min_nproc}+ GPUs "
            "(Kaggle's T4 x2)."
        )
    return env


@dataclass
class ScriptDiff:
    text: str  # a unified diff that ignores indentation (the DDP body sits inside try/finally)
    added: int  # lines of the second file that are new or changed
    removed: int  # lines of the first file that are gone or changed


def script_diff(a, b, context: int = 1) -> ScriptDiff:
    """How `b` differs from `a`, line by line, ignoring indentation; lines shown as written in the files."""
    la, lb = Path(a).read_text().splitlines(), Path(b).read_text().splitlines()
    matcher = difflib.SequenceMatcher(None, [x.strip() for x in la], [x.strip() for x in lb], autojunk=False)
    out, added, removed = [f"--- {a}", f"+++ {b}"], 0, 0
    for group in matcher.get_grouped_opcodes(context):
        i1, i2, j1, j2 = group[0][1], group[-1][2], group[0][3], group[-1][4]
        out.append(f"@@ -{i1 + 1},{i2 - i1} +{j1 + 1},{j2 - j1} @@")
        for tag, a1, a2, b1, b2 in group:
            if tag == "equal":
                out += [" " + x for x in lb[b1:b2]]
                continue
            out += ["-" + x for x in la[a1:a2]]
            out += ["+" + x for x in lb[b1:b2]]
            removed += a2 - a1
            added += b2 - b1
    return ScriptDiff("\n".join(out), added, removed)


def accuracy_floor(metrics: dict) -> float:
    """The accuracy a finished AG News run is held to, from its metrics.json: 90% for a pretrained model, 80% for
    one trained from random weights (the tiny model, which offline presets fall back to, reaches 85-88%)."""
    return 0.90 if metrics["model"]["pretrained"] else 0.80


def check(condition, claim: str) -> None:
    """Assert a claim the notebook makes about the data it just produced, and say so."""
    if not condition:
        raise AssertionError(f"claim failed: {claim}")
    print(f"checked: {claim}")


def solutions_enabled(flag=False) -> bool:
    return bool(flag) or os.environ.get("DISTRINEWS_SOLUTIONS", "").lower() in ("1", "true", "yes")


def solution(fn, flag=False):
    """Run an exercise's solution (a function that runs something and checks what it found), or say how to."""
    if not solutions_enabled(flag):
        print(
            f"solution '{fn.__name__}' not run: try the exercise first; set SOLUTIONS = True in the parameters cell "
            "(or run_course.py --solutions) to run it"
        )
        return None
    print(f"--- solution '{fn.__name__}' ---")
    return fn()


ANSWERS = ROOT / "notebooks" / "answers"


def answer(chapter: str, name: str, flag=False):
    """The reference answer `name` of a chapter (notebooks/answers/<chapter>.py), for its solution cell. Loaded only
    when solutions are enabled: a learner's run never imports the answers."""
    if not solutions_enabled(flag):
        raise RuntimeError(f"answer({chapter!r}, {name!r}) is for solution cells, which run only with SOLUTIONS = True")
    import importlib.util

    path = ANSWERS / f"{chapter}.py"
    spec = importlib.util.spec_from_file_location(f"distrinews_answers_{chapter}", path)
    if spec is None or not path.is_file():
        raise FileNotFoundError(f"no answers file {path}")
    module = sys.modules.get(spec.name)
    if module is None:
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    try:
        return getattr(module, name)
    except AttributeError:
        raise AttributeError(f"{path} has no answer named {name!r}") from None


def keep_log(result, path, show=lambda line: False) -> None:
    """Write a launch's whole output to `path` (the cell shows only the lines `show` picks, and where the log is)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(result.output)
    lines = [line.rsplit("\r", 1)[-1] for line in result.lines]
    picked = [line for line in lines if show(line)]
    if picked:
        print("\n".join(picked))
    print(f"[{len(lines)} lines of output in {path}]")
