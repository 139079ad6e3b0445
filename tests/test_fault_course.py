"""Chapter 07's named checks, each fed figures that must pass and a wrong figure that must fail: the blocked time of a
save, the served score of a converted checkpoint, the kill-and-resume timeline, the run-B log readers, and the
unstaged-writer hazard in one process."""

import statistics

import pytest
import torch

from distrinews_course import async_hazard, fault_timeline, resume_demo, save_timeline, served_score, shard_layout


def _result(sync_ms, async_ms, late_rank_ms=0.0):
    """Two ranks, saves at steps 10 (sync), 20 (async), 30 (sync); rank 1 calls each save late_rank_ms late."""
    ranks = []
    for r in range(2):
        lag = late_rank_ms / 1000 * r
        saves, t = [], 100.0
        for step, mode, ms in ((10, "sync", sync_ms), (20, "async", async_ms), (30, "sync", sync_ms)):
            t += 1.0
            start = t + lag
            back = t + late_rank_ms / 1000 + ms / 1000  # both return together: the last caller's start + its cost
            saves.append({"step": step, "mode": mode, "started": start, "returned": back,
                          "committed": back + (0.2 if mode == "async" else 0.0)})  # fmt: skip
        ranks.append({"rank": r, "steps": [(i, 100 + i * 0.1, 100 + i * 0.1 + 0.08) for i in range(1, 31)],
                      "saves": saves})  # fmt: skip
    return {"ranks": ranks}


def test_blocked_time_is_the_groups_and_async_must_block_less():
    saves = save_timeline.blocked(_result(120, 50, late_rank_ms=30))
    # rank 0 called 30 ms early and waited in the barrier: that wait is not the save's cost
    assert [round(s.blocked_ms) for s in saves] == [120, 50, 120]
    assert [round(s.background_ms) for s in saves] == [0, 200, 0]
    assert save_timeline.async_blocks_less(saves)
    assert not save_timeline.async_blocks_less(save_timeline.blocked(_result(120, 130)))
    assert not save_timeline.async_blocks_less(save_timeline.blocked(_result(120, 120)))
    assert "training blocked" in save_timeline.table(saves)


def test_the_save_timeline_draws_both_kinds():
    fig = save_timeline.plot_saves(_result(120, 50))
    assert [ax.get_title().split(":")[0] for ax in fig.axes] == ["sync save at step 10", "async save at step 20"]


def test_steps_beside_an_async_write_are_told_from_the_others():
    # the async save at step 20 returns at 102.05 s and commits at 102.25 s: steps 20-22 overlap its write
    result = _result(120, 50)
    for r in result["ranks"]:
        r["steps"] = [(i, a, b + (0.04 if i in (21, 22) else 0.0)) for i, a, b in r["steps"]]  # 120 ms, not 80
    during, other, n = save_timeline.steps_during_writes(result)
    assert (n, round(during), round(other)) == (6, 120, 80)
    assert round(save_timeline.write_slowdown_ms(result)) == 80  # steps 21 and 22 took 40 ms more, on each rank
    saves = save_timeline.blocked(result)  # 50 ms blocked + 80 ms slower steps = 130 ms, against the sync save's 120
    line = save_timeline.totals_line(result, saves, cores=2, gpu=False)
    assert "cost the training 130 ms, more than the fastest sync save's 120 ms" in line
    assert "did not pay here: the write ran on the same 2 CPU core(s) as the 2 training ranks" in line
    assert "the CPU that writes also feeds the GPUs" in save_timeline.totals_line(result, saves, cores=2, gpu=True)
    quick = save_timeline.blocked(_result(120, 50))  # no step slowed: 50 ms in all
    assert "async paid here" in save_timeline.totals_line(_result(120, 50), quick, cores=2, gpu=False)
    for r in result["ranks"]:  # a sync save's steps are never "beside a write": it had committed when it returned
        r["saves"] = [s for s in r["saves"] if s["mode"] == "sync"]
    during, other, n = save_timeline.steps_during_writes(result)
    assert n == 0 and round(other) == 80 and during != during  # nan: no step overlapped a write
    assert save_timeline.write_slowdown_ms(result) == 0


