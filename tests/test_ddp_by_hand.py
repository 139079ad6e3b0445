"""Chapter 03's ladder (scripts/by_hand/): every rung against torch's DDP on real gloo processes, and what the learner
sees when an exercise is wrong: a message naming the problem, never a hang."""

import time

import pytest

from distrinews_lib.course import by_hand
from distrinews_lib.course.launch import LaunchError


@pytest.mark.slow
def test_every_rung_trains_bit_identically_to_torch_ddp(tmp_path):
    res = by_hand.run_race(["--models", "tiny", "--check_steps", 2, "--check_only"], tmp_path / "race.json")
    rungs = res["check"]["tiny"]
    for rung in by_hand.RUNGS:
        assert rungs[rung]["first_diff"] is None and rungs[rung]["max_weight_diff"] == 0.0, (rung, rungs[rung])
    assert rungs["naive"]["allreduces_per_step"] == rungs["naive"]["params"]
    assert rungs["flat"]["allreduces_per_step"] == 1
    assert rungs["zero1"]["optimizer_state_bytes"] * 2 == pytest.approx(rungs["ddp"]["optimizer_state_bytes"], rel=1e-4)


def _exercise(tmp_path, name, body):
    path = tmp_path / f"{name}.py"
    path.write_text("import torch\nimport torch.distributed as dist\n\n\n" + body)
    return path


def test_a_blank_exercise_launches_nothing(tmp_path, capsys):
    path = _exercise(tmp_path, "blank", "def on_grad_ready(param, dp):\n    raise NotImplementedError\n")
    assert by_hand.check_exercise("overlapped", path) is None
    assert "still the blank" in capsys.readouterr().out


@pytest.mark.slow
def test_a_hook_that_never_launches_is_named(tmp_path):
    path = _exercise(tmp_path, "lazy", "def on_grad_ready(param, dp):\n    param.grad.div_(dp.world)\n")
    with pytest.raises(AssertionError, match="0 all-reduces launched by the hook; never launched"):
        by_hand.check_exercise("overlapped", path, out_dir=tmp_path)


@pytest.mark.slow
def test_a_bucket_launched_too_early_is_named(tmp_path):
    body = ("def on_grad_ready(param, dp):\n    i = dp.bucket_of[param]\n    dp.ready[i] += 1\n"
            "    if dp.ready[i] == len(dp.buckets[i]) - 1:  # one too early\n        dp.launch(i)\n")
    with pytest.raises(AssertionError, match=r"bucket \d+ (launched before its gradient|was never launched)"):
        by_hand.check_exercise("bucketed", _exercise(tmp_path, "early", body), out_dir=tmp_path)


@pytest.mark.slow
def test_a_wrong_average_names_the_step_and_parameter(tmp_path):
    body = ("def on_grad_ready(param, dp):\n    work = dist.all_reduce(param.grad, async_op=True)  # forgot to divide\n"
            "    dp.pending.append((param, work))\n")
    with pytest.raises(AssertionError, match=r"step 1, parameter \S+ differs"):
        by_hand.check_exercise("overlapped", _exercise(tmp_path, "sum", body), out_dir=tmp_path)


@pytest.mark.slow
def test_a_rank_skipping_a_collective_fails_fast_with_a_message(tmp_path):
    body = ("def sharded_step(dp, optimizer):\n    grads = dp.flatten([p.grad for p in dp.params]).div_(dp.world)\n"
            "    dp.shard.grad = torch.empty_like(dp.shard)\n    dist.reduce_scatter_tensor(dp.shard.grad, grads)\n"
            "    optimizer.step()\n    optimizer.zero_grad(set_to_none=True)\n    weights = torch.empty_like(grads)\n"
            "    if dist.get_rank() == 0:  # rank 1 skips the all-gather\n"
            "        dist.all_gather_into_tensor(weights, dp.shard.detach())\n    dp.unflatten(weights)\n")
    path = _exercise(tmp_path, "skip", body)
    start = time.monotonic()
    with pytest.raises(LaunchError, match="collective"):
        by_hand.run_race(["--rungs", "zero1", "--models", "tiny", "--exercise", f"zero1:{path}", "--check_only",
                          "--timeout_s", 5], tmp_path / "r.json", timeout=120)
    assert time.monotonic() - start < 100
