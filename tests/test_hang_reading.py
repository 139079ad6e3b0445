"""Chapter 12's readings of each tool's output (distrinews_course/hang_reading.py), on the tools' own output: the debug
server's pages rendered by torch's own templates, a real faulthandler dump, a real py-spy dump, torch's own error file,
and the messages DETAIL and monitored_barrier print (copied from torch 2.13 runs on gloo)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from distrinews_course import hang_reading as R

pytest.importorskip("jinja2")


def page(template: str, texts: dict, failed: dict = ()) -> str:
    """A page of the debug server as its frontend renders it: its own Jinja2 templates, one response per rank."""
    from jinja2 import DictLoader, Environment

    from distrinews_course.attach_debug_server import import_torch_debug

    import_torch_debug()  # before _frontend: its import registers the handler that would abort this process at exit
    from torch.distributed.debug import _frontend as F

    env = Environment(
        loader=DictLoader(
            {"base.html": F.BASE_TEMPLATE, "raw.html": F.RAW_RESP_TEMPLATE, "json.html": F.JSON_RESP_TEMPLATE}
        )
    )
    env.globals.update(zip=zip, enumerate=enumerate, format_json=F.format_json, nav_links="")
    ranks = sorted(texts)
    resps = [F.Response(503 if r in failed else 200, texts[r]) for r in ranks]
    return env.get_template(template).render(title="t", addrs=[f"http://vm:{9000 + r}" for r in ranks], resps=resps)


def entries(seqs, pending=None):
    out = [{"collective_seq_id": s, "profiling_name": "gloo:all_reduce", "retired": True, "input_sizes": [[9]],
            "time_created_ns": s * 10**9, "pg_id": 0} for s in seqs]  # fmt: skip
    if pending:
        out.append({"collective_seq_id": pending[1], "profiling_name": f"gloo:{pending[0]}", "retired": False,
                    "input_sizes": [], "time_created_ns": pending[1] * 10**9, "pg_id": 0})  # fmt: skip
    return out


def test_the_flight_recorder_page_gives_each_ranks_entries_and_leaves_out_a_rank_it_could_not_reach():
    fr = {0: entries([1, 2], ("all_reduce", 3)), 1: entries([1, 2], ("barrier", 3)), 2: []}
    texts = {r: json.dumps({"entries": e, "version": "2.10"}) for r, e in fr.items()}
    texts[2] = "ConnectionError: refused"
    got = R.flight_recorder(page("json.html", texts, failed={2}))
    assert got == {0: fr[0], 1: fr[1]}


def faulthandler_dump() -> str:
    """A real faulthandler dump of a process whose main thread sleeps in save(), with a second thread running."""
    code = (
        "import faulthandler, sys, threading, time\n"
        "threading.Thread(target=time.sleep, args=(5,), daemon=True).start()\n"
        "def save():\n"
        "    faulthandler.dump_traceback(sys.stdout, all_threads=True)\n"
        "save()\n"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout


def test_the_stacks_page_gives_each_ranks_main_thread_innermost_first():
    dump = faulthandler_dump()
    st = R.stacks(page("raw.html", {0: dump, 1: dump}))
    assert set(st) == {0, 1}
    assert [f[2] for f in st[0][:2]] == ["save", "<module>"]  # not the sleeping thread's frames


def test_culprit_reads_the_pages_like_the_doctor():
    fr = {0: entries([1, 2]), 1: entries([1, 2], ("barrier", 3))}
    st = {0: [("/job/save.py", 20, "save_checkpoint"), ("/job/save.py", 40, "<module>")],
          1: [("/job/save.py", 42, "<module>")]}  # fmt: skip
    v = R.culprit(fr, st, world=2)
    assert (v.kind, v.culprits, v.op, v.seq) == ("behind", [0], "barrier", 3)
    assert "save_checkpoint (save.py:20)" in v.text
    table = R.collective_table(fr, st)
    assert "barrier #3" in table and "save.py:20 (save_checkpoint)" in table


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="py-spy reads /proc")
def test_pyspy_reads_a_sleeping_process_or_says_why_not(tmp_path):
    script = tmp_path / "sleeper.py"
    script.write_text("import time\ndef slow_save():\n    time.sleep(60)\nslow_save()\n")
    proc = subprocess.Popen([sys.executable, str(script)])
    try:
        time.sleep(1.0)
        frames, text, why = R.pyspy(proc.pid, timeout=30)
        if why is None:
            assert R.own_frame(frames)[1:] == (3, "slow_save"), text
        else:  # no permission here: the reason is one line, not a traceback
            assert "\n" not in why and why
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.skipif(not (hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("su")), reason="needs root")
def test_pyspy_without_the_right_to_trace_says_so_in_one_line():
    """Another user cannot trace a root process: what a learner without CAP_SYS_PTRACE meets."""
    exe = Path(sys.executable).with_name("py-spy")
    if not exe.exists():
        pytest.skip("py-spy is not installed")
    copy = Path("/tmp") / f"py-spy-{os.getpid()}"
    shutil.copy(exe, copy)
    copy.chmod(0o755)
    try:
        run = subprocess.run(["su", "nobody", "-s", "/bin/sh", "-c", f"{copy} dump --pid {os.getpid()}"],
                             capture_output=True, text=True, timeout=60)  # fmt: skip
        assert run.returncode != 0 and "Permission Denied" in run.stdout + run.stderr
    finally:
        copy.unlink()


DETAIL = (
    "RuntimeError: Detected mismatch between collectives on ranks. Rank 1 is running collective: "
    "CollectiveFingerPrint(SequenceNumber=8, OpType=ALLREDUCE, TensorShape=[3], TensorDtypes=Long, "
    "TensorDeviceTypes=TensorOptions(dtype=float (default), device=cpu)), but Rank 0 is running collective: "
    "CollectiveFingerPrint(SequenceNumber=8, OpType=ALLREDUCE, TensorShape=[4], TensorDtypes=Long, "
    "TensorDeviceTypes=TensorOptions(dtype=float (default), device=cpu)).Collectives differ in the following aspects: "
)


def test_detail_mismatch_names_each_ranks_collective():
    assert R.detail_mismatch(DETAIL) == {1: ("allreduce", 8, (3,)), 0: ("allreduce", 8, (4,))}
    assert R.detail_mismatch("RuntimeError: Timed out waiting 3000ms") == {}


def test_monitored_barrier_names_the_missing_rank_whoever_reports_it():
    assert R.monitored_barrier_names("[Rank 0]: Rank 1 failed to pass monitoredBarrier in 3000 ms") == {1}
    assert R.monitored_barrier_names("[Rank 0]: Ranks 1, 3 failed to pass monitoredBarrier in 3000 ms") == {1, 3}
    late0 = (
        "Rank 1 successfully reached monitoredBarrier, but received errors while waiting for send/recv from rank 0. "
        "Please check rank 0 logs for faulty rank."
    )
    assert R.monitored_barrier_names(late0) == {0}


def test_error_files_read_torchs_own_format(tmp_path):
    """torch's ErrorHandler writes the file @record writes; error_files reads the rank from its folder."""
    folder = tmp_path / "run_0" / "attempt_0" / "1"
    folder.mkdir(parents=True)
    code = (
        "import os\n"
        "from torch.distributed.elastic.multiprocessing.errors import ErrorHandler\n"
        "def read_batch():\n"
        "    raise ValueError('a record cut short')\n"
        "try:\n"
        "    read_batch()\n"
        "except ValueError as e:\n"
        "    ErrorHandler().record_exception(e)\n"
    )
    env = {**os.environ, "TORCHELASTIC_ERROR_FILE": str(folder / "error.json")}
    (tmp_path / "job.py").write_text(code)
    subprocess.run([sys.executable, str(tmp_path / "job.py")], env=env, check=True, timeout=120)
    files = R.error_files(tmp_path)
    assert list(files) == [1]
    message, frames = files[1]
    assert "ValueError: a record cut short" in message and R.own_frame(frames)[2] == "read_batch"
    stamps = R.error_stamps(tmp_path)  # torchrun orders failures by this whole-second stamp
    assert list(stamps) == [1] and abs(stamps[1] - time.time()) < 600, stamps


