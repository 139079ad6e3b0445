"""The language-model tasks: --task clm (a small GPT-2 predicting the next token) and --task mlm (a DistilBERT
filling in 15% masked tokens), on the same texts as the classifier, without their labels. Each task owns its model
head, how a block becomes inputs and labels, which logits predict which tokens, and perplexity, its evaluation.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..data.texts import TextSplits
from ..data.tokenization import tiny_tokenizer, tokenize_splits
from ..models.build import ModelInfo
from ..process_group.collectives import agree, gather_by_index, local_main_first
from ..training.evaluation import concat
from ..training.task import PreparedRun, Task
from .data import IGNORE, BlockDataset, VocabSubset, mask_block, pack

# The tiny LMs of the CPU course: a few seconds per epoch over the embedded AG News text.
TINY_LM = dict(dim=128, layers=2, heads=4, ffn=512)


@dataclass
class LMEval:
    loss: float  # mean loss per predicted token, over the whole validation set
    perplexity: float  # exp(loss)
    tokens: int  # predicted tokens counted (duplicates from the sampler's padding dropped)
    n: int  # blocks evaluated

    def metric_line(self) -> str:
        return f"val perplexity {self.perplexity:.1f} ({self.n} blocks)"

    def row(self) -> dict:
        return {"val_loss": round(self.loss, 6), "val_accuracy": None, "val_perplexity": round(self.perplexity, 4)}

    def figures(self) -> dict:
        return {"val/loss": self.loss, "val/perplexity": self.perplexity}

    def summary(self) -> dict:
        return {"final_perplexity": self.perplexity, "final_val_loss": self.loss, "eval_examples": self.n}


class LanguageModelling(Task):
    """What the two language-model tasks share: the texts packed into blocks over a frequent-token vocabulary,
    no classes, and perplexity."""

    def prepare(self, plan, splits: TextSplits, log) -> PreparedRun:
        """The same texts, without their labels, cut into blocks over the --lm_vocab most frequent WordPieces."""
        cfg = plan.cfg
        wordpiece = tiny_tokenizer()  # DistilBERT's uncased WordPiece, shipped in the package: works offline

        def tokenize():  # the [CLS]/[SEP] of each text are dropped: packing puts one [SEP] between texts
            ids = tokenize_splits(splits, wordpiece, 512)
            return [x[1:-1] for x in ids[0].input_ids], [x[1:-1] for x in ids[1].input_ids]

        train_ids, val_ids = agree(local_main_first, tokenize)
        vocab = VocabSubset.from_corpus(wordpiece, train_ids, cfg.lm_vocab)  # the same on every rank: the same data
        train_ds = BlockDataset(
            pack([vocab.encode(x) for x in train_ids], cfg.block_size, vocab.sep_token_id), self, vocab, cfg.seed
        )
        val_ds = BlockDataset(
            pack([vocab.encode(x) for x in val_ids], cfg.block_size, vocab.sep_token_id),
            self,
            vocab,
            cfg.seed,
            evaluation=True,
        )
        model, desc = self.build_model(vocab, cfg.block_size, cfg.seed)
        info = ModelInfo(f"{self.name}-tiny", desc, "preset", False, sum(p.numel() for p in model.parameters()))
        log(splits.describe() + f" | fingerprint {splits.fingerprint()} | text only: the labels are not used")
        log(
            f"{self.name}: {desc}, {info.num_parameters / 1e6:.1f}M parameters | vocabulary: the {len(vocab)} most "
            f"frequent WordPiece tokens ({100 * vocab.coverage(train_ids):.0f}% of the training tokens) | "
            f"{len(train_ds)} training and {len(val_ds)} validation blocks of {cfg.block_size} tokens"
        )
        return PreparedRun(splits, model, vocab, info, train_ds, val_ds, self)

    def label_names(self, splits: TextSplits) -> list:
        return []

    def evaluate(self, model, loader, device, amp, gather: bool) -> LMEval:
        """Perplexity over every block once: the loss summed over the predicted tokens, then divided."""
        idx, sums, counts = [], [], []
        for batch in loader:
            batch = {k: v.to(device) for k, v in batch.items()}
            with amp.autocast(device) if amp else contextlib.nullcontext():
                s, c = token_losses(model, batch, self)
            idx.append(batch["index"])
            sums.append(s)
            counts.append(c)
        idx, sums, counts = gather_by_index(
            concat(idx, torch.long),
            concat(sums, torch.float64),
            concat(counts, torch.long),
            device=device,
            gather=gather,
        )
        tokens = int(counts.sum())
        loss = float(sums.sum()) / max(tokens, 1)
        return LMEval(loss, math.exp(min(loss, 50.0)), tokens, int(idx.numel()))

    def build_model(self, tokenizer, block_size: int, seed: int):
        """(model, description): the task's small random model over the tokenizer's vocabulary."""
        raise NotImplementedError

    def inputs_and_labels(self, ids: torch.Tensor, index: torch.Tensor, collator) -> tuple:
        """A batch of blocks -> (input_ids, labels): what the model reads and which tokens it must predict."""
        raise NotImplementedError

    def predicting(self, logits: torch.Tensor, labels: torch.Tensor) -> tuple:
        """(logits, labels) lined up: the logits at a position against the token they predict."""
        return logits, labels

    def auto_model(self):
        """The transformers Auto class that rebuilds this task's model from its config (inference.load_lm)."""
        raise NotImplementedError