def test_a_gap_inside_the_steps_spread_is_too_close_to_call():
    # the other steps alternate 70 and 90 ms (interquartile range 20 ms); 3 steps per rank overlap the async write
    result = _result(120, 50)
    for r in result["ranks"]:
        r["steps"] = [(i, a, a + (0.1 if 20 <= i <= 22 else 0.07 if i % 2 else 0.09)) for i, a, _ in r["steps"]]
    spread = save_timeline.slowdown_spread_ms(result)
    assert spread == pytest.approx(3 * 20)
    total = 50 + save_timeline.write_slowdown_ms(result)

    def saves(sync_ms):
        return [save_timeline.Save(10, "sync", sync_ms, 0), save_timeline.Save(20, "async", 50, 200)]

    close = save_timeline.totals_line(result, saves(total + 3), cores=2, gpu=False)  # 3 ms: noise, not a finding
    assert "too close to call on this run: the 3 ms between them" in close and "paid" not in close
    assert "async paid here" in save_timeline.totals_line(result, saves(total + 200), cores=2, gpu=False)
    assert "did not pay" in save_timeline.totals_line(result, saves(total - 200), cores=2, gpu=False)
    assert save_timeline.slowdown_spread_ms(_result(120, 50)) == 0  # steady steps: any gap is a verdict


