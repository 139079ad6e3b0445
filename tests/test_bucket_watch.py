"""The measuring half of chapter 00's backward demo: when each gradient was computed, and DDP's .grad against the
rank's own gradient."""

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from distrinews_course.bucket_watch import GradClock, compare_with_local, timed_allreduce


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def test_the_clock_sees_every_gradient_last_layer_first():
    model = _model()
    params, buckets = list(model.parameters()), [{"stale": True}]
    clock = GradClock(params)
    assert clock.not_ready() == 4
    step = clock.backward(model(torch.randn(3, 4)).pow(2).mean(), buckets)
    assert step["buckets"] == [] and clock.not_ready() == 0  # the last step's events are gone
    order = [i for _, i in step["grad_ready"]]
    assert sorted(order) == [0, 1, 2, 3] and max(order[:2]) > min(order[2:])  # the last layer's come first
    assert all(0 <= t <= step["backward_s"] for t, _ in step["grad_ready"])


@pytest.fixture
def group(tmp_path):
    if dist.is_initialized():
        pytest.skip("a process group is already up in this process")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_ddp_against_the_local_gradient(group):
    ddp = DDP(_model())
    params, x = list(ddp.module.parameters()), torch.randn(5, 4)
    loss = lambda m: m(x).pow(2).mean()  # noqa: E731
    loss(ddp).backward()
    good = compare_with_local(ddp, params, loss, 1)
    assert good == {"ddp_vs_mean_of_local": 0.0, "ddp_vs_local": 0.0, "same_as_rank0": True}
    ddp.zero_grad(set_to_none=True)
    loss(ddp).backward()
    params[0].grad.add_(1.0)  # a .grad that is not the gradient of the loss: the figure must show it
    bad = compare_with_local(ddp, params, loss, 1)
    assert bad["ddp_vs_local"] == pytest.approx(1.0) and bad["ddp_vs_mean_of_local"] == pytest.approx(1.0)


def test_the_timed_allreduce_averages_as_ddp_does_and_notes_its_end(group):
    ddp = DDP(_model())
    params, events = list(ddp.module.parameters()), []
    clock = GradClock(params)

    def hook(state, bucket):
        events.append({"launched": clock()})
        return timed_allreduce(bucket, events[-1], clock)

    ddp.register_comm_hook(None, hook)
    x = torch.randn(5, 4)
    step = clock.backward(ddp(x).pow(2).mean(), events)
    assert step["buckets"] and all(0 <= e["launched"] <= e["done"] <= step["backward_s"] for e in step["buckets"])
    mine = [p.grad.clone() for p in params]
    with ddp.no_sync():  # the same loss, not all-reduced: with one rank the average is the gradient itself
        ddp.zero_grad(set_to_none=True)
        ddp(x).pow(2).mean().backward()
    assert all(torch.equal(a, p.grad) for a, p in zip(mine, params))
