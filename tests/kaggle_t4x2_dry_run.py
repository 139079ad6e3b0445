"""What the installed course decides on Kaggle's "GPU T4 x2", without a GPU: torch.cuda answers as two Tesla T4s
that cannot reach each other peer-to-peer (as Kaggle's do), then the course's first cell and the kaggle_t4x2 preset
run as a notebook would run them. Run by tests/test_pack.py with the python of a fresh install, from its copy:

    python kaggle_t4x2_dry_run.py PRESET      # PRESET: kaggle_t4x2, or auto (which must pick it)

It prints one line per decision and exits 1 (naming the decision) when one is not what Kaggle needs."""

import os
import sys

import torch


def pretend_two_t4s() -> None:
    """torch.cuda as on Kaggle's T4 x2 (no call reaches a driver); tests/test_gpu_env.py's fake_cuda, standalone."""
    names = ["Tesla T4", "Tesla T4"]

    class Props:
        total_memory = 15 * 2**30
        major, minor = 7, 5
        name = "Tesla T4"

    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: len(names)
    torch.cuda.get_device_name = lambda i=0: names[(i.index or 0) if isinstance(i, torch.device) else i]
    torch.cuda.get_device_capability = lambda i=0: (7, 5)
    torch.cuda.get_device_properties = lambda i=0: Props()
    torch.cuda.can_device_access_peer = lambda i, j: False


def main(preset: str) -> int:
    pretend_two_t4s()
    from distrinews_course import notebook as course
    from distrinews_lib.errors import UserError
    from distrinews_lib.training import config, precision

    env = course.setup(preset, "auto")
    cfg = config.parse("dry run", ["--config", env.preset], ddp=True)
    amp = precision.resolve_amp(cfg.amp, torch.device("cuda", 0))
    try:
        precision.resolve_amp("bf16", torch.device("cuda", 0))
        bf16 = "accepted"
    except UserError:
        bf16 = "refused"
    decided = {
        "preset": (env.preset, "kaggle_t4x2"),
        "DDP processes": (env.nproc, 2),
        "backend": (env.backend, "nccl"),
        "NCCL_P2P_DISABLE": (os.environ.get("NCCL_P2P_DISABLE"), "1"),
        "batch per GPU": (cfg.batch_size, 32),
        "epochs": (cfg.epochs, 3),
        "precision": (f"{amp.mode}{' + GradScaler' if amp.use_scaler else ''}", "fp16 + GradScaler"),
        "--amp bf16": (bf16, "refused"),
    }
    wrong = [f"{k}: {got!r}, Kaggle's T4 x2 needs {want!r}" for k, (got, want) in decided.items() if got != want]
    print("\n".join(f"dry run | {k:<17} {got}" for k, (got, _) in decided.items()))
    if wrong:
        print("dry run FAILED: " + "; ".join(wrong), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "kaggle_t4x2"))
