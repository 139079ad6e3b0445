"""Run experiments: each configs/experiments/<name>.yaml is a full experiment (dataset, model, tokenizer,
training, DDP, AMP, and how many processes), and a run writes experiments/<name>/.

    python scripts/run_experiment.py agnews_custom_1p agnews_custom_2p      # by name
    python scripts/run_experiment.py configs/experiments/imdb_custom_2p.yaml
    python scripts/run_experiment.py --all                                 # every YAML in configs/experiments
    python scripts/run_experiment.py --list
    python scripts/plot_results.py                                         # then compare them

An experiment with `processes: 1` runs scripts/train_single.py; with N > 1, scripts/train_ddp.py under torchrun
with N processes (2 CPU processes with gloo here; one per GPU with nccl). Both are the course's own scripts,
unchanged: the YAML is their --config, so the YAML's values are checked exactly like flags. The run leaves in
experiments/<name>/: config.json (every option as resolved, what the plan decided, the data's labels and
class counts, the checkpoint's path), metrics.csv, metrics.json, log.txt, and the checkpoint model.pt
(not committed: see .gitignore).

Extra flags after `--` go to every run (e.g. `-- --epochs 1` for a rehearsal; they are recorded in config.json).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EXPERIMENT_DIR = REPO / "configs" / "experiments"  # the checkout's experiments (the presets ship in the package)
sys.path.insert(0, str(REPO))

from distrinews_course import launch
from distrinews_lib.errors import UserError, main_guard  # noqa: E402
from distrinews_lib.training import config  # noqa: E402


def _load() -> list:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def experiment_files() -> list:
    return sorted(EXPERIMENT_DIR.glob("*.yaml"))


def find(name: str) -> Path:
    path = Path(name)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        return path.resolve()
    candidate = EXPERIMENT_DIR / f"{name}.yaml"
    if candidate.is_file():
        return candidate
    known = ", ".join(p.stem for p in experiment_files()) or "none yet"
    raise UserError(f"no experiment '{name}': expected {candidate} or a path to a YAML file. Known: {known}.")


def settings(path: Path) -> dict:
    """The experiment's values, checked like flags (config.read_preset), with its name and process count."""
    stem, values = config.read_preset(str(path), ddp=True)
    return {
        "name": values.get("experiment") or stem,
        "processes": values.get("processes") or 1,
        "threads": values.get("threads"),
        "values": values,
    }


def command(path: Path, s: dict, extra: list) -> tuple[str, list]:
    script = REPO / "scripts" / ("train_single.py" if s["processes"] == 1 else "train_ddp.py")
    return str(script), ["--config", str(path), "--experiment", s["name"], "--no-progress", *extra]


def run_one(path: Path, extra: list, timeout: float) -> dict:
    s = settings(path)
    if "--experiment" in extra[:-1]:  # a rehearsal under another name: -- --epochs 1 --experiment try_1
        s["name"] = extra[extra.index("--experiment") + 1]
    out = REPO / "experiments" / s["name"]
    out.mkdir(parents=True, exist_ok=True)
    script, args = command(path, s, extra)
    env = {"OMP_NUM_THREADS": str(s["threads"] or 1)}
    print(f"== experiment {s['name']}: {s['processes']} process(es), {Path(script).name} {' '.join(args)}", flush=True)
    start, load_before, started = time.time(), _load(), time.strftime("%Y-%m-%dT%H:%M:%S%z")
    if s["processes"] == 1:
        res = launch.run_python(script, args, timeout=timeout, env=env, cwd=REPO, check=False)
    else:
        res = launch.torchrun(script, s["processes"], args, timeout=timeout, env=env, cwd=REPO, check=False)
    (out / "log.txt").write_text(res.output)
    took = time.time() - start
    launcher = ["python"] if s["processes"] == 1 else ["torchrun", "--standalone", f"--nproc_per_node={s['processes']}"]
    record = {
        "experiment": s["name"],
        "yaml": os.path.relpath(path, REPO),
        "processes": s["processes"],
        "command": " ".join(
            [
                f"OMP_NUM_THREADS={env['OMP_NUM_THREADS']}",
                *launcher,
                os.path.relpath(script, REPO),
                *(os.path.relpath(a, REPO) if str(a).startswith(str(REPO)) else str(a) for a in args),
            ]
        ),
        "started": started,
        "wall_s": round(took, 1),
        "returncode": res.returncode,
        # 1-minute load averages of the machine (shared with other jobs) around the run
        "load_average_before": load_before,
        "load_average_after": _load(),
        "cpu_count": os.cpu_count(),
    }
    (out / "run.json").write_text(json.dumps(record, indent=2))
    if not res.ok:
        tail = "\n".join(res.output.strip().splitlines()[-8:])
        raise UserError(
            f"experiment {s['name']} failed ({'timed out' if res.timed_out else f'exit code {res.returncode}'}) "
            f"after {took:.0f} s; its output is in {out / 'log.txt'}. Last lines:\n{tail}"
        )
    print(f"== experiment {s['name']} done in {took:.0f} s -> {out}", flush=True)
    return {"name": s["name"], "seconds": took, "folder": str(out)}


@main_guard
def main(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("experiments", nargs="*", help="names (configs/experiments/<name>.yaml) or YAML paths")
    p.add_argument("--all", action="store_true", help="every experiment in configs/experiments")
    p.add_argument("--list", action="store_true", help="list the experiments and what they run")
    p.add_argument("--dry-run", action="store_true", help="print the commands only")
    p.add_argument("--timeout", type=float, default=4 * 3600, help="seconds each run may take")
    argv = sys.argv[1:] if argv is None else list(argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    a = p.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    paths = experiment_files() if a.all or a.list else [find(n) for n in a.experiments]
    if not paths:
        raise UserError(
            "name at least one experiment (or --all / --list). Known: "
            + (", ".join(p.stem for p in experiment_files()) or "none")
        )
    if a.list or a.dry_run:
        for path in paths:
            s = settings(path)
            script, args = command(path, s, extra)
            launcher = "python" if s["processes"] == 1 else f"torchrun --standalone --nproc_per_node={s['processes']}"
            print(
                f"{s['name']}: OMP_NUM_THREADS={s['threads'] or 1} {launcher} "
                f"{os.path.relpath(script, REPO)} {' '.join(args)}"
            )
        return
    done = [run_one(path, extra, a.timeout) for path in paths]
    print("\n".join(f"{d['name']}: {d['seconds']:.0f} s" for d in done))


if __name__ == "__main__":
    main()
