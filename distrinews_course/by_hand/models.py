"""Chapter 03 (DDP by hand): the models the ladder trains and the real AG News batches it trains them on, and the
step of one model alone, with no communication (the cost model's start)."""

from __future__ import annotations

import functools
import statistics
import time

import torch
import torch.distributed as dist

from distrinews_lib.errors import UserError

# The models the ladder trains (all on the same real AG News texts):
#   tiny  the course's classifier (DistilBERT dim 64, 2 layers, DistilBERT's 30,522-word vocabulary): 93% of its
#         gradient bytes are the word embedding, the gradient that backward produces LAST;
#   wide  a DistilBERT classifier with 4 layers of dim 128 over a 4,096-id hash vocabulary: its bytes are spread over
#         the layers, so buckets can leave while backward still runs (the overlap and timing model);
#   tied  a small GPT-2 whose LM head IS its token embedding: one parameter receives two gradient contributions;
#   twoheads  two equal heads on one trunk, computed in a rank-dependent order: each rank's gradients become ready in a
#         different order (what a launch in readiness order gets wrong); `unused` leaves head b out, on rank 1 or all.
MODELS = ("tiny", "wide", "tied", "twoheads")
SEQ_LEN = 64
HASH_VOCAB = 4096
WIDE_CONFIG = dict(dim=128, n_layers=4, n_heads=4, hidden_dim=512, max_position_embeddings=SEQ_LEN, dropout=0.1)
TIED_CONFIG = dict(n_positions=SEQ_LEN, n_embd=64, n_layer=2, n_head=2, n_inner=256, tie_word_embeddings=True)


@functools.cache  # one per process: each kind's tokenizer is built once
def tokenizer_for(kind: str):
    from distrinews_lib.data.hash_tokenizer import HashTokenizer
    from distrinews_lib.data.tokenization import tiny_tokenizer

    return tiny_tokenizer() if kind == "tiny" else HashTokenizer(HASH_VOCAB, "head", model_max_length=512)


