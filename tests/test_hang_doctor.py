"""The hang doctor's rules (distrinews_lib/hang_doctor/verdict.py) on rank states written by hand, and its switch in
the training scripts' options. The doctor on real hanging runs: tests/test_hang_doctor_runs.py."""

from __future__ import annotations

import subprocess
import sys

import pytest

from distrinews_lib.hang_doctor.verdict import (
    Call,
    RankState,
    death_verdict,
    further_along,
    hang_verdict,
    shown_stack,
    site,
    straggler_verdict,
    user_frame,
)

S = "/job/train.py"  # the job's own script
TORCH = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"


def call(seq, op="all_reduce", sizes=((9,),), done=True, t=None, dtypes=("Float",), where=(), pg="0"):
    return Call(pg, seq, op, sizes, dtypes, done, t if t is not None else seq * 1_000_000, where)


def history(n, **kw):
    """n completed all-reduces of the gradients, the same on every rank."""
    return [call(s, **kw) for s in range(1, n + 1)]


def stack(*frames):
    """Frames given outermost first, as one reads a traceback; stored innermost first."""
    return list(reversed([(S, line, fn) for fn, line in frames])) + []


def state(rank, calls, frames=(), failed=None):
    return RankState(rank, calls, list(frames), failed=failed)


def test_a_rank_that_does_not_answer_is_dead_and_the_waiters_say_where():
    waiting = call(4, done=False, where=tuple(stack(("<module>", 30), ("step", 12))))
    v = hang_verdict({0: state(0, history(3) + [waiting]), 1: None}, world=2, waited_s=3.0)
    assert (v.kind, v.culprits, v.op, v.seq) == ("dead", [1], "all_reduce", 4)
    assert "rank 1 is dead" in v.text and "train.py:12 (step)" in v.text and "3.0 s" in v.text


def test_rank_zero_dead_is_named_too():
    waiting = call(4, done=False)
    v = hang_verdict({0: None, 1: state(1, history(3) + [waiting])}, world=2)
    assert v.kind == "dead" and v.culprits == [0]


def test_a_rank_that_has_not_called_the_collective_is_behind_with_its_stack():
    barrier = call(4, op="barrier", sizes=(), done=False, where=tuple(stack(("<module>", 50))))
    saving = stack(("<module>", 48), ("save_checkpoint", 20))
    v = hang_verdict({0: state(0, history(3), saving), 1: state(1, history(3) + [barrier])}, world=2, waited_s=2.0)
    assert (v.kind, v.culprits, v.op, v.seq) == ("behind", [0], "barrier", 4)
    assert "save_checkpoint (train.py:20) < <module> (train.py:48)" in v.text


def test_the_rank_further_along_skipped_the_collective():
    """Rank 0 waits in the loop's all-reduce at line 52; rank 1 left the loop and waits at the barrier on line 67."""
    r0 = stack(("<module>", 65), ("train", 52))
    r1 = stack(("<module>", 67))
    s0 = state(0, history(3) + [call(4, done=False, t=4_000_000, where=tuple(r0))], r0)
    s1 = state(1, history(3) + [call(4, op="barrier", sizes=(), done=False, t=4_100_000, where=tuple(r1))], r1)
    v = hang_verdict({0: s0, 1: s1}, world=2)
    assert (v.kind, v.culprits, v.seq, v.op, v.site) == ("skipped", [1], 4, "all_reduce", "train.py:52 (train)")
    assert "skipped all_reduce at train.py:52 (train)" in v.text
    # ...whichever rank it is
    v = hang_verdict({0: state(0, s1.calls, r1), 1: state(1, s0.calls, r0)}, world=2)
    assert v.culprits == [0]


def test_a_shape_mismatch_blames_the_rank_whose_shape_changed():
    """Both all-reduce class counts: rank 1's were long[4] until its batch lacked the last class (long[3]). Its
    mismatched call completed with garbage and it moved on; rank 0 still waits in #8."""
    counts = dict(dtypes=("Long",))
    past = [c for s in range(1, 8) for c in [call(s, **counts, sizes=((4,),))] if s % 2 == 0] + [
        call(s, sizes=((68,),)) for s in range(1, 8, 2)
    ]
    past.sort(key=lambda c: c.seq)
    s0 = state(0, past + [call(8, sizes=((4,),), done=False, **counts)])
    s1 = state(1, past + [call(8, sizes=((3,),), **counts), call(9, sizes=((68,),), done=False)])
    v = hang_verdict({0: s0, 1: s1}, world=2)
    assert (v.kind, v.culprits, v.seq, v.sizes) == ("mismatch", [1], 8, ((3,),))
    assert "[4]" in v.text and "[3]" in v.text


def test_with_three_ranks_the_majority_decides():
    calls = {r: history(3) + [call(4, done=False)] for r in (0, 1)}
    calls[2] = history(3) + [call(4, op="barrier", sizes=(), done=False)]
    v = hang_verdict({r: state(r, c) for r, c in calls.items()}, world=3)
    assert v.culprits == [2]


def test_the_earliest_divergence_wins_over_a_later_one():
    s0 = state(0, history(2) + [call(3, sizes=((5,),)), call(4, done=False)])
    s1 = state(1, history(2) + [call(3, sizes=((7,),)), call(4, op="barrier", sizes=(), done=False)])
    assert hang_verdict({0: s0, 1: s1}, world=2).seq == 3


def test_every_rank_in_the_same_collective_blames_nobody():
    v = hang_verdict({r: state(r, history(3) + [call(4, done=False)]) for r in (0, 1)}, world=2)
    assert v.kind == "stuck" and v.culprits == []


