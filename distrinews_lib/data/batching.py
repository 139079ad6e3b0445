"""Examples into batches: dynamic padding, length grouping, the single process's sampler, the DataLoader."""

from __future__ import annotations

import random

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler, SequentialSampler


class PadCollator:
    """Dynamic padding: each batch to its own longest sequence, rounded up to a multiple (tensor cores)."""

    def __init__(self, pad_id: int = 0, pad_to_multiple_of: int | None = 8):
        self.pad_id = pad_id
        self.multiple = pad_to_multiple_of or 1

    def __call__(self, items):
        longest = max(len(it["input_ids"]) for it in items)
        width = -(-longest // self.multiple) * self.multiple
        # Filled in numpy, then handed to torch: tensor operations per row (~6 per text) took 8x longer (375 against
        # 45 us for 32 texts here), and the host is what bounds a training step on a GPU at small batches.
        ids = np.full((len(items), width), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(items), width), dtype=np.int64)
        for r, it in enumerate(items):
            n = len(it["input_ids"])
            ids[r, :n] = it["input_ids"]
            mask[r, :n] = 1
        return {
            "input_ids": torch.from_numpy(ids),
            "attention_mask": torch.from_numpy(mask),
            "labels": torch.tensor([it["label"] for it in items], dtype=torch.long),
            "index": torch.tensor([it["index"] for it in items], dtype=torch.long),
        }


class LengthGroupedBatchSampler(Sampler):
    """Batches of similar length from what `sampler` yields (e.g. a DistributedSampler shard): chunks of
    its order sorted by length, cut into batches, shuffled. Each rank regroups only its own shard."""

    def __init__(self, sampler, lengths, batch_size: int, chunk_batches: int = 50, seed: int = 0):
        self.sampler, self.lengths, self.batch_size = sampler, lengths, batch_size
        self.chunk = batch_size * chunk_batches
        self.seed, self.epoch = seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    def __iter__(self):
        epoch = getattr(self.sampler, "epoch", self.epoch)  # follow DistributedSampler.set_epoch
        order = list(self.sampler)
        batches = []
        for s in range(0, len(order), self.chunk):
            chunk = sorted(order[s : s + self.chunk], key=lambda i: self.lengths[i])
            batches += [chunk[b : b + self.batch_size] for b in range(0, len(chunk), self.batch_size)]
        random.Random(self.seed * 1_000_003 + epoch).shuffle(batches)
        return iter(batches)

    def __len__(self):
        return -(-len(self.sampler) // self.batch_size)


class ShuffleSampler(Sampler):
    """The single process's sampler: an order that depends only on (seed, epoch), like DistributedSampler,
    so a resumed run replays it without storing any random state."""

    def __init__(self, dataset, seed: int = 0):
        self.n, self.seed, self.epoch = len(dataset), seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        return iter(torch.randperm(self.n, generator=g).tolist())

    def __len__(self):
        return self.n


def loader_options(cfg, pad_id: int | None, device) -> dict:
    """DataLoader options from the fast-path flags (pinned memory only helps host-to-GPU copies)."""
    on_cuda = device.type == "cuda"
    pin = on_cuda if cfg.pin_memory is None else bool(cfg.pin_memory) and on_cuda
    # Multiples of 8 feed tensor cores; a CPU has none, so there they are only extra pad tokens
    # (4-8% more CPU time per sample).
    multiple = (8 if on_cuda else None) if cfg.pad_multiple is None else (cfg.pad_multiple or None)
    if cfg.pad_multiple is None and getattr(cfg, "compile_mode", "default") == "reduce-overhead":
        multiple = static_width_multiple(cfg.max_length)
    return dict(pad_id=pad_id or 0, pad_to_multiple_of=multiple, pin_memory=pin)


def static_width_multiple(max_length: int) -> int:
    """A padding multiple that gives at most 4 batch widths up to max_length (a quarter of it when it splits into
    multiples of 8), so that CUDA graphs, recorded once per shape, are replayed rather than recorded again."""
    quarter = max_length // 4
    return quarter if max_length % 4 == 0 and quarter % 8 == 0 else 8


def make_loader(
    dataset: Dataset,
    batch_size: int,
    sampler=None,
    *,
    seed: int = 0,
    group_by_length: bool = False,
    pad_id: int = 0,
    pad_to_multiple_of: int | None = 8,
    pin_memory: bool = False,
):
    if sampler is None:
        sampler = SequentialSampler(dataset)
    # Every dataset a task makes brings its collator: padded texts (PadCollator), language-model blocks (their own).
    collate = dataset.collator_for(sampler, pad_id, pad_to_multiple_of)
    # Its own generator: creating an iterator then leaves the global torch RNG (dropout) untouched,
    # which a resumed run needs to replay the same random numbers.
    common = dict(collate_fn=collate, pin_memory=pin_memory, generator=torch.Generator().manual_seed(seed))
    if group_by_length:
        batch_sampler = LengthGroupedBatchSampler(sampler, dataset.lengths, batch_size, seed=seed)
        return DataLoader(dataset, batch_sampler=batch_sampler, **common)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, **common)
