"""Chapter 07's checks of run B and its snapshots (distrinews_course.resume_claims), each fed the figures a good run
writes, then one wrong figure that must fail its claim."""

import copy

import torch

from distrinews_course import fault_timeline, resume_demo
from distrinews_course import resume_claims as rc
from distrinews_lib.training.snapshot import SNAPSHOT_VERSION


class _Env:
    n_gpus, nproc, smoke, preset = 0, 2, True, "cpu_smoke"


PLAN = resume_demo.demo_plan(_Env(), 60)


def _states():
    g = torch.Generator().manual_seed(0)
    initial = {"w": torch.randn(4, 3, generator=g), "b": torch.zeros(3)}
    trained = {k: v + 0.1 for k, v in initial.items()}
    return initial, trained, {k: v.clone() for k, v in trained.items()}


def test_weights_must_be_bit_identical_on_the_cpu_and_moved_by_training():
    initial, sa, sb = _states()
    wm = rc.weights_match(sa, sb, initial, False, 0.05)
    assert all(c.holds for c in wm.claims) and "2/2 tensors bit-identical" in wm.text
    sb["w"][0, 0] = torch.nextafter(sb["w"][0, 0], torch.tensor(9.0))  # one float's last bit
    assert [c.holds for c in rc.weights_match(sa, sb, initial, False, 0.05).claims] == [True, False]
    assert not rc.weights_match(sa, sa, sa, False, 0.05).claims[0].holds  # nothing trained: equal proves nothing
    assert not rc.weights_match(sa, {"w": sa["w"]}, initial, False, 0.05).claims[0].holds  # a tensor lost


def test_on_gpus_run_b_must_end_within_the_tolerance_of_the_distance_moved():
    initial, sa, sb = _states()
    sb["w"] = sb["w"] + 0.001  # well inside 5% of what training moved
    assert all(c.holds for c in rc.weights_match(sa, sb, initial, True, 0.05).claims)
    sb["w"] = sb["w"] + 0.05  # as far as a lost optimizer state would take it
    assert [c.holds for c in rc.weights_match(sa, sb, initial, True, 0.05).claims] == [True, False]


def _metrics():
    row = lambda e, resumed: {"epoch": e, "optimizer_steps": PLAN.steps, "train_loss": 1.0 / e, "val_loss": 1.1 / e,
                              "epoch_time_s": 3.0 + e, "samples_per_s": 100.0 * e, "resumed": resumed}  # fmt: skip
    m_a = {"epochs": [row(1, False), row(2, False)]}
    m_b = {"epochs": [row(1, True), row(2, False)]}
    m_b["epochs"][0]["epoch_time_s"] = 9.9  # timings differ: never compared
    return m_a, m_b


def test_run_bs_metrics_must_cover_every_step_and_equal_run_as():
    m_a, m_b = _metrics()
    assert all(c.holds for c in rc.metrics_claims(m_a, m_b, PLAN))
    assert (
        "train loss B" in rc.metrics_table(m_a, m_b).splitlines()[0]
        and len(rc.metrics_table(m_a, m_b).splitlines()) == 3
    )
    wrong = copy.deepcopy(m_b)
    wrong["epochs"][1]["train_loss"] += 1e-9
    assert [c.holds for c in rc.metrics_claims(m_a, wrong, PLAN)] == [True, False]
    short = copy.deepcopy(m_b)
    short["epochs"][0]["optimizer_steps"] = PLAN.steps - PLAN.kill_step  # counted only the restarted attempt's steps
    assert not rc.metrics_claims(m_a, short, PLAN)[0].holds
    a_losses = [round(0.9 - 0.001 * i, 5) for i in range(PLAN.steps)]
    m_a["epochs"][0]["step_losses"] = a_losses
    m_b["epochs"][0]["step_losses"] = a_losses[PLAN.snap_step :]  # the launch that resumed ran only these
    assert all(c.holds for c in rc.metrics_claims(m_a, m_b, PLAN))
    m_b["epochs"][0]["step_losses"] = a_losses[PLAN.snap_step - 1 : -1]  # one step off: not A's trajectory
    assert [c.holds for c in rc.metrics_claims(m_a, m_b, PLAN)] == [True, False]
    m_b["epochs"][0]["step_losses"] = a_losses[PLAN.snap_step :]
    unmarked = copy.deepcopy(m_b)
    unmarked["epochs"][0]["resumed"] = False
    assert not rc.metrics_claims(m_a, unmarked, PLAN)[0].holds


def _snapshot(path, step, meters, size=5000):
    torch.save({"snapshot_version": SNAPSHOT_VERSION, "global_step": step, "batches_done": 46, "world_size": 2,
                "scheduler": {"last_epoch": step}, "rng": [{}, {}], "meters": meters,
                "model": {"pad": torch.zeros(size)}}, path)  # fmt: skip


def _run(tmp_path):
    folder = tmp_path / "snapshots"
    folder.mkdir()
    model = tmp_path / "model.pt"
    torch.save({"w": torch.zeros(1000)}, model)
    mid, end = folder / "snap_e002_b000046.pt", folder / f"snap_e{PLAN.epochs + 1:03d}_b000000.pt"
    _snapshot(mid, 96, [{"batches": 46}, {"batches": 46}])
    _snapshot(end, 100, None)
    return [mid, end], model


