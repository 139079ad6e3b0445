"""Every launch ends cleanly (distrinews_lib.distributed.end_process), a failed rank still fails with its message,
and a rank that dies by a signal is shown with its own last lines."""

import re
import subprocess
import sys

import pytest

from distrinews_course.launch import LaunchError, signalled_ranks, torchrun

from .helpers import ROOT, SCRIPTS

ENDING = ROOT / "tests" / "workers" / "ending.py"


@pytest.mark.slow
def test_a_finished_rank_ends_with_exit_code_0():
    res = torchrun(ENDING, 2, ["ok"], timeout=120, echo=False, check=False)
    assert res.ok, res.output[-3000:]
    assert res.output.count("loop done") == 2


@pytest.mark.slow
def test_a_failed_rank_still_fails_with_its_traceback():
    res = torchrun(ENDING, 2, ["raise"], timeout=120, echo=False, check=False)
    assert res.returncode != 0 and not res.timed_out
    assert "ValueError: rank 1 failed on purpose after the loop" in res.output
    assert "exitcode  : 1" in res.output  # the rank's own exit code, not a signal


@pytest.mark.slow
def test_a_user_error_keeps_exit_code_2_and_its_message():
    res = torchrun(ENDING, 2, ["user_error"], timeout=120, echo=False, check=False)
    assert res.returncode != 0 and "stopped: rank 1 stopped on purpose" in res.output
    assert "exitcode  : 2" in res.output


@pytest.mark.slow
def test_a_rank_killed_by_a_signal_is_shown_with_its_own_last_lines():
    with pytest.raises(LaunchError) as caught:
        torchrun(ENDING, 2, ["abort"], timeout=120, echo=False)
    message = str(caught.value)
    assert "rank 1's own last lines (it was killed by SIGABRT)" in message
    own = message.split("rank 1's own last lines", 1)[1]
    assert "rank 1 last words 29" in own and "rank 1 last words 15" in own  # its last 15 lines, in order
    assert "rank 1 last words 14" not in own
    assert caught.value.result.rank_tails[1][-1] == "rank 1 last words 29"


def test_signalled_ranks_reads_torchrun_s_report_root_cause_first():
    report = """Failures:
[1]:
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 11)  (SIGTERM)
------------------------------------------------------
Root Cause (first observed failure):
[0]:
  rank      : 1 (local_rank: 1)
  exitcode  : -6 (pid: 12)  (SIGABRT)
"""
    assert list(signalled_ranks(report).items()) == [(1, "SIGABRT")]  # torchrun's SIGTERM of rank 0 is not news
    assert signalled_ranks(report.replace("-6 (pid: 12)  (SIGABRT)", "1 (pid: 12)")) == {0: "SIGTERM"}
    assert signalled_ranks("no report at all") == {}


def test_end_process_keeps_the_exit_code_and_runs_exit_handlers(tmp_path):
    code = """
import atexit, sys
from distrinews_lib import distributed as D
atexit.register(lambda: print("exit handler ran", flush=True))
D.run_and_end(lambda: {arg})
"""
    for arg, want in (("None", 0), ("3", 3), ("sys.exit(2)", 2), ("1 / 0", 1)):
        p = subprocess.run(
            [sys.executable, "-c", code.format(arg=arg)], capture_output=True, text=True, cwd=ROOT, timeout=60
        )
        assert p.returncode == want, (arg, p.stderr)
        assert "exit handler ran" in p.stdout
        assert ("ZeroDivisionError" in p.stderr) == (arg == "1 / 0")


