"""Train the classifier sharded with FSDP2, saving Distributed Checkpoints (DCP) that resume on ANY number of ranks.

    torchrun --standalone --nproc_per_node=2 scripts/train_sharded.py --output outputs/sharded/run2
    torchrun --standalone --nproc_per_node=4 scripts/train_sharded.py --output outputs/sharded/run4 \
        --resume outputs/sharded/run2/step_00000020

Every rank saves only its own shards; a load on another world size reads the byte ranges of its new shards. The
global batch is fixed and its order is drawn before it is split among the ranks, so step s trains on the same
examples on 1, 2 or 4 ranks. Dropout is off: a rank's random stream has no counterpart on another number of ranks.
"""
import argparse
import json
import time
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
from distrinews_lib.data import sources
from distrinews_lib.data.tokenization import tokenize_texts
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


def tensors(tokenizer, texts, labels, length):
    """Token ids padded to one length (the same shapes on any world size), their attention mask, the labels."""
    ids = torch.full((len(texts), length), tokenizer.pad_token_id)
    for i, row in enumerate(tokenize_texts(texts, tokenizer, length)):
        ids[i, :len(row)] = torch.tensor(row)
    return ids, (ids != tokenizer.pad_token_id).long(), torch.tensor(labels)


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


@torch.no_grad()
def evaluate(model, ids, mask, labels, rank, world, batch=100):
    """Accuracy and mean loss on held-out texts: every rank scores an equal share (FSDP2's forward is collective)."""
    model.eval()
    per = len(labels) // world
    totals = torch.zeros(2)  # [correct, loss summed over texts]
    for i in range(rank * per, (rank + 1) * per, batch):
        j = min(i + batch, (rank + 1) * per)
        out = model(input_ids=ids[i:j], attention_mask=mask[i:j], labels=labels[i:j])
        totals += torch.stack([(out.logits.argmax(-1) == labels[i:j]).sum(), out.loss * (j - i)])
    dist.all_reduce(totals)
    model.train()
    return {"val_accuracy": totals[0].item() / (per * world), "val_loss": totals[1].item() / (per * world),
            "val_texts": per * world}


def parse_args():
    p = argparse.ArgumentParser(description="FSDP2 training with sharded checkpoints (launch with torchrun).")
    p.add_argument("--output", required=True, help="the run folder: its checkpoints go to OUTPUT/step_SSSSSSSS/")
    p.add_argument("--steps", type=int, default=30, help="optimizer steps in all (global batches)")
    p.add_argument("--global_batch", type=int, default=32, help="examples per step, over all ranks together")
    p.add_argument("--save_every", type=int, default=10, help="a checkpoint every N steps, and at the end")
    p.add_argument("--async_save", choices=("off", "on", "alternate"), default="off",
                   help="on: dcp.async_save; alternate: every other save, to compare both in one run")
    p.add_argument("--keep", type=int, default=2, help="committed checkpoints to keep")
    p.add_argument("--resume", default="auto", help="auto (the newest good one in --output), off, or a step_ folder")
    p.add_argument("--num_samples", type=int, default=3200)
    p.add_argument("--eval_samples", type=int, default=400)
    p.add_argument("--max_length", type=int, default=64)
    p.add_argument("--lr", type=float, default=4e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data", default=None, help="an AG News folder (default: $DISTRINEWS_DATA_DIR, else the sample)")
    return p.parse_args()


@record
@main_guard
def main():
    args = parse_args()
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
        ids, mask, labels = tensors(tokenizer, data.train_texts, data.train_labels, args.max_length)
        sampler = GlobalOrderSampler(len(labels), args.global_batch, args.seed, rank, world)
        model_info = ckpt.describe_model(model, tokenizer, data.label_names, args.max_length,
                                         {"data": data.title, "trained_by": "scripts/train_sharded.py"})

        start, resumed_from = 0, None
        folder = ckpt.newest(args.output, log=D.print0) if args.resume == "auto" else (
            None if args.resume == "off" else Path(args.resume))
        if folder is not None:  # the resharding load: this world's shards, read from the shards of any world
            train = ckpt.load(folder, model, optimizer)
            if (train["global_batch"], train["seed"], train["num_samples"]) != (
                    args.global_batch, args.seed, len(labels)):
                raise UserError(f"{folder} was saved by a run with --global_batch {train['global_batch']}, --seed "
                                f"{train['seed']} and {train['num_samples']} texts: resume with the same.")
            if train["world_size"] == world:
                set_rng_state(train["rng"][rank])  # the same ranks: each gets its own random stream back
            start, resumed_from = train["step"], str(folder)
            D.print0(f"resumed from {folder}: step {start}, saved by {train['world_size']} rank(s), "
                     f"loaded by {world}")
        else:
            D.print0(f"no checkpoint to resume from in {args.output}: starting from the beginning")
        if rank == 0:
            ckpt.discard_partials(args.output)  # what killed saves left

        steps, saves, pending = [], [], None  # when each step ran, and each save (for the chapter's timeline)
        for step in range(start, args.steps):
            t0 = time.time()
            idx = sampler.indices(step)
            loss = model(input_ids=ids[idx], attention_mask=mask[idx], labels=labels[idx]).loss
            loss.backward()  # FSDP2 reduce-scatters each layer's gradients: every rank keeps its shard's average
            optimizer.step()
            optimizer.zero_grad()
            steps.append((step + 1, t0, time.time()))
            if (step + 1) % args.save_every == 0 or step + 1 == args.steps:
                if pending is not None:
                    pending.wait()  # one save in flight at a time
                rngs = [None] * world
                dist.all_gather_object(rngs, rng_state())
                train = {"step": step + 1, "world_size": world, "global_batch": args.global_batch,
                         "seed": args.seed, "num_samples": len(labels), "rng": rngs}
                msd, osd = get_state_dict(model, optimizer)  # this rank's shards (DTensors): nothing is gathered
                state = {"model": msd, "optim": osd, "train": json.dumps(train), "model_info": model_info}
                use_async = args.async_save == "on" or (args.async_save == "alternate" and len(saves) % 2 == 1)
                pending = ckpt.save(state, args.output, step + 1, group=ckpt_group, async_=use_async,
                                    keep=args.keep)
                saves.append(pending)
        if pending is not None:
            pending.wait()

        score = evaluate(model, *tensors(tokenizer, data.test_texts, data.test_labels, args.max_length), rank, world)
        every = [None] * world
        dist.all_gather_object(every, {"rank": rank, "steps": steps, "saves": [s.times() for s in saves]})
        D.print0(f"step {args.steps} on {world} rank(s): val accuracy {100 * score['val_accuracy']:.2f}% "
                 f"({score['val_texts']} texts), val loss {score['val_loss']:.4f}; saved at steps "
                 f"{', '.join(f'{s.step} ({s.mode})' for s in saves)}")
        if rank == 0:
            result = {"world_size": world, "steps": args.steps, "start_step": start, "resumed_from": resumed_from,
                      **score, "args": {k: v for k, v in vars(args).items() if k != "label_names"}, "ranks": every}
            Path(args.output, "result.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    D.run_and_end(main)