def test_the_snapshot_facts_fail_on_a_wrong_file(tmp_path):
    snaps, model = _run(tmp_path)
    assert all(c.holds for c in rc.snapshot_claims(snaps, model, PLAN))
    assert not rc.snapshot_claims(snaps[1:], model, PLAN)[0].holds  # only one kept
    _snapshot(snaps[0], 96, [{"batches": 46}, {"batches": 46}], size=1000)  # no room for AdamW's moments
    assert not rc.snapshot_claims(snaps, model, PLAN)[1].holds
    _snapshot(snaps[0], 96, [{"batches": 46}, {"batches": 45}])  # rank 1's totals a batch behind
    assert [c.holds for c in rc.snapshot_claims(snaps, model, PLAN)] == [True, True, True, False]
    _snapshot(snaps[0], 96, [{"batches": 46}, {"batches": 46}])
    _snapshot(snaps[1], 99, None)  # the scheduler one step off the steps taken
    torch.save({**torch.load(snaps[1]), "global_step": 100}, snaps[1])
    assert not rc.snapshot_claims(snaps, model, PLAN)[2].holds


def test_the_fallback_facts_fail_on_a_wrong_rescale_or_a_file_left_damaged(tmp_path):
    snaps, _ = _run(tmp_path)
    damaged, previous = snaps[1], snaps[0]
    prev = torch.load(previous)
    _snapshot(damaged, 192, None)
    torch.save({**torch.load(damaged), "world_size": 1}, damaged)
    out = (
        f"warning: snapshot {damaged} is unreadable (...) resume: the snapshot was taken with 2 process(es), this run "
        f"has 1; ... will not be bit-identical to an uninterrupted run resumed from {previous} (epoch 2, 92 batches "
        "into it, step 192)"
    )
    last = {"train_samples": PLAN.n, "resumed": True}
    assert all(c.holds for c in rc.fallback_claims(out, last, prev, damaged, previous, PLAN))
    unscaled = out.replace("92 batches into it, step 192", "46 batches into it, step 96")  # not rescaled to 1 rank
    assert not rc.fallback_claims(unscaled, last, prev, damaged, previous, PLAN)[2].holds
    assert not rc.fallback_claims(out, {**last, "train_samples": PLAN.n // 2}, prev, damaged, previous, PLAN)[2].holds
    quiet = out.replace("will not be bit-identical", "is identical")
    assert not rc.fallback_claims(quiet, last, prev, damaged, previous, PLAN)[1].holds
    damaged.write_bytes(damaged.read_bytes()[:100])  # still cut: never replaced
    assert [c.holds for c in rc.fallback_claims(out, last, prev, damaged, previous, PLAN)] == [True, True, True, False]


def test_the_plan_picture_resumes_from_the_newest_snapshot_before_the_kill():
    p = fault_timeline.resume_plan(50, 2, 16, 33)
    assert p["attempt 0"] == (0, 33) and p["attempt 1"] == (32, 100) and p["redone"] == (32, 33)
    assert p["snapshots"] == [16, 32, 48, 50, 64, 80, 96, 100] and p["epoch ends"] == [50, 100]
    assert fault_timeline.resume_plan(50, 2, 16, 55)["attempt 1"][0] == 50  # the epoch's end was written last
    assert fault_timeline.resume_plan(50, 2, 16, 48)["redone"] == (48, 48)  # killed right after a snapshot
    assert fault_timeline.resume_plan(50, 2, 16, 10)["attempt 1"][0] == 0  # no snapshot yet: from the beginning
    fig = fault_timeline.plot_resume_plan(PLAN)
    bars = [(b.get_x(), b.get_width()) for b in fig.axes[0].patches]
    k, snap = PLAN.kill_step, PLAN.snap_step
    assert bars[:3] == [(0, k), (snap, PLAN.steps * PLAN.epochs - snap), (snap, k - snap)]  # drawn as planned


def test_the_snapshot_look_names_an_epoch_end_by_the_epoch_it_ends(tmp_path):
    end = tmp_path / "snap_e003_b000000.pt"
    torch.save({"snapshot_version": SNAPSHOT_VERSION, "global_step": 100, "batches_done": 0, "world_size": 2,
                "epoch": 3, "scheduler": {"last_epoch": 100}, "rng": [{"torch": 0}, {"torch": 0}], "meters": None,
                "model": {"w": torch.zeros(2)}, "optimizer": {"state": {0: {"step": 1}}}}, end)  # fmt: skip
    lines = resume_demo.snapshot_contents(end)
    assert "epoch 3, batch 0" in lines[0] and "at the end of epoch 2" in lines[1]
    mid = tmp_path / "snap_e002_b000046.pt"
    torch.save({**torch.load(end, weights_only=False), "epoch": 2, "batches_done": 46, "meters": [{}, {}]}, mid)
    assert not any("end of epoch" in line for line in resume_demo.snapshot_contents(mid))  # a mid-epoch one
    code = resume_demo.snapshot_code()  # the library's own lines, from the save to the RNG states' return
    assert "def save(" in code and code.rstrip().endswith("set_rng_state(rngs[snap.rank])")