class CausalLM(LanguageModelling):
    name = "clm"
    instance = "CLM"

    def build_model(self, tokenizer, block_size: int, seed: int):
        from transformers import GPT2Config, GPT2LMHeadModel  # deferred: slow

        torch.manual_seed(seed)
        cfg = GPT2Config(
            vocab_size=len(tokenizer),
            n_positions=block_size,
            n_embd=TINY_LM["dim"],
            n_layer=TINY_LM["layers"],
            n_head=TINY_LM["heads"],
            n_inner=TINY_LM["ffn"],
            bos_token_id=tokenizer.cls_token_id,
            eos_token_id=tokenizer.sep_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        desc = f"GPT-2 from its config: {TINY_LM['layers']} layers, dim {TINY_LM['dim']}, random init"
        return GPT2LMHeadModel(cfg), desc

    def inputs_and_labels(self, ids, index, collator) -> tuple:
        return ids, ids.clone()  # the model predicts each next token of its own input

    def predicting(self, logits, labels) -> tuple:
        return logits[:, :-1], labels[:, 1:]  # token t predicts token t+1

    def auto_model(self):
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM


class MaskedLM(LanguageModelling):
    name = "mlm"
    instance = "MLM"

    def build_model(self, tokenizer, block_size: int, seed: int):
        from transformers import DistilBertConfig, DistilBertForMaskedLM  # deferred: slow

        torch.manual_seed(seed)
        cfg = DistilBertConfig(
            vocab_size=len(tokenizer),
            dim=TINY_LM["dim"],
            n_layers=TINY_LM["layers"],
            n_heads=TINY_LM["heads"],
            hidden_dim=TINY_LM["ffn"],
            max_position_embeddings=max(512, block_size),
            pad_token_id=tokenizer.pad_token_id,
        )
        return (
            DistilBertForMaskedLM(cfg),
            f"DistilBERT from its config: {TINY_LM['layers']} layers, dim {TINY_LM['dim']}, random init",
        )

    def inputs_and_labels(self, ids, index, collator) -> tuple:
        pairs = [
            mask_block(row, collator.tokenizer, collator.seed, collator.epoch, int(i)) for row, i in zip(ids, index)
        ]
        return torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])

    def auto_model(self):
        from transformers import AutoModelForMaskedLM

        return AutoModelForMaskedLM


CLM, MLM = CausalLM(), MaskedLM()
LM_TASKS = {task.name: task for task in (CLM, MLM)}  # registered in distrinews_lib/tasks.py


def token_losses(model, batch, task: LanguageModelling):
    """(sum of the loss over the predicted tokens, number of predicted tokens), per block."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.float()
    logits, labels = task.predicting(logits, batch["labels"])
    per_token = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE, reduction="none"
    ).view(labels.shape)
    counted = labels != IGNORE
    return (per_token * counted).sum(1).double(), counted.sum(1)
