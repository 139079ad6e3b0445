"""Chapter 01's exercises 2 and 3, each one named call: the runs of train_single.py they need, the learner's
prediction judged, and the claims checked on what the runs wrote (the claims are pure functions, tested on
records where a wrong figure fails them: tests/test_baseline_chapter.py)."""

from __future__ import annotations

import shutil

from .attempt import judge_prediction
from .baseline_run import padding_guess_ok, padding_line
from .claims import Claim
from .launch import run_python
from .plots import load_metrics

SCRIPT = "scripts/train_single.py"


def _args(preset: str, out: str, samples: int, evals: int) -> list:
    return ["--config", preset, "--num_samples", samples, "--eval_samples", evals, "--no-progress", "--threads", 1,
            "--output", out, "--checkpoint", f"{out}/m.pt"]  # fmt: skip


def padding_claims(runs: dict) -> list[Claim]:
    """runs: {"grouped": metrics, "not grouped": metrics}. Random batches must carry more than twice the padding of
    length-grouped ones (cpu_smoke: about 22% against under 1%; twice is far inside that gap)."""
    random_pad, grouped_pad = (runs[k]["aggregates"]["padding_fraction"] for k in ("not grouped", "grouped"))
    ratio = random_pad / grouped_pad if grouped_pad else float("inf")
    return [Claim(f"random batches carry {ratio:.1f}x the padding of length-grouped ones (more than twice)",
                  random_pad > 2 * grouped_pad)]  # fmt: skip


def padding(preset: str, guess, out_root: str = "outputs/exercises") -> list[Claim]:
    """Exercise 2: one epoch on 960 texts, grouped by length and not; judge the learner's padding percentage of the
    random batches; return the claim to settle()."""
    runs = {}
    for name, extra in (("grouped", []), ("not grouped", ["--no-group_by_length"])):
        out = f"{out_root}/01_padding_{name.replace(' ', '_')}"
        run_python(SCRIPT, [*_args(preset, out, 960, 100), "--epochs", 1, "--no-snapshots", *extra], echo=False)
        runs[name] = load_metrics(out)
        print(f"{name:>12}: {padding_line(runs[name])}; {runs[name]['aggregates']['mean_samples_per_s']:.0f} samples/s")
    random_pad = runs["not grouped"]["aggregates"]["padding_fraction"]
    judge_prediction("MY_PADDING_PERCENT", guess, round(100 * random_pad, 1),
                     right=padding_guess_ok(guess, random_pad), why="(right within 2/3 to 3/2 of it)")  # fmt: skip
    return padding_claims(runs)


def continue_claims(output: str, metrics: dict) -> list[Claim]:
    """What the second run of exercise 3 (the same command with --epochs 2 --resume auto) must show: it resumed from
    the end-of-epoch-1 snapshot, trained epoch 2 only, and its metrics.json holds both epochs."""
    trained = sum(line.startswith("epoch ") for line in output.splitlines())
    return [
        Claim("the second run resumed from the snapshot written at the end of epoch 1",
              "resumed from" in output and "snap_e002_b000000.pt" in output),
        Claim("it trained only epoch 2", trained == 1 and "epoch 2/2" in output),
        Claim("metrics.json holds both epochs: epoch 1 came back with the snapshot", len(metrics["epochs"]) == 2),
    ]  # fmt: skip


def continue_run(preset: str, guess, out: str = "outputs/exercises/01_resume") -> list[Claim]:
    """Exercise 3: train one epoch with --snapshot_every 20, then run the same command with --epochs 2 --resume auto;
    judge the learner's count of the epochs the second run trains; return the claims about it to settle()."""
    common = [*_args(preset, out, 1600, 200), "--snapshot_every", 20]
    shutil.rmtree(out, ignore_errors=True)
    run_python(SCRIPT, [*common, "--epochs", 1], echo=False)
    second = run_python(SCRIPT, [*common, "--epochs", 2, "--resume", "auto"], echo=False)
    print("\n".join(line for line in second.lines if "resumed" in line or line.startswith("epoch")))
    judge_prediction("MY_EPOCHS_TRAINED", guess, sum(line.startswith("epoch ") for line in second.lines))
    return continue_claims(second.output, load_metrics(out))