def test_arrivals_line_up_completed_collectives_by_sequence_number():
    fr = {0: entries([1, 2, 3]), 1: entries([1, 2, 3])}
    for e in fr[1]:
        e["time_created_ns"] += 80_000_000
    fr[1][-1]["retired"] = False  # still waiting: left out
    assert R.arrivals(fr) == [{0: 0.0, 1: 80.0}, {0: 0.0, 1: 80.0}]


def test_lateness_leaves_out_the_set_up_and_says_how_often_the_rank_was_last():
    rows = [{0: 0.0, 1: 500.0}] * 3 + [{0: 0.0, 1: 90.0}, {0: 0.0, 1: 110.0}, {0: 20.0, 1: 0.0}, {0: 0.0, 1: 100.0}]
    last, median_ms = R.lateness(rows, rank=1)
    assert last == 0.75 and median_ms == 95.0  # (-20, 90, 100, 110): the set-up's 500 ms are not counted
    with pytest.raises(ValueError, match="read too early"):
        R.lateness(rows[:3], rank=1)


def test_two_tools_stacks_agree_on_the_line_whatever_folder_they_write():
    torch_frame = ("/x/site-packages/torch/distributed/distributed_c10d.py", 5356, "barrier")
    server = [torch_frame, ("scripts/hangs/slow_save.py", 32, "save_checkpoint")]
    spy = [("/work/main/scripts/hangs/slow_save.py", 32, "save_checkpoint")]
    assert R.same_line(server, spy)
    assert not R.same_line(server, [("/work/main/scripts/hangs/slow_save.py", 33, "save_checkpoint")])
    assert not R.same_line(server, [torch_frame])  # no frame of the job's own code: nothing to agree on


