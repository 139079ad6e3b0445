"""Train the classifier sharded with FSDP2, saving Distributed Checkpoints (DCP) that resume on ANY number of ranks.

    torchrun --standalone --nproc_per_node=2 scripts/train_sharded.py --output outputs/sharded/run2
    torchrun --standalone --nproc_per_node=4 scripts/train_sharded.py --output outputs/sharded/run4 \
        --resume outputs/sharded/run2/step_00000020

Every rank saves only its own shards; a load on another world size reads the byte ranges of its new shards. The
global batch is fixed and its order is drawn before it is split among the ranks, so step s trains on the same
examples on 1, 2 or 4 ranks. Dropout is off: a rank's random stream has no counterpart on another number of ranks.
"""
import json
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.elastic.multiprocessing.errors import record
from torch.distributed.fsdp import fully_shard

from distrinews_lib import distributed as D
from distrinews_lib import sharded_checkpoint as ckpt
from distrinews_lib import sharded_run
from distrinews_lib.data import sources
from distrinews_lib.errors import UserError, main_guard
from distrinews_lib.models.build import build_model
from distrinews_lib.training.config import RunConfig
from distrinews_lib.training.snapshot import rng_state, set_rng_state


class GlobalOrderSampler:
    """The examples of this rank at each step: global batch `step` of an order drawn from (seed, epoch) alone, cut
    into one slice per rank. The order never depends on the world size; only the cut does."""

    def __init__(self, n, global_batch, seed, rank, world):
        if global_batch % world:
            raise UserError(f"--global_batch {global_batch} does not split evenly among {world} ranks: pick a "
                            f"multiple of {world}, so every step trains on the same {global_batch} examples.")
        self.n, self.batch, self.seed = n, global_batch, seed
        self.per_rank, self.rank = global_batch // world, rank
        self.steps_per_epoch = n // global_batch  # an epoch's last, partial global batch is dropped

    def indices(self, step):
        epoch, b = divmod(step, self.steps_per_epoch)
        order = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed + epoch))  # the global order
        batch = order[b * self.batch:(b + 1) * self.batch]                                          # global batch b
        return batch[self.rank * self.per_rank:(self.rank + 1) * self.per_rank]                    # this rank's slice


def sharded_model(args, mesh):
    """The tiny DistilBERT with dropout off, sharded with FSDP2: each layer, then the rest, split across the mesh."""
    model, tokenizer, _ = build_model(RunConfig(model="tiny", seed=args.seed), args.label_names)
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    model.config.update({"dropout": 0.0, "attention_dropout": 0.0, "seq_classif_dropout": 0.0})
    for layer in model.distilbert.transformer.layer:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)  # a parameter is a DTensor: each rank holds rows [r*k, (r+1)*k) of it
    return model, tokenizer, torch.optim.AdamW(model.parameters(), lr=args.lr)


@record
@main_guard
def main():
    args = sharded_run.parse_args()  # --output, --steps, --global_batch, --save_every, --async_save, --resume, ...
    torch.set_num_threads(1)
    rank, _, world, init_method = D.torchrun_env()
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    ckpt_group = dist.new_group(backend="gloo")  # async saves' own collectives: see sharded_checkpoint's docstring
    try:
        data = sources.load_dataset_splits("ag_news", sources.data_dir(args.data) or "embedded",
                                           args.num_samples, args.eval_samples, args.seed)
        args.label_names = data.label_names
        model, tokenizer, optimizer = sharded_model(args, init_device_mesh("cpu", (world,)))
        ids, mask, labels = sharded_run.tensors(tokenizer, data.train_texts, data.train_labels, args.max_length)
        sampler = GlobalOrderSampler(len(labels), args.global_batch, args.seed, rank, world)
        model_info = ckpt.describe_model(model, tokenizer, data.label_names, args.max_length,
                                         {"data": data.title, "trained_by": "scripts/train_sharded.py"})

        start, resumed_from = 0, None
        folder = ckpt.newest(args.output, log=D.print0) if args.resume == "auto" else (
            None if args.resume == "off" else Path(args.resume))
        if folder is not None:  # the resharding load: this world's shards, read from the shards of any world
            train = ckpt.load(folder, model, optimizer)
            sharded_run.check_same_run(folder, train, args, len(labels))  # the same global batch, seed and data
            if train["world_size"] == world:
                set_rng_state(train["rng"][rank])  # the same ranks: each gets its own random stream back
            start, resumed_from = train["step"], str(folder)
            D.print0(f"resumed from {folder}: step {start}, saved by {train['world_size']} rank(s), "
                     f"loaded by {world}")
        else:
            D.print0(f"no checkpoint to resume from in {args.output}: starting from the beginning")
        if rank == 0:
            ckpt.discard_partials(args.output)  # what killed saves left

        saves, pending = [], None  # each save's handle, sync or async; pending: the save still writing
        timeline = sharded_run.Timeline(model, optimizer, start)  # times each step, for the chapter's timeline
        for step in range(start, args.steps):
            idx = sampler.indices(step)
            loss = model(input_ids=ids[idx], attention_mask=mask[idx], labels=labels[idx]).loss
            loss.backward()  # FSDP2 reduce-scatters each layer's gradients: every rank keeps its shard's average
            optimizer.step()
            optimizer.zero_grad()
            if (step + 1) % args.save_every == 0 or step + 1 == args.steps:
                if pending is not None:
                    pending.wait()  # one save in flight at a time
                rngs = [None] * world
                dist.all_gather_object(rngs, rng_state())
                train = {"step": step + 1, "world_size": world, "global_batch": args.global_batch,
                         "seed": args.seed, "num_samples": len(labels), "rng": rngs}
                msd, osd = get_state_dict(model, optimizer)  # this rank's shards (DTensors): nothing is gathered
                state = {"model": msd, "optim": osd, "train": json.dumps(train), "model_info": model_info}
                use_async = args.async_save == "on" or (args.async_save == "alternate" and len(saves) % 2)
                pending = ckpt.save(state, args.output, step + 1, group=ckpt_group, async_=use_async,
                                    keep=args.keep)
                saves.append(pending)
        if pending is not None:
            pending.wait()

        sharded_run.report(args, model, tokenizer, data, timeline, saves, start, resumed_from)  # score, result.json
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    D.run_and_end(main)
