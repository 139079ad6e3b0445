"""Chapter 05 shows levers.with_levers as the levers' code a learner copies: it must run, and sync once per step."""

import gc
from types import SimpleNamespace

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from distrinews_course.bench import levers


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 2)

    def forward(self, x, y):
        return SimpleNamespace(loss=torch.nn.functional.cross_entropy(self.lin(x), y))


def test_the_levers_code_trains_and_all_reduces_once_per_optimizer_step(tmp_path, monkeypatch):
    calls = []
    fp16 = default_hooks.fp16_compress_hook

    def counted(state, bucket):  # DDP wants the parameter named `bucket`
        calls.append(1)
        return fp16(state, bucket)

    monkeypatch.setattr(default_hooks, "fp16_compress_hook", counted)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        for powersgd in (False, True):
            torch.manual_seed(0)
            model, steps = Tiny(), []
            before = model.lin.weight.detach().clone()
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            step = opt.step
            opt.step = lambda: steps.append(1) or step()
            batches = [dict(x=torch.randn(8, 4), y=torch.randint(0, 2, (8,))) for _ in range(8)]
            ddp = levers.with_levers(model, batches, opt, accum=4, powersgd=powersgd)
            assert len(steps) == 2 and not torch.equal(ddp.module.lin.weight, before)
        assert len(calls) == 2  # fp16's hook ran once per optimizer step: no_sync skipped the other 6 micro-batches
    finally:
        # Drop every DDP (its Reducer) while the group still lives. A Reducer freed after destroy_process_group
        # holds the last reference to the group, whose destructor then joins gloo's threads with the GIL held; a
        # thread still letting go of a Python comm hook's finished work needs that GIL: a deadlock (it hung CI).
        model = ddp = None
        gc.collect()
        assert not [o for o in gc.get_objects() if isinstance(o, DDP)], "a DDP outlived its test"
        dist.destroy_process_group()