class Output(dict):
    """A model's output as a dict (torch's DDP looks for the tensors in it) whose values read as attributes."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


class TwoHeads(torch.nn.Module):
    """A bag-of-words trunk and two heads of the same shape (1 MiB of weights each, so each fills a 1 MiB bucket):
    rank 0 computes head a first, rank 1 head b first, so backward completes their gradients in opposite orders.
    unused="rank1": rank 1 never uses head b; unused="all": no rank does."""

    def __init__(self, unused: str | None = None):
        super().__init__()
        self.embed = torch.nn.Embedding(HASH_VOCAB, 64)
        self.trunk = torch.nn.Linear(64, 256)
        self.head_a, self.head_b = torch.nn.Linear(256, 1024), torch.nn.Linear(256, 1024)
        self.unused = unused

    def forward(self, input_ids, attention_mask, labels):
        mask = attention_mask.unsqueeze(-1).to(self.embed.weight.dtype)
        h = torch.tanh(self.trunk((self.embed(input_ids) * mask).sum(1) / mask.sum(1).clamp(min=1)))
        rank = dist.get_rank() if dist.is_initialized() else 0
        heads = [self.head_a, self.head_b] if rank % 2 == 0 else [self.head_b, self.head_a]
        if self.unused == "all" or (self.unused == "rank1" and rank == 1):
            heads = [self.head_a]
        loss = sum(torch.nn.functional.cross_entropy(head(h), labels) for head in heads)
        return Output(loss=loss)


def build_model(kind: str, seed: int, unused: str | None = None):
    """A fresh model of `kind`, initialised from `seed` (`unused`: see TwoHeads)."""
    from transformers import DistilBertConfig, DistilBertForSequenceClassification, GPT2Config, GPT2LMHeadModel

    from distrinews_lib.models.build import TINY_CONFIG, quiet_transformers

    quiet_transformers()
    torch.manual_seed(seed)
    if kind == "tiny":
        cfg = DistilBertConfig(vocab_size=30522, num_labels=4, pad_token_id=0, **TINY_CONFIG)
        return DistilBertForSequenceClassification(cfg)
    if kind == "wide":
        cfg = DistilBertConfig(vocab_size=HASH_VOCAB, num_labels=4, pad_token_id=0, **WIDE_CONFIG)
        return DistilBertForSequenceClassification(cfg)
    if kind == "tied":
        cfg = GPT2Config(vocab_size=HASH_VOCAB, pad_token_id=0, bos_token_id=1, eos_token_id=2, **TIED_CONFIG)
        return GPT2LMHeadModel(cfg)
    if kind == "twoheads":
        return TwoHeads(unused)
    raise UserError(f"unknown model {kind!r}: choose one of {', '.join(MODELS)}")


def without_dropout(model):
    """Every dropout of `model` set to p=0 (chapter 06's memory model and scripts/memory_footprint.py, and the dialed
    race: its random masks are CPU work that moves no byte). Returns the model."""
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    return model


def step_seconds(kind: str, batch_size: int, dropout: bool = True, steps: int = 3) -> dict:
    """A step of a fresh `kind` model on `batch_size` real texts with no communication at all, on one thread (a
    rank's share of this machine): median seconds of its forward, backward and AdamW step, after a warm-up step."""
    model = build_model(kind, seed=0)
    if not dropout:
        without_dropout(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    times = {"forward": [], "backward": [], "optimizer": []}
    try:
        for batch in batches(kind, 0, 1, steps + 1, batch_size):
            t0 = time.perf_counter()
            loss = model(**batch).loss
            t1 = time.perf_counter()
            loss.backward()
            t2 = time.perf_counter()
            opt.step()
            opt.zero_grad(set_to_none=True)
            for part, t in zip(times, (t1 - t0, t2 - t1, time.perf_counter() - t2)):
                times[part].append(t)
    finally:
        torch.set_num_threads(threads)
    return {part: statistics.median(v[1:]) for part, v in times.items()}


@functools.cache
def _encoded(kind: str, n: int) -> tuple[list, list]:
    """The sample's first `n` training texts (fewer if it has fewer) as `kind`'s token ids, and their labels: read and
    encoded once per process (a launch that checks many cases asks for the same batches again and again; reading the
    sample costs ~0.2 CPU-s)."""
    from distrinews_lib.data.sources import load_embedded
    from distrinews_lib.data.tokenization import encode_texts

    splits = load_embedded()
    return encode_texts(tokenizer_for(kind), splits.train_texts[:n], SEQ_LEN, "head"), splits.train_labels[:n]


def batches(kind: str, rank: int, world: int, steps: int, batch_size: int) -> list:
    """This rank's `steps` batches of real AG News texts (the embedded sample), disjoint from the other ranks'. Fresh
    tensors on every call: a caller may change its batches."""
    n = steps * batch_size * world
    ids, labels = _encoded(kind, n)
    if len(ids) < n:
        raise UserError(f"{steps} steps x {batch_size} x {world} ranks need {n} texts; the sample has {len(ids)}")
    out = []
    for s in range(steps):
        rows = [rank + world * (s * batch_size + i) for i in range(batch_size)]  # rank r takes every world-th text
        x = torch.zeros(batch_size, SEQ_LEN, dtype=torch.long)
        mask = torch.zeros(batch_size, SEQ_LEN, dtype=torch.long)
        for j, r in enumerate(rows):
            x[j, : len(ids[r])], mask[j, : len(ids[r])] = torch.tensor(ids[r]), 1
        if kind == "tied":  # next-token prediction on the same texts; padding is not predicted
            out.append({"input_ids": x, "attention_mask": mask, "labels": x.masked_fill(mask == 0, -100)})
        else:
            out.append({"input_ids": x, "attention_mask": mask, "labels": torch.tensor([labels[r] for r in rows])})
    return out


def layers(model) -> list:
    """The model's stack of transformer layers, in forward order (ZeRO-3's blocks); [] for a model without one."""
    for name in ("distilbert.transformer.layer", "transformer.h"):
        module = model
        for part in name.split("."):
            module = getattr(module, part, None)
        if isinstance(module, torch.nn.ModuleList):
            return list(module)
    return []


def reverse_sizes(model) -> str:
    """The model's gradient tensors in reverse definition order (the order backward usually completes them, and the
    one DDP's first buckets are cut in), their sizes in KiB, grouped into the head, each transformer layer and the
    embeddings: what a learner needs to count the buckets before the race. Layers of identical sizes print once."""
    groups: dict = {}
    for name, p in reversed(list(model.named_parameters())):
        parts = name.split(".")
        at = [i for i, part in enumerate(parts[:-1]) if part in ("layer", "h") and parts[i + 1].isdigit()]
        group = f"layer {parts[at[0] + 1]}" if at else ("embeddings" if "embeddings" in parts else "head")
        groups.setdefault(group, []).append(p.numel() * p.element_size() / 1024)
    n, total = sum(map(len, groups.values())), sum(map(sum, groups.values()))
    rows: dict = {}  # (group, sizes) -> the later layers of the same sizes
    for group, kib in groups.items():
        first = next((k for k in rows if k[1] == tuple(kib) and k[0].startswith("layer")), None)
        if first and group.startswith("layer"):
            rows[first].append(group.split()[1])
        else:
            rows[(group, tuple(kib))] = []
    out = [f"{n} tensors, {total / 1024:.2f} MiB of gradients; in reverse order (as backward completes them), KiB:"]
    for (group, kib), same in rows.items():
        also = f"; {'layers' if len(same) > 1 else 'layer'} {', '.join(same)} the same" if same else ""
        sizes = " ".join(f"{k:,g}" for k in kib)
        out.append(f"  {group:<10} {sizes}  ({len(kib)} tensors, {sum(kib):,.1f} KiB{also})")
    return "\n".join(out)
