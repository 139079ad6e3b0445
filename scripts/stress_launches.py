"""Launch every kind of DDP entry point of the course many times and count how each launch ended.

    python scripts/slow_machine.py -- .venv/bin/python scripts/stress_launches.py --times 30 \
        --out benchmarks/launch_stress_<machine>.json
    python scripts/stress_launches.py --only memory_footprint --times 20      # chapter 06's 2-process launch

A launch ends in one of four ways, counted per entry point:
- ok:       exit code 0;
- aborted:  a rank was killed by a signal (SIGABRT at exit: "terminate called without an active exception", or
            torchrun's "exitcode: -6"), however the launch itself ended;
- hung:     it ran past --timeout; before it is stopped, every process's Python and native stack is dumped with
            py-spy when it is installed (pip install py-spy), so that a hang is a stack, not a guess;
- failed:   any other non-zero exit (its last lines are kept).
Entry points run round-robin, one launch at a time, so each sees the same machine. The sizes are the smallest that
still run each script's whole path (process group, DDP, its end).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from distrinews_course import launch  # noqa: E402
from distrinews_course.bench.provenance import provenance  # noqa: E402

SCRIPTS = REPO / "scripts"
ABORT = re.compile(
    r"terminate called without an active exception|exitcode\s*:\s*-6\b|SIGABRT|exited with code -6\b"  # the box's
)
TRAIN = [
    "--config",
    "cpu_smoke",
    "--data",
    "embedded",
    "--epochs",
    "1",
    "--num_samples",
    "128",
    "--eval_samples",
    "64",
    "--batch_size",
    "16",
    "--no-progress",
    "--no-snapshots",
    "--threads",
    "1",
]


BENCH_RUNS = ("ddp", "single", "ddp_again")  # several runs: a script that ended the launch early would lose the rest


def bench_runs_specs(tmp: Path) -> list:
    flags = [
        "--config",
        "cpu_smoke",
        "--data",
        "embedded",
        "--num_samples",
        "256",
        "--batch_size",
        "16",
        "--epochs",
        "1",
        "--no-progress",
        "--no-snapshots",
        "--threads",
        "1",
    ]
    runs = {
        name: {
            "world": 1 if name == "single" else 2,
            "warmup": 1,
            "steps": 2,
            "flags": [*flags, "--output", str(tmp / name), "--checkpoint", str(tmp / name / "m.pt")],
        }
        for name in BENCH_RUNS
    }
    spec = tmp / "runs.json"
    spec.write_text(json.dumps(runs))
    return [tmp / "results.json", spec]


def produced(name: str, tmp: Path) -> str | None:
    """None when the launch left what its script must write; else what is missing (an exit code 0 is not enough:
    a script that ends its process too early exits 0 too)."""
    need = {
        "train_ddp": tmp / "ddp" / "m.pt",
        "train_accelerate": tmp / "acc" / "m.pt",
        "race": tmp / "race" / "race.json",
        "pitfalls_shared": tmp / "pit" / "08.json",
        "concept_alone": tmp / "concept" / "02.json",
        "memory_footprint": tmp / "mem" / "two.json",
        "bench_runs": tmp / "bench" / "results.json",
        "multinode_node": tmp / "multi" / "shared" / "run" / "model.pt",
        "race_two_level": tmp / "two" / "race.json",
        "by_hand_bucketed": None,
    }.get(name)
    if need is None:
        return None
    if not need.exists():
        return f"{need.name} was not written"
    if name == "bench_runs":
        missing = set(BENCH_RUNS) - set(json.loads(need.read_text()))
        return f"results.json lacks {sorted(missing)}" if missing else None
    return None


def entry_points(tmp: Path) -> dict:
    """name -> a function that runs one launch (check=False) and returns its LaunchResult."""

    def out(name):
        d = tmp / name
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        return d

    def torchrun(script, args, timeout):
        return launch.torchrun(script, 2, args, timeout=timeout, echo=False, check=False, cwd=REPO)

    from distrinews_course import demo, link

    def in_box(script, args, timeout):  # chapter 08's two levels: 2 nodes x 2 ranks in the cluster in a box
        return link.run_in_box(script, args, nodes=2, ranks_per_node=2, timeout=timeout, check=False, cwd=REPO)

    return {
        "train_ddp": lambda t: torchrun(
            SCRIPTS / "train_ddp.py", [*TRAIN, "--output", out("ddp"), "--checkpoint", tmp / "ddp" / "m.pt"], t
        ),
        "train_accelerate": lambda t: launch.accelerate_launch(
            SCRIPTS / "train_accelerate.py",
            2,
            [*TRAIN, "--output", out("acc"), "--checkpoint", tmp / "acc" / "m.pt"],
            timeout=t,
            echo=False,
            check=False,
            cwd=REPO,
        ),
        "by_hand_bucketed": lambda t: torchrun(SCRIPTS / "by_hand" / "bucketed.py", ["--steps", "4"], t),
        "race": lambda t: torchrun(
            SCRIPTS / "by_hand" / "race.py",
            [
                "--models",
                "tiny",
                "--rounds",
                "1",
                "--round_steps",
                "2",
                "--check_steps",
                "2",
                "--sweep",
                "",
                "--out",
                out("race") / "race.json",
            ],
            t,
        ),
        "bench_runs": lambda t: torchrun(SCRIPTS / "bench_runs.py", bench_runs_specs(out("bench")), t),
        "pitfalls_shared": lambda t: launch.torchrun(
            demo.__name__,
            2,
            [
                SCRIPTS / "pitfalls" / "01_set_epoch.py",
                "--out",
                out("pit") / "01.json",
                "--",
                SCRIPTS / "pitfalls" / "08_no_sync.py",
                "--out",
                tmp / "pit" / "08.json",
            ],
            module=True,
            timeout=t,
            echo=False,
            check=False,
            cwd=REPO,
        ),
        "concept_alone": lambda t: torchrun(
            SCRIPTS / "concepts" / "02_ddp_backward.py", ["--out", out("concept") / "02.json"], t
        ),
        "multinode_node": lambda t: launch.run(
            [sys.executable, SCRIPTS / "multinode" / "two_nodes.py", "--workdir", out("multi"), "--", *TRAIN],
            timeout=t,
            echo=False,
            check=False,
            cwd=REPO,
        ),
        "by_hand_hierarchical": lambda t: in_box(SCRIPTS / "by_hand" / "hierarchical.py", ["--steps", "4"], t),
        "by_hand_hsdp": lambda t: in_box(SCRIPTS / "by_hand" / "hsdp.py", ["--steps", "4"], t),
        "race_two_level": lambda t: in_box(
            SCRIPTS / "by_hand" / "race_two_level.py",
            [
                *("--check_steps", "1", "--compute_steps", "1", "--rounds", "1", "--round_steps", "1"),
                *("--memory_steps", "1", "--link", "400mbit", "--out", out("two") / "race.json"),
            ],
            t,
        ),
        "memory_footprint": lambda t: torchrun(
            SCRIPTS / "memory_footprint.py",
            [
                "--runs",
                "ddp@1x8,ddp,ddp+view,zero1,fsdp2_reshard_off,fsdp2_reshard_on,deepspeed_1,deepspeed_2,deepspeed_3",
                "--out",
                out("mem") / "two.json",
            ],
            t,
        ),
    }


DEFAULT = (
    "train_ddp",
    "train_accelerate",
    "by_hand_bucketed",
    "race",
    "bench_runs",
    "pitfalls_shared",
    "concept_alone",
    "multinode_node",
    "by_hand_hierarchical",  # the three in a box need network namespaces (root, or a user namespace)
    "by_hand_hsdp",
    "race_two_level",
)


def dump_stacks(root_pid: int) -> str:
    """py-spy's stacks of every process under root_pid (native frames too), or why there are none."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(spy).exists():
        return "py-spy not installed (pip install py-spy): no stacks"
    family = launch._Descendants(root_pid)
    family.refresh()
    out = []
    for pid in sorted(family.alive()):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:200]
        except OSError:
            continue
        if "python" not in cmd:
            continue
        p = subprocess.run([spy, "dump", "--native", "--pid", str(pid)], capture_output=True, text=True, timeout=60)
        out.append(f"--- pid {pid}: {cmd}\n{p.stdout}{p.stderr}")
    return "\n".join(out) or "no Python processes left to dump"


