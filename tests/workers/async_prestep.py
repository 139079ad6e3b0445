"""Worker (2 gloo ranks, a model sharded with FSDP2): an async save whose write is held until the next optimizer step
is done. The course's save (sharded_checkpoint.save: async_save with staging) must write the values of before the
step; async_save without staging writes those after it. Rank 0 prints one JSON line: what each path wrote."""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from distrinews_course.async_hazard import save_then_step
from distrinews_lib import sharded_checkpoint

out = Path(sys.argv[1])
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank, group = dist.get_rank(), dist.new_group(backend="gloo")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
mesh = init_device_mesh("cpu", (dist.get_world_size(),))
for layer in (model[0], model[2]):
    fully_shard(layer, mesh=mesh)
fully_shard(model, mesh=mesh)
opt = torch.optim.AdamW(model.parameters(), lr=0.1)
x, y = torch.randn(8, 16, generator=torch.Generator().manual_seed(rank)), torch.arange(8) % 4


def backward():
    torch.nn.functional.cross_entropy(model(x), y).backward()


def step():
    opt.step()
    opt.zero_grad()


def whole():
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


backward()
step()  # AdamW has state from here on
verdict = {}
for name, staged in (("staged", True), ("unstaged", False)):
    backward()
    before = whole()
    msd, osd = get_state_dict(model, opt)
    save_then_step({"model": msd, "optim": osd}, out / name, step, staged=staged, group=group)
    after = whole()
    dist.barrier()
    if rank == 0:
        folder = sharded_checkpoint.folder_for(out / name, 1) if staged else out / name
        written = sharded_checkpoint.read_whole(folder, keys={"model"}, check=staged)["model"]
        verdict[name] = {
            "before": all(torch.equal(written[k], before[k]) for k in before),
            "after": all(torch.equal(written[k], after[k]) for k in after),
            "moved": any(not torch.equal(before[k], after[k]) for k in before),
        }
if rank == 0:
    print("VERDICT " + json.dumps(verdict), flush=True)
dist.destroy_process_group()