def test_every_entry_point_that_joins_a_group_ends_through_end_process():
    """A script of scripts/ that joins a process group ends through end_process: run_and_end(main), end_process(...),
    or course.demo's finish() (which calls it). harden ends the rest, but a learner runs torchrun by hand."""
    missing, joined = [], []
    for path in sorted(SCRIPTS.rglob("*.py")):
        text = path.read_text()
        if not re.search(
            r"init_process_group\(|harness\.(init|run)\(|= start\(|Accelerator\(|shared_process_group\(", text
        ):
            continue
        joined.append(path.name)
        if not any(
            way in text for way in ("run_and_end(", "end_process(", "\nfinish()", "    finish()", "harness.run(")
        ):
            missing.append(path.relative_to(ROOT).as_posix())
    assert not missing, f"these entry points end without end_process: {missing}"
    assert {
        "train_ddp.py",
        "train_accelerate.py",
        "race.py",
        "bench_runs.py",
        "memory_footprint.py",
        "07_uneven_inputs.py",
        "01_hello_allreduce.py",
    } <= set(joined)  # the search finds what it must


def test_exit_code_of_reads_a_main_as_a_script_would_end(capsys):
    from distrinews_lib.errors import exit_code_of

    def fail_with(message):
        raise SystemExit(message)

    assert exit_code_of(lambda: None) == 0
    assert exit_code_of(lambda: 3) == 3
    assert exit_code_of(lambda: {"headline": 1.2}) == 0  # a main that returns its result (bench_train) succeeded
    assert exit_code_of(lambda: fail_with("stopped: bad input")) == 1
    assert "stopped: bad input" in capsys.readouterr().err
    assert exit_code_of(lambda: fail_with(4)) == 4
    assert exit_code_of(lambda: 1 / 0) == 1
    assert "ZeroDivisionError" in capsys.readouterr().err


def test_a_launch_whose_store_port_was_taken_starts_again(monkeypatch, capsys):
    """torchrun --standalone's port taken between choosing and binding it (seen in the stress run): launched again."""
    from distrinews_course import launch

    taken = (
        "torch.distributed.DistNetworkError: The server socket has failed to listen on any local network "
        "address. port: 42663, useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use"
    )
    outcomes = [
        launch.LaunchResult(["torchrun"], 1, taken, 1.0, False, [taken]),
        launch.LaunchResult(["torchrun"], 0, "ok", 1.0, False, ["ok"]),
    ]
    calls = []

    def fake_run(cmd, **kw):
        calls.append(cmd)
        result = outcomes[len(calls) - 1]
        if kw["check"] and not result.ok:
            raise launch.LaunchError("failed", result)
        return result

    monkeypatch.setattr(launch, "_run", fake_run)
    assert launch.torchrun(ENDING, 2, ["ok"], echo=False).ok and len(calls) == 2
    assert "the launch starts again (2 of 3)" in capsys.readouterr().out
    calls.clear()
    outcomes[:] = [launch.LaunchResult(["torchrun"], 1, "ValueError: boom", 1.0, False, ["ValueError: boom"])]
    with pytest.raises(LaunchError):
        launch.torchrun(ENDING, 2, ["ok"], echo=False)  # any other failure is not retried
    assert len(calls) == 1
    assert launch.port_taken(taken) and not launch.port_taken("ValueError: boom")


def test_torchrun_s_root_cause_is_shown_when_the_last_lines_do_not_hold_it():
    from distrinews_course.launch import root_causes

    report = [
        "node0 | Root Cause (first observed failure):",
        "node0 | [0]:",
        "node0 |   time      : 2026-11-26_04:10:00",
        "node0 |   host      : node0",
        "node0 |   rank      : 1 (local_rank: 0)",
        "node0 |   exitcode  : -6 (pid: 42)",
        "node0 |   error_file: <N/A>",
        "node1 | unrelated line",
        "node0 | ============================================================",
    ]
    [(where, block)] = root_causes(["noise"] * 3 + report)
    assert where == " of node0" and "rank      : 1 (local_rank: 0)" in block and "exitcode  : -6" in block
    assert "unrelated" not in block
    assert root_causes(["Root Cause (first observed failure):", "[0]:", "  exitcode  : 1"])[0] == (
        "",
        "[0]:\n  exitcode  : 1",
    )
    assert root_causes(["all fine"]) == []
