"""Language-model data: the texts packed into fixed-length blocks over a vocabulary of frequent tokens, and
the collator that asks its task for each block's inputs and labels (MLM: which tokens to predict). Masking depends
only on (seed, epoch, block), so a resumed run masks like an uninterrupted one and no two ranks mask alike. DDP's
lines do not change with the objective.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path

import torch
from torch.utils.data import Dataset

from ..checkpoint import tokenizer_from_files

IGNORE = -100  # labels the loss skips: padding, and (MLM) the tokens that were not masked


class VocabSubset:
    """The K most frequent WordPiece tokens of the training text, renumbered (specials first), the rest
    [UNK]: with 30,522 entries the output layer is most of a tiny model's compute. Works like a tokenizer."""

    SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
    FILE = "vocab_subset.json"  # the kept ids, beside the WordPiece tokenizer's own files in a checkpoint

    def __init__(self, tokenizer, wordpiece_ids: list):
        self.tokenizer, self.ids = tokenizer, list(wordpiece_ids)
        self.index = {w: i for i, w in enumerate(self.ids)}
        specials = tokenizer.convert_tokens_to_ids(list(self.SPECIALS))
        self.pad_token_id, self.unk_token_id, self.cls_token_id, self.sep_token_id, self.mask_token_id = (
            self.index[w] for w in specials
        )

    @classmethod
    def from_corpus(cls, tokenizer, token_ids: list, size: int) -> "VocabSubset":
        specials = tokenizer.convert_tokens_to_ids(list(cls.SPECIALS))
        counts = Counter(t for ids in token_ids for t in ids if t not in specials)
        common = [t for t, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[: size - len(specials)]]
        return cls(tokenizer, specials + common)

    def __len__(self):
        return len(self.ids)

    def encode(self, wordpiece_ids: list) -> list:
        return [self.index.get(t, self.unk_token_id) for t in wordpiece_ids]

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode([self.ids[int(i)] for i in ids], skip_special_tokens=skip_special_tokens)

    def save_pretrained(self, folder) -> None:
        """The WordPiece tokenizer's files plus the list of kept ids: what the checkpoint stores."""
        self.tokenizer.save_pretrained(folder)
        (Path(folder) / self.FILE).write_text(json.dumps(self.ids))

    @classmethod
    def from_files(cls, files: dict) -> "VocabSubset":
        """Back from a checkpoint's tokenizer files (save_pretrained's)."""
        wordpiece = tokenizer_from_files({name: text for name, text in files.items() if name != cls.FILE})
        return cls(wordpiece, json.loads(files[cls.FILE]))

    @property
    def name_or_path(self) -> str:
        return f"WordPiece, {len(self.ids)} most frequent tokens"

    def coverage(self, token_ids: list) -> float:
        """Share of the tokens that keep their own id (the rest became [UNK])."""
        total = sum(len(ids) for ids in token_ids)
        return sum(t in self.index for ids in token_ids for t in ids) / max(total, 1)


def pack(token_ids: list, block_size: int, sep_id: int) -> list:
    """Join the texts' ids (each followed by a separator) and cut the stream into full blocks."""
    stream = []
    for ids in token_ids:
        stream.extend(ids)
        stream.append(sep_id)
    return [stream[i : i + block_size] for i in range(0, len(stream) - block_size + 1, block_size)]


class BlockDataset(Dataset):
    """Fixed-length blocks of token ids, each item with its index; its task (lm.task.CLM or MLM) makes their labels."""

    def __init__(self, blocks: list, task=None, vocab=None, seed: int = 0, evaluation: bool = False):
        self.blocks, self.task, self.vocab, self.seed, self.evaluation = blocks, task, vocab, seed, evaluation
        self.lengths = [len(b) for b in blocks]  # all equal: length grouping has nothing to do

    def collator_for(self, sampler=None, pad_id=None, pad_to_multiple_of=None) -> "LMCollator":
        """Its batches (blocks need no padding). Evaluation masks the same way every time, so epochs compare;
        training masks anew each epoch."""
        return LMCollator(self.task, self.vocab, self.seed, sampler=sampler, fixed_epoch=0 if self.evaluation else None)

    def __len__(self):
        return len(self.blocks)

    def __getitem__(self, i):
        return {"index": i, "input_ids": self.blocks[i]}


def mask_block(ids: torch.Tensor, tokenizer, seed: int, epoch: int, index: int, probability: float = 0.15):
    """BERT's masking of one block, reproducibly: 15% of the non-special tokens are predicted; of those,
    80% become [MASK], 10% a random token, 10% stay. Returns (input_ids, labels)."""
    digest = hashlib.blake2b(f"{seed}:{epoch}:{index}".encode(), digest_size=8).digest()
    g = torch.Generator().manual_seed(int.from_bytes(digest, "little") & (2**63 - 1))
    special = torch.tensor([tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.pad_token_id])
    candidates = ~torch.isin(ids, special)
    chosen = (torch.rand(ids.shape, generator=g) < probability) & candidates
    if candidates.any() and not chosen.any():  # every block predicts at least one token
        chosen[candidates.nonzero()[torch.randint(int(candidates.sum()), (1,), generator=g)]] = True
    labels = torch.where(chosen, ids, torch.full_like(ids, IGNORE))
    roll = torch.rand(ids.shape, generator=g)
    inputs = ids.clone()
    inputs[chosen & (roll < 0.8)] = tokenizer.mask_token_id
    random_tokens = torch.randint(len(tokenizer), ids.shape, generator=g)
    swap = chosen & (roll >= 0.8) & (roll < 0.9)
    inputs[swap] = random_tokens[swap]
    return inputs, labels


class LMCollator:
    """Stacks blocks and asks the task for their inputs and labels (clm: the labels are the inputs; mlm: each block
    masked for the sampler's epoch; `fixed_epoch` pins it: evaluation masks the same way every time)."""

    def __init__(self, task, tokenizer, seed: int, sampler=None, fixed_epoch: int | None = None):
        self.task, self.tokenizer, self.seed, self.sampler, self.fixed_epoch = (
            task,
            tokenizer,
            seed,
            sampler,
            fixed_epoch,
        )

    @property
    def epoch(self) -> int:
        if self.fixed_epoch is not None:
            return self.fixed_epoch
        return int(getattr(self.sampler, "epoch", 0))

    def __call__(self, items):
        ids = torch.tensor([it["input_ids"] for it in items], dtype=torch.long)
        index = torch.tensor([it["index"] for it in items], dtype=torch.long)
        ids, labels = self.task.inputs_and_labels(ids, index, self)
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels, "index": index}


def all_masks_differ(masks: list) -> bool:
    """True when no two of the given label tensors mark the same positions (used by the tests and chapter 11)."""
    keys = [tuple((m != IGNORE).flatten().tolist()) for m in masks]
    return len(set(keys)) == len(keys)