def test_root_cause_ranks_reads_torchruns_heading():
    lines = [
        "Root Cause (first observed failure):",
        "[0]:",
        "  time      : 2026-12-07_05:00:01",
        "  host      : vm",
        "  rank      : 1 (local_rank: 1)",
        "  exitcode  : 1 (pid: 4242)",
    ]
    assert R.root_cause_ranks(lines) == [1]
    assert R.root_cause_ranks(["no heading here"]) == []


def test_a_missing_debug_server_package_is_one_paragraph_before_any_run(monkeypatch):
    import importlib.util

    from distrinews_course import hang_lab

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "aiohttp" else real(name, *a))
    assert "needs aiohttp" in hang_lab.debug_server_problem()
    lab = hang_lab.HangLab(nproc=2, hang_s=3)
    lab.add(hang_lab.Scenario("x", "scripts/hangs/slow_save.py", ["--mode", "fixed"], debug_server=True))
    with pytest.raises(RuntimeError, match="pip install -r requirements.txt"):
        lab.get("x")
    assert not lab.futures  # nothing was started


def test_a_coloured_pyspy_dump_is_read_like_a_plain_one():
    """py-spy colours its dump when it takes its reader for a terminal (it did under a notebook's kernel)."""
    coloured = (
        "Process \x1b[33m\x1b[1m32217\x1b[0m: python slow_save.py\n\n"
        'Thread \x1b[33m\x1b[1m32217\x1b[0m (idle): "MainThread"\n'
        "    \x1b[32msave_checkpoint\x1b[0m (\x1b[36mscripts/hangs/slow_save.py\x1b[0m:\x1b[2m32\x1b[0m)\n"
        "    \x1b[32m<module>\x1b[0m (\x1b[36mscripts/hangs/slow_save.py\x1b[0m:\x1b[2m46\x1b[0m)\n"
        'Thread \x1b[33m\x1b[1m32229\x1b[0m (idle): "hang-doctor"\n'
        "    \x1b[32mDoctor._run\x1b[0m (\x1b[36m/x/distrinews_lib/hang_doctor/watch.py\x1b[0m:\x1b[2m210\x1b[0m)\n"
    )
    want = [("scripts/hangs/slow_save.py", 32, "save_checkpoint"), ("scripts/hangs/slow_save.py", 46, "<module>")]
    assert R.pyspy_frames(coloured) == want
    assert R.pyspy_frames(R._ANSI.sub("", coloured)) == want


def test_the_hung_probe_waits_until_every_rank_is_past_ddps_start_up():
    from distrinews_course.hang_lab import hung_past_start

    def entry(seq, op, retired, t_s):
        return {
            "collective_seq_id": seq,
            "profiling_name": f"gloo:{op}",
            "retired": retired,
            "time_created_ns": int(t_s * 1e9),
        }

    start_up = {
        0: [entry(1, "all_gather", True, 0.0)],
        1: [entry(1, "all_gather", True, 0.0), entry(2, "broadcast", False, 1.0)],
    }
    assert not hung_past_start(start_up, now_ns=int(9e9))  # rank 1 waits for rank 0, still importing: not the hang
    steps = {r: [entry(1, "all_gather", True, 0.0), entry(2, "all_reduce", True, 3.0)] for r in (0, 1)}
    hung = {0: steps[0], 1: [*steps[1], entry(3, "barrier", False, 4.0)]}
    assert not hung_past_start(hung, now_ns=int(4.5e9))  # waited half a second only
    assert hung_past_start(hung, now_ns=int(5.5e9))  # rank 1 at the barrier, rank 0 busy elsewhere
    assert not hung_past_start({}, now_ns=int(9e9))


