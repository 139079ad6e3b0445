"""Pitfall 4: saving the DDP wrapper instead of the model.

DDP keeps your model in `.module`, so ddp_model.state_dict() names every tensor `module.<name>`.
That file does not load into the bare model that inference (or a single-GPU script) builds.
Fix: rank 0 saves unwrap(model).state_dict(); the other ranks wait at a barrier; everyone loads
with map_location (a GPU-saved tensor would otherwise go back to the GPU it came from).
"""

import argparse
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from distrinews_course.demo import finish, result, start, write_json
from distrinews_lib.checkpoint import unwrap

p = argparse.ArgumentParser()
p.add_argument("--mode", choices=["broken", "fixed", "both"], default="both")
p.add_argument("--dir", default="outputs/pitfalls/04_ckpt")
p.add_argument("--out", default="outputs/pitfalls/04_save_wrapper.json")
args = p.parse_args()

ctx = start()
Path(args.dir).mkdir(parents=True, exist_ok=True)


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


ddp = DDP(make_model().to(ctx.device), device_ids=ctx.device_ids)
ddp(torch.randn(4, 8, device=ctx.device)).sum().backward()
with torch.no_grad():
    for p_ in ddp.parameters():
        p_ -= 0.1 * p_.grad  # one step, so the weights differ from a fresh model

report = {}
for mode in (["broken", "fixed"] if args.mode == "both" else [args.mode]):
    path = Path(args.dir) / f"{mode}.pt"
    if ctx.rank == 0:
        state = ddp.state_dict() if mode == "broken" else unwrap(ddp).state_dict()  # THE FIX: unwrap
        torch.save(state, path)
    dist.barrier()  # the others wait until rank 0 has written the file
    state = torch.load(path, map_location=ctx.device, weights_only=True)
    bare = make_model().to(ctx.device)  # what an inference server builds
    try:
        bare.load_state_dict(state)      # strict=True by default
        error = None
        same = all(torch.equal(a, b) for a, b in zip(bare.parameters(), unwrap(ddp).parameters()))
    except RuntimeError as err:
        error, same = " ".join(str(err).split())[:200], False
    keys = list(state)
    result(ctx, mode=mode, module_prefixed_keys=sum(k.startswith("module.") for k in keys), loads=error is None)
    report[mode] = {"keys": keys, "module_prefixed": sum(k.startswith("module.") for k in keys),
                    "loads_into_bare_model": error is None, "error": error, "weights_match": same}
    if mode == "broken":
        # Rescue for an old file: strip the prefix, then it loads.
        from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present
        consume_prefix_in_state_dict_if_present(state, "module.")
        rescued = make_model().to(ctx.device)
        try:
            rescued.load_state_dict(state)  # strict: every key must match
            loads = all(torch.equal(a, b) for a, b in zip(rescued.parameters(), unwrap(ddp).parameters()))
            report[mode].update(loads_after_stripping_prefix=True, rescued_weights_match=loads)
        except RuntimeError as err:
            report[mode].update(loads_after_stripping_prefix=False, rescued_weights_match=False,
                                rescue_error=" ".join(str(err).split())[:200])
    dist.barrier()
write_json(args.out, {"world_size": ctx.world, **report}, ctx.rank)
del ddp  # free the DDP model before the process group goes (see distrinews_course.demo.finish)
finish()