def test_the_median_of_an_even_count_is_the_mean_of_the_middle_two():
    # chapter 07's run: 2 steps per rank beside the write (102.05-102.25 s), 176, 68 ms (rank 0) and 181, 65 ms
    # (rank 1). The upper middle value (176 ms, what sorted(xs)[n // 2] gives) is not their median: 122 ms
    result = _result(120, 50)
    times = {0: {21: 0.176, 22: 0.068}, 1: {21: 0.181, 22: 0.065}}
    for r in result["ranks"]:
        r["steps"] = [(i, a, a + times[r["rank"]].get(i, 0.08)) for i, a, _ in r["steps"]]
        r["steps"] = [(i, a, a + (0.02 if i == 20 else b - a)) for i, a, b in r["steps"]]  # step 20: ends early
    beside = save_timeline.steps_beside_writes(result)
    during, other, n = save_timeline.steps_during_writes(result)
    assert n == sum(map(len, beside)) and round(other) == 80
    assert during == pytest.approx(statistics.median([ms for xs in beside for ms in xs]))
    assert beside == [pytest.approx([176, 68]), pytest.approx([181, 65])] and round(during) == 122
    assert during != sorted(ms for xs in beside for ms in xs)[n // 2]  # a wrong median fails here
    line = save_timeline.beside_writes_line(result)
    assert f"took {during:.0f} ms (median)" in line and f"{during / other:.2f}x the 80 ms" in line
    assert "rank 0: " in line and "176, 68 ms" in line and "181, 65 ms" in line


def test_a_served_score_matches_only_with_the_same_answers():
    same = served_score.Score(0.5, 1.2, 0.5, 1.2 * (1 + 2e-7), 400)
    assert same.matches
    assert not served_score.Score(0.5, 1.2, 0.5025, 1.2, 400).matches  # one text answered otherwise
    assert not served_score.Score(0.5, 1.2, 0.5, 1.2001, 400).matches  # a loss 1e-4 off: another model
    assert "served from the converted file" in same.table()


def _kill_events():
    """Attempt 0: 2 ranks start at 0 s, one step per 0.1 s from 1 s; rank 1 killed after step 5. Attempt 1 starts at
    3 s, resumes at step 4, steps from 5 s on."""
    ev = []
    for r in range(2):
        ev.append({"event": "start", "rank": r, "attempt": 0, "t": 0.0})
        ev += [{"event": "step", "rank": r, "attempt": 0, "t": 1 + 0.1 * i} for i in range(1, 6 if r == 1 else 5)]
        ev.append({"event": "start", "rank": r, "attempt": 1, "t": 3.0})
        ev += [{"event": "step", "rank": r, "attempt": 1, "t": 5 + 0.1 * i} for i in range(1, 7)]
    ev.append({"event": "fault", "rank": 1, "attempt": 0, "t": 1.55, "kind": "kill"})
    return sorted(ev, key=lambda e: e["t"])


def test_the_kill_story_reads_the_timeline():
    story = fault_timeline.kill_story(_kill_events(), total_steps=10, every=2)
    assert story.kill == (pytest.approx(1.55), 5) and story.killed_rank == 1
    assert story.resumed_step == 4 and story.redone == 1  # 6 steps in attempt 1 of 10: it resumed at step 4
    assert story.restart_s == pytest.approx(3.0 - 1.55)  # to the restarted processes' start
    assert story.back_s == pytest.approx(5.1 - 3.0)  # to the end of step 5, the redone one
    assert story.lost_s == pytest.approx(5.1 - 1.55) and story.step_s == pytest.approx(0.1)
    assert max(s for _, s in story.lines[(1, 0)]) == 10
    wrong = fault_timeline.kill_story(_kill_events(), total_steps=12, every=2)  # a longer run: it resumed elsewhere
    assert wrong.resumed_step == 6 and wrong.redone == -1
    uneven = [e for e in _kill_events() if not (e["attempt"] == 1 and e["rank"] == 1 and e["t"] > 5.55)]
    with pytest.raises(ValueError, match="different numbers of steps"):
        fault_timeline.kill_story(uneven, total_steps=10, every=2)
    assert fault_timeline.plot_kill_and_resume(story).axes[0].get_ylabel() == "optimizer steps done"


class _Env:
    n_gpus, nproc, smoke, preset = 0, 2, True, "cpu_smoke"


def test_run_bs_claims_fail_on_a_wrong_log(tmp_path):
    plan = resume_demo.demo_plan(_Env(), 60)
    run_dir, ckpt = tmp_path / "run_b", tmp_path / "run_b" / "model.pt"
    ckpt.parent.mkdir()
    torch.save({"state_dict": {"w": torch.zeros(2), "b": torch.zeros(1)}}, ckpt)
    start = f"preset {plan.recipe[1]} | world size {plan.nproc}"
    log = "\n".join(
        [
            start,
            f"[rank 1] injected fault: kill after step {plan.kill_step}",
            "I1207 01:00:00.000000 123 agent.py:1] failed (exitcode: -9) local_rank: 1 (pid: 9)",
            "will restart worker group",
            start,
            f"resumed from {run_dir / 'snapshots' / plan.expected_snap} (epoch 1, 32 batches into it, step 32)",
        ]
    )
    claims = resume_demo.restart_claims(log, plan, run_dir, ckpt)
    assert all(c.holds for c in claims) and "loads: 2 tensors" in claims[-1].text
    wrong = log.replace(plan.expected_snap, "snap_e001_b000016.pt")  # resumed from an older snapshot
    assert [c.holds for c in resume_demo.restart_claims(wrong, plan, run_dir, ckpt)] == [True] * 3 + [False, True]
    once = log.replace(start, "", 1)  # the script never started again
    assert not resume_demo.restart_claims(once, plan, run_dir, ckpt)[2].holds
    assert not resume_demo.restart_claims(log, plan, run_dir, tmp_path / "none.pt")[-1].holds


def test_the_hang_demos_claims_fail_on_a_wrong_ending():
    log = (
        "[rank 1] injected fault: hang after step 2\nerror: [rank 0] a collective operation could not complete: ... or"
        " skipped a collective\nI1207 01:00:00.000000 1 api.py:1] failed (exitcode: 3) local_rank: 0 (pid: 9)"
    )
    assert all(c.holds for c in resume_demo.hang_claims(log, 1, False))
    assert [c.holds for c in resume_demo.hang_claims(log, 1, True)] == [True, False, True, True]  # the backstop
    assert not resume_demo.hang_claims(log.replace("exitcode: 3", "exitcode: 1"), 1, False)[3].holds


def test_run_b_log_readers():
    killed = "...\n[default0]:x\nI1207 01:00:00.000000 123 agent.py:1] failed (exitcode: -9) local_rank: 1 (pid: 9)"
    early = "I1207 01:00:00.000000 123 agent.py:1] failed (exitcode: 3) local_rank: 0 (pid: 9)"
    crashed = "I1207 01:00:00.000000 123 agent.py:1] failed (exitcode: 1) local_rank: 1 (pid: 9)"  # not a kill
    assert resume_demo.group_failed(killed) and resume_demo.group_failed(early)
    assert not resume_demo.group_failed(crashed) and not resume_demo.group_failed("no failure at all")
    assert resume_demo.resumed_step("resumed from out/snapshots/snap_e001_b000032.pt (epoch 1") == 32
    line = "resumed from out/snapshots/snap_e002_b000046.pt (epoch 2, 92 batches into it, step 192)"
    assert resume_demo.resumed_at(line) == (92, 192)
    with pytest.raises(ValueError, match="no 'resumed from"):
        resume_demo.resumed_at("resume auto: no snapshot")
    assert resume_demo.start_epoch(line) == 2  # resumed into epoch 2: not 1
    fresh = "warning: x is unreadable\nresume auto: no readable snapshot in run/snapshots; starting from the beginning"
    assert resume_demo.start_epoch(fresh) == 1 and resume_demo.start_epoch("epoch 1/1 | train loss 1.2") is None
    assert "should resume from" not in resume_demo.demo_plan(_Env(), 60).describe()  # exercise 0's answer is not given
    story = resume_demo.story("preset cpu_smoke | world size 2\nepoch 1/2 | ok\n" + killed)
    assert story == ["epoch 1/2 | ok", "...", "[default0]:x", "torchrun: failed (exitcode: -9) local_rank: 1 (pid: 9)"]
    # what run B's log showed: rank 0's error, rank 1's SIGKILL, and the agent's SIGTERM to rank 0 (pid 15702)
    agent_stopped = (
        "error: [rank 0] a collective operation could not complete\n"
        "torchrun: Sending process 15702 closing signal SIGTERM\n"
        "torchrun: failed (exitcode: -9) local_rank: 1 (pid: 15703) of binary: python"
    )
    said = resume_demo.who_noticed(agent_stopped)
    assert "rank 0 saw the dropped connection" in said and "local rank 1 (pid 15703) failed first, exit code -9" in said
    assert "stopped rank 0 (pid 15702) with SIGTERM" in said and "code 3" not in said
    said = resume_demo.who_noticed(early)  # rank 0 ended first: its own code, and no SIGTERM claimed
    assert "rank 0 ended on its own, with exit code 3" in said and "SIGTERM" not in said
    assert "never reached its next all-reduce" in said  # no error line in that log


def test_fsdp2_cuts_rows_as_torch_chunk_does():
    assert shard_layout.fsdp2_rows(30522, 2) == [(0, 15261), (15261, 30522)]
    assert shard_layout.fsdp2_rows(10, 4) == [(0, 3), (3, 6), (6, 9), (9, 10)]
    assert shard_layout.fsdp2_rows(2, 4) == [(0, 1), (1, 2), (2, 2), (2, 2)]  # the last ranks hold nothing
    for n, world in ((30522, 3), (64, 4), (5, 2)):
        chunks = torch.arange(n).chunk(world)
        assert [(int(c[0]), int(c[-1]) + 1) for c in chunks] == [
            r for r in shard_layout.fsdp2_rows(n, world) if r[1] > r[0]
        ]


def test_the_unstaged_writer_writes_the_step_after_and_the_course_save_the_step_before(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 4))

    class Out:
        def __init__(self, loss):
            self.loss = loss

    class Wrapped(torch.nn.Module):  # the demo calls model(**batch).loss, as with a transformers model
        def __init__(self):
            super().__init__()
            self.net = model

        def forward(self, x, y):
            return Out(torch.nn.functional.cross_entropy(self.net(x), y))

    wrapped = Wrapped()
    hazard = async_hazard.written_values(
        wrapped, torch.optim.SGD(wrapped.parameters(), lr=0.5), {"x": torch.randn(4, 8), "y": torch.arange(4)}, tmp_path
    )
    assert hazard.before != hazard.after and hazard.changed == 2  # the linear layer's weight and bias
    assert hazard.unstaged_wrote == "after the step" and hazard.staged_wrote == "before the step", hazard.table()
    assert hazard.unstaged_as == {"before": 0, "after": 2} and hazard.staged_as == {"before": 2, "after": 0}

    class CopyStager(async_hazard.NoCopyStager):  # a stager that copies: the unstaged path no longer shows the hazard
        def stage(self, state_dict):
            return {"model": {k: v.clone() for k, v in state_dict["model"].items()}}

    mended = async_hazard.written_values(
        wrapped,
        torch.optim.SGD(wrapped.parameters(), lr=0.5),
        {"x": torch.randn(4, 8), "y": torch.arange(4)},
        tmp_path / "mended",
        stager=CopyStager(),
    )
    assert mended.unstaged_wrote == "before the step" == mended.staged_wrote, mended.table()
