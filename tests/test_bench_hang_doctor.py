"""scripts/bench_hang_doctor.py (the hang doctor's cost on a healthy run) and chapter 12's reading of its record."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from distrinews_course.hang_scenarios import doctor_cost

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "bench_hang_doctor.py"


def _record(ratios, plain_ms=50.0) -> dict:
    pairs = [{"ratio": r, "plain": {"step_ms": plain_ms}, "doctor": {"step_ms": plain_ms * r}} for r in ratios]
    s = sorted(ratios)
    median = s[len(s) // 2] if len(s) % 2 else (s[len(s) // 2 - 1] + s[len(s) // 2]) / 2
    return {
        "machine": "cpu2-test",
        "nproc": 2,
        "git_commit": "abc1234",
        "pairs": pairs,
        "summary": {
            "pairs": len(pairs),
            "overhead": round(median - 1, 4),
            "median_ratio": median,
            "min_ratio": min(ratios),
            "max_ratio": max(ratios),
            "plain_step_ms_median": plain_ms,
        },
    }


def test_the_chapter_reads_the_median_pair_and_says_the_range(tmp_path):
    (tmp_path / "hang_doctor_cost_cpu2-test.json").write_text(json.dumps(_record([1.01, 0.98, 1.03])))
    cost = doctor_cost(tmp_path)
    assert cost.overhead == pytest.approx(0.01) and cost.pairs == 3
    assert "+1.0%" in cost.text and "-2.0% to +3.0%" in cost.text and "median of 3 pairs" in cost.text
    assert "within the noise" in cost.text and "not this run" in cost.text
    assert "recorded at commit abc1234" in cost.provenance  # another commit's figure says so in the fold
    dirty = dict(_record([1.01]), git_dirty=True, load_average_at_start=[2.92, 2.37, 2.24])
    (tmp_path / "hang_doctor_cost_cpu2-test.json").write_text(json.dumps(dirty))
    assert "abc1234 with uncommitted changes, load average 2.92 at its start" in doctor_cost(tmp_path).provenance
    (tmp_path / "hang_doctor_cost_cpu2-test.json").write_text(json.dumps(_record([1.05, 1.04, 1.06])))
    assert "within the noise" not in doctor_cost(tmp_path).text  # every pair slower: a cost, said as one


def test_without_a_record_the_chapter_says_which_script_makes_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="scripts/bench_hang_doctor.py"):
        doctor_cost(tmp_path)


@pytest.mark.parametrize("args", [["--pairs", "0"], ["--steps", "1"]])
def test_bad_arguments_are_one_line_not_a_run(args):
    proc = subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 2 and "must be at least" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.bench
@pytest.mark.slow
def test_the_quick_benchmark_pairs_runs_and_the_doctor_stays_silent(tmp_path):
    out = tmp_path / "cost.json"
    proc = subprocess.run(
        [sys.executable, SCRIPT, "--quick", "--out", out], capture_output=True, text=True, timeout=600, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rec = json.loads(out.read_text())
    assert rec["summary"]["pairs"] == 2 and rec["summary"]["doctor_printed_on_healthy_runs"] == []
    assert [p["first"] for p in rec["pairs"]] == ["plain", "doctor"]  # the order alternates
    assert all(p["plain"]["step_ms"] > 0 and p["doctor"]["step_ms"] > 0 for p in rec["pairs"])