class Watched:
    """Runs a launch in a thread so that a hang can be dumped before the launch's own timeout stops it."""

    def __init__(self, fn, timeout: float):
        self.fn, self.timeout = fn, timeout

    def __call__(self):
        import threading

        box = {}
        before = set(_children())
        th = threading.Thread(target=lambda: box.setdefault("res", self.fn(self.timeout + 30)), daemon=True)
        t0 = time.time()
        th.start()
        th.join(self.timeout)
        stacks = None
        if th.is_alive():  # past our limit: dump every stack, then let the launch's own (later) timeout stop it
            new = [pid for pid in _children() if pid not in before]
            stacks = "\n".join(dump_stacks(pid) for pid in new) or "no launch process found"
            th.join()
        res = box.get("res")
        return res, time.time() - t0, stacks


def _children() -> list:
    import os

    me = os.getpid()
    kids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == me:
                kids.append(int(entry))
    return kids


def classify(res, seconds: float, stacks, timeout: float) -> dict:
    text = res.output if res is not None else ""
    hung = stacks is not None or (res is not None and res.timed_out)
    aborted = bool(ABORT.search(text))
    state = "hung" if hung else "aborted" if aborted else "ok" if res is not None and res.returncode == 0 else "failed"
    rec = {"state": state, "returncode": None if res is None else res.returncode, "seconds": round(seconds, 1)}
    if aborted:
        rec["abort_lines"] = [line for line in text.splitlines() if ABORT.search(line)][:4]
    if state in ("failed", "hung"):
        rec["last_lines"] = text.strip().splitlines()[-25:]
    if stacks:
        rec["stacks"] = stacks[-20000:]
    return rec


