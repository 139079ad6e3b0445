"""Run one chapter several times in a row, as a user runs it (scripts/run_course.py), and record how each run ended:
how often a chapter's claims hold is a measured rate, not a hope. Optionally every run under scripts/slow_machine.py
(busy loops beside it: about half a core's speed).

    python scripts/repeat_chapter.py 06 --times 10 --slow --out benchmarks/chapter06_slow_machine_<machine>.json

The JSON gives, per run: ok or failed, seconds, the failing cell's line when it failed, and the slow-down the busy
loops measured; with the machine, commit and load at the start (bench/provenance.py).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from distrinews_course.bench.provenance import provenance  # noqa: E402
from distrinews_lib.files import atomic_write_json  # noqa: E402


def one_run(chapter: str, slow: bool, timeout: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "slow.json"
        cmd = [sys.executable, str(ROOT / "scripts" / "run_course.py"), "--only", chapter]
        if slow:
            cmd = [sys.executable, str(ROOT / "scripts" / "slow_machine.py"), "--report", str(report), "--", *cmd]
        t = time.perf_counter()
        try:
            proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
            code, out = proc.returncode, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as err:
            code, out = None, f"timed out after {timeout:.0f} s\n{err.stdout or ''}"
        seconds = time.perf_counter() - t
        failed = [line.strip() for line in out.splitlines() if re.search(r"\bfailed\b|Error|timed out", line)]
        speed = json.loads(report.read_text()) if report.exists() else None
    return {
        "ok": code == 0,
        "exit_code": code,
        "seconds": round(seconds, 1),
        "failure": failed[:3] if code != 0 else [],
        "slow_machine": speed,
    }


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    p.add_argument("chapter", help="the chapter, as run_course.py --only takes it (e.g. 06)")
    p.add_argument("--times", type=int, default=10)
    p.add_argument("--slow", action="store_true", help="every run under scripts/slow_machine.py (one busy loop a core)")
    p.add_argument("--timeout", type=float, default=1800, help="seconds a run may take before it counts as failed")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    record = {"chapter": args.chapter, "slow_machine": args.slow, "provenance": provenance(), "runs": []}
    for i in range(1, args.times + 1):
        run = one_run(args.chapter, args.slow, args.timeout)
        record["runs"].append(run)
        record["ok"] = sum(r["ok"] for r in record["runs"])
        atomic_write_json(args.out, record)  # after each run: an interrupted series keeps what it measured
        print(f"run {i}/{args.times}: {'ok' if run['ok'] else 'FAILED'} in {run['seconds']:.0f} s", flush=True)
    print(f"{record['ok']} of {args.times} runs ok -> {args.out}")


if __name__ == "__main__":
    main()