def test_further_along_only_compares_lines_of_the_same_function():
    assert further_along(stack(("<module>", 10)), stack(("<module>", 12))) == -1
    assert further_along(stack(("<module>", 12), ("f", 3)), stack(("<module>", 12), ("f", 1))) == 1
    assert further_along(stack(("<module>", 12), ("f", 3)), stack(("<module>", 12), ("g", 9))) == 0


def test_death_names_the_dying_rank_its_error_and_what_the_others_wait_in():
    frames = stack(("main", 60), ("read_batch", 37))
    waiting = call(8, sizes=((68,),), done=False, where=tuple(stack(("main", 62))))
    v = death_verdict(1, "ValueError: bad record", frames, {0: state(0, history(7) + [waiting]), 1: None})
    assert v.culprits == [1] and v.seq == 8 and "train.py:37 (read_batch)" in v.text and "train.py:62" in v.text


def test_frames_of_torch_python_and_the_doctor_are_not_the_jobs():
    assert user_frame((S, 1, "f"))
    assert not user_frame((TORCH, 1, "all_reduce"))
    assert not user_frame(("<frozen runpy>", 88, "_run_code"))
    assert not user_frame((subprocess.__file__, 1, "run"))
    assert site([(TORCH, 1, "barrier"), (S, 7, "main")]) == "train.py:7 (main)"
    # a stack stops at the script's module: the launcher's frames around it are not the job's
    outer = [(S, 7, "main"), (S, 9, "<module>"), ("/x/harden.py", 80, "run")]
    assert shown_stack(outer) == "main (train.py:7) < <module> (train.py:9)"


def arrivals(late_ms, steps=24, per=2, step_ms=100, noise=None):
    """Two ranks' completed calls: `per` collectives a step; rank 1 arrives late_ms later at each step's first."""
    out = {0: [], 1: []}
    seq = 0
    for s in range(steps):
        for k in range(per):
            seq += 1
            t0 = (s * step_ms + k) * 1_000_000
            extra = noise[s] if noise else 0.0
            sizes = ((9,),) if k == 0 else ((3,),)  # the step's collectives differ: their sequence has a period
            out[0].append(call(seq, sizes=sizes, t=int(t0 + max(0, -extra) * 1e6)))
            out[1].append(call(seq, sizes=sizes, t=int(t0 + ((late_ms if k == 0 else 0) + max(0, extra)) * 1e6)))
    return out


def test_a_rank_late_at_every_step_is_a_straggler_with_the_time_it_adds():
    v = straggler_verdict(arrivals(late_ms=40))
    assert v is not None and v.culprits == [1] and v.details["per_step"] == 2
    assert v.details["added_ms_per_step"] == pytest.approx(40, abs=1)


def test_noise_that_takes_turns_and_a_late_start_are_not_stragglers():
    assert straggler_verdict(arrivals(late_ms=0, noise=[(-1) ** s * 30 for s in range(24)])) is None
    one_late_start = arrivals(late_ms=0, noise=[500] + [0] * 23)
    assert straggler_verdict(one_late_start) is None
    assert straggler_verdict(arrivals(late_ms=2)) is None  # 2% of a step: not worth a paragraph
    assert straggler_verdict(arrivals(late_ms=40, steps=3)) is None  # too few steps to tell
    # a read-ahead filling on a busy machine: late by 40 ms over the first 11 steps (CI saw it), on time after
    assert straggler_verdict(arrivals(late_ms=0, noise=[40] * 11 + [0] * 13)) is None
    assert straggler_verdict(arrivals(late_ms=0, steps=11, noise=[40] * 11)) is None  # what a first look sees


def test_a_clock_offset_between_machines_is_taken_out():
    """Rank 1's machine's clock runs 40 ms ahead: every arrival of it looks 40 ms late, until the offset is known."""
    skewed = arrivals(late_ms=0)
    for c in skewed[1]:
        c.t_ns += 40_000_000
    assert straggler_verdict(skewed).culprits == [1]
    assert straggler_verdict(skewed, offsets_ns={1: 40_000_000}) is None


def test_the_flag_arms_the_doctor_and_lengthens_the_groups_timeout(tmp_path):
    """In a fresh process: without the flag nothing of the doctor is imported; with it, the Flight Recorder is on and
    the group's timeout is --ddp_timeout plus the grace."""
    code = (
        "import sys, os\n"
        "from distrinews_lib.training import config\n"
        "cfg = config.parse('t', ['--output', sys.argv[1], '--ddp_timeout', '10'], ddp=True)\n"
        "print('off', 'distrinews_lib.hang_doctor' in sys.modules, cfg.ddp_timeout)\n"
        "cfg = config.parse('t', ['--output', sys.argv[1], '--ddp_timeout', '10', '--debug_hangs'], ddp=True)\n"
        "fr = os.environ['TORCH_FR_BUFFER_SIZE']\n"
        "print('on', 'distrinews_lib.hang_doctor' in sys.modules, cfg.ddp_timeout, fr)\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "off False 10.0" in out.stdout and "on True 20.0 512" in out.stdout, out.stdout


def test_the_wrapper_refuses_a_missing_script_and_a_bad_wait():
    for argv, words in ([["--after", "3"], "name the script"], [["--after", "0", "x.py"], "positive"]):
        out = subprocess.run(
            [sys.executable, "-m", "distrinews_lib.hang_doctor", *argv], capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 2 and words in out.stderr, out.stderr