def test_step_counts_reads_each_ranks_counts_at_one_step_and_none_for_a_rank_that_logged_none():
    out = "RESULT rank=1 step=3 counts=[2,6,4]\nRESULT rank=0 step=13 counts=[1]\nRESULT rank=1 step=2 counts=[9]"
    assert R.step_counts(out, 3) == {1: [2, 6, 4]}
    assert R.step_counts(out + "\nRESULT rank=0 step=3 counts=[6,4,4,2]", 3)[0] == [6, 4, 4, 2]


def test_the_straggler_line_and_the_ptrace_note_say_what_was_measured():
    from distrinews_course.debug_tools import ptrace_note
    from distrinews_course.hang_scenarios import straggler_figures

    line = straggler_figures(121.4, 37, {"added_ms_per_step": 112.2, "per_step": 1, "steps": 25})
    assert "121 ms" in line and "37 collectives" in line and "+112 ms" in line and "25 steps" in line
    assert "(1 collective a step)" in line
    assert "could not show a refusal" in ptrace_note(True)
    assert "refused here (Permission Denied)" in ptrace_note(False, "Permission Denied")


def test_doctor_waited_s_reads_the_hang_report_or_says_none(tmp_path):
    assert R.doctor_waited_s(tmp_path) is None
    (tmp_path / "hang.json").write_text(json.dumps({"verdict": {}, "waited_s": 3.004}))
    assert R.doctor_waited_s(tmp_path) == 3.004


def test_a_process_that_imported_torchs_debug_server_exits_cleanly():
    """torch.distributed.debug registers a Python handler in a C++ registry that frees it after the interpreter has
    finalized: where the registry holds the last reference, the process aborts at exit (134). Clearing the module's
    namespace, as finalization does, makes that so here; import_torch_debug's extra reference keeps the exit clean."""
    code = (
        "import sys\n"
        "if sys.argv[1] == 'pin':\n"
        "    from distrinews_course.attach_debug_server import import_torch_debug\n"
        "    import_torch_debug()\n"
        "import torch.distributed.debug._handlers as h\n"
        "h.__dict__.clear()\n"
    )
    pinned = subprocess.run([sys.executable, "-c", code, "pin"], capture_output=True, text=True, timeout=120)
    assert pinned.returncode == 0 and "Fatal Python error" not in pinned.stderr, pinned.stderr[-500:]
    bare = subprocess.run([sys.executable, "-c", code, "bare"], capture_output=True, text=True, timeout=120)
    if bare.returncode == 0:
        pytest.skip("this torch frees its debug handlers safely: the pin is not needed (the pinned exit was clean)")
    assert bare.returncode == -6 and "GIL is released" in bare.stderr, (bare.returncode, bare.stderr[-500:])


def test_the_fixed_slow_save_runs_alone_with_a_save_longer_than_its_group_timeout():
    """Chapter 12's fix of the slow save is shown on a run whose save outlasts its default group's timeout: in the
    shared launch of the other fixes (run_together's 60 s group) the bug would end cleanly too."""
    from distrinews_course.hang_scenarios import chapter_lab

    lab = chapter_lab(nproc=2, hang_s=3)
    fixed, broken = lab.scenarios["slow_save_fixed"], lab.scenarios["slow_save"]
    arg = lambda s, name: float(s.args[s.args.index(name) + 1])
    assert fixed.args[fixed.args.index("--mode") + 1] == "fixed" and not fixed.module
    assert arg(fixed, "--ddp_timeout") == arg(broken, "--ddp_timeout") == lab.group_timeout_s
    assert arg(fixed, "--save_s") == arg(broken, "--save_s") > lab.group_timeout_s
    assert "slow_save.py" not in " ".join(map(str, lab.scenarios["fixes"].args))