def tally(launches: dict) -> dict:
    return {
        n: {s: sum(r["state"] == s for r in recs) for s in ("ok", "aborted", "hung", "failed")}
        | {"launches": len(recs), "median_seconds": sorted(r["seconds"] for r in recs)[len(recs) // 2]}
        for n, recs in launches.items()
        if recs
    }


def write(out, launches: dict, args, started: float, done: bool, prov: dict) -> dict:
    summary = tally(launches)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(
        json.dumps(
            {
                "benchmark": "launch_stress",
                **prov,  # taken at the start: its load average and time are the run's, not the last launch's
                "times": args.times,
                "finished": done,
                "timeout_s": args.timeout,
                "minutes": round((time.time() - started) / 60, 1),
                "summary": summary,
                "launches": launches,
            },
            indent=1,
            default=str,
        )
    )
    return summary


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--times", type=int, default=30, help="launches per entry point")
    p.add_argument("--only", default=",".join(DEFAULT), help="comma-separated entry points (memory_footprint too)")
    p.add_argument("--timeout", type=float, default=240, help="seconds after which a launch counts as hung")
    p.add_argument("--out", default=None, help="JSON with the counts and every launch")
    p.add_argument("--pause-file", default=None, help="while this file exists, wait between two launches")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="stress_") as tmp:
        points = entry_points(Path(tmp))
        names = [n for n in args.only.split(",") if n]
        unknown = set(names) - set(points)
        if unknown or args.times < 1:
            p.error(
                f"unknown entry point(s) {', '.join(sorted(unknown))}; choices: {', '.join(points)}"
                if unknown
                else "--times must be at least 1"
            )
        launches = {n: [] for n in names}
        started = time.time()
        prov = provenance()
        for i in range(args.times):
            for name in names:
                while args.pause_file and Path(args.pause_file).exists():  # someone needs a quiet machine for a while
                    time.sleep(5)
                res, seconds, stacks = Watched(points[name], args.timeout)()
                rec = classify(res, seconds, stacks, args.timeout)
                if rec["state"] == "ok" and (why := produced(name, Path(tmp))):
                    rec.update(state="failed", last_lines=[f"exit code 0, but {why}"])
                if rec["state"] != "ok" and args.out and res is not None:  # the whole output: the cause may be early
                    log = Path(args.out).with_suffix("") / f"{name}_{i + 1}.log"
                    log.parent.mkdir(parents=True, exist_ok=True)
                    log.write_text(res.output)
                    rec["log"] = str(log)
                launches[name].append(rec)
                if args.out:  # after every launch: a run stopped half-way keeps what it counted
                    write(args.out, launches, args, started, done=False, prov=prov)
                print(f"{i + 1:3d}/{args.times} {name:<18} {rec['state']:<8} {rec['seconds']:6.1f} s", flush=True)
                if rec["state"] != "ok":
                    print("    " + "\n    ".join(rec.get("abort_lines") or rec.get("last_lines", [])[-6:]), flush=True)
    summary = write(args.out, launches, args, started, done=True, prov=prov) if args.out else tally(launches)
    print(f"\n{'entry point':<18} {'launches':>8} {'ok':>5} {'aborted':>8} {'hung':>5} {'failed':>7} {'median s':>9}")
    for n, s in summary.items():
        print(
            f"{n:<18} {s['launches']:8d} {s['ok']:5d} {s['aborted']:8d} {s['hung']:5d} {s['failed']:7d} "
            f"{s['median_seconds']:9.1f}"
        )
    if args.out:
        print(f"wrote {args.out}")
    bad = sum(s["aborted"] + s["hung"] + s["failed"] for s in summary.values())
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
