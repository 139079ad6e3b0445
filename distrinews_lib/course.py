"""What every course notebook does first: find the project, pick the preset for this machine, and
check claims out loud.

    from distrinews_lib.course import setup, check
    env = setup(PRESET, NPROC)          # chdir to the project root, print what this machine is
    check(acc > 0.5, "the model beats chance")   # prints 'checked: ...' or fails the notebook
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from .cli import auto_preset
from .hub import hub_reachable


@dataclass
class CourseEnv:
    root: Path
    preset: str          # cpu_smoke, single_gpu or kaggle_t4x2
    nproc: int           # processes for DDP launches: every GPU, else 2 CPU processes
    n_gpus: int
    gpu_names: list
    on_kaggle: bool
    on_colab: bool
    hub: bool            # Hugging Face hub reachable
    data_dir: str | None

    @property
    def smoke(self) -> bool:
        """True on the CPU smoke preset: small data, tiny model, minutes for the whole course."""
        return self.preset == "cpu_smoke"

    @property
    def backend(self) -> str:
        return "nccl" if self.n_gpus >= self.nproc and self.n_gpus > 0 else "gloo"


def find_root(start: Path | None = None) -> Path:
    """The folder holding distrinews_lib/ and scripts/ (notebooks run from notebooks/, Kaggle from /kaggle/working)."""
    start = Path(start or Path.cwd()).resolve()
    candidates = [start, *start.parents, Path("/kaggle/working/distrinews"), Path("/kaggle/working")]
    for c in candidates:
        if (c / "distrinews_lib").is_dir() and (c / "scripts").is_dir():
            return c
    raise FileNotFoundError(
        "could not find the DistriNews project (a folder with distrinews_lib/ and scripts/) from "
        f"{start}. Open the notebook from the project's notebooks/ folder, or clone the project first.")


def setup(preset: str = "auto", nproc="auto", quiet: bool = False) -> CourseEnv:
    import torch

    root = find_root()
    os.chdir(root)  # %%writefile scripts/... and checkpoints/... are relative to the project root
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    n_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
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
        gpus = ", ".join(env.gpu_names) if env.gpu_names else "none (CPU only)"
        data = "Hugging Face hub" if env.hub else (env.data_dir or "synthetic (offline, generated)")
        print(f"project root : {env.root}\npreset       : {env.preset}\nGPUs         : {gpus}\n"
              f"DDP          : {env.nproc} processes, {env.backend}\nhub reachable: {env.hub}\ndata (auto)  : {data}\n"
              f"torch        : {torch.__version__}")
        if env.on_kaggle and not env.hub:
            print("Kaggle: switch Internet on (Settings > Internet) to train distilbert-base-uncased on the real AG News.")
        if env.on_kaggle and env.n_gpus < 2:
            print("Kaggle: pick the 'GPU T4 x2' accelerator (Settings > Accelerator) to run DDP on two GPUs.")
    return env


def check(condition, claim: str) -> None:
    """Assert a claim the notebook makes about the data it just produced, and say so."""
    if not condition:
        raise AssertionError(f"claim failed: {claim}")
    print(f"checked: {claim}")
