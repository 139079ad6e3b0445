"""The checkers of chapter 11's exercises: code the learner writes, and predictions written down before a run.

    untrained_perplexity_prediction(guess, measured, vocab)     # the prediction before the first evaluation
    grade(next_token_loss, next_token_cases(models, batch))     # exercise 1: the causal LM's loss, shifted by hand
    grade(mask_positions, mask_cases(mask_positions))            # exercise 2: masking from (seed, epoch, block)
    ex = PredictionRuns(cfg, run, cores, timeout, nproc, steps)  # exercises 3-5: each run made when first asked for
    ex.report({3: MY_MLM_VS_CLM, 4: MY_BLOCKS, 5: MY_VOCAB})     # what each run measured, and the verdict

Every failing case says in one line which mistake it found.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F


def _close(a: float, b: float, rel: float = 1e-4) -> bool:
    return abs(a - b) <= rel * max(1.0, abs(b))


# The prediction before the first evaluation -------------------------------------------------------------------------


def untrained_perplexity_prediction(guess, measured: float, vocab: int) -> str | None:
    """Right within a factor of 2 of the measured perplexity (a flat guess over the vocabulary gives exactly its
    size; the untrained model's logits move it by a few percent). Else names the quantity the guess confused."""
    if guess is None:
        return f"no prediction written down (it is None). The run gave {measured:.0f}."
    if not isinstance(guess, (int, float)) or isinstance(guess, bool):
        return f"PREDICTED_UNTRAINED_PERPLEXITY = {guess!r}: write a number, e.g. 100"
    if 0.5 < guess / measured < 2:
        return None
    if _close(guess, math.log(vocab), 0.05):
        return f"{guess:g} is the loss, log({vocab}) nats per token; perplexity is exp(loss) = {vocab}"
    if _close(guess, 1 / vocab, 0.05):
        return f"{guess:g} is the probability of each token under a flat guess; perplexity is its inverse, {vocab}"
    return (
        f"{guess:g}, but the run gave {measured:.0f}: a model that spreads its bets evenly over the {vocab} tokens has "
        f"loss log({vocab}) per token, so perplexity {vocab}"
    )


# Exercise 1: the next-token loss --------------------------------------------------------------------------------


def next_token_cases(models: dict, ids: torch.Tensor) -> list:
    """(what, args, judge) for grade(next_token_loss, ...): each model's logits on the blocks `ids`, judged against the
    model's own loss (labels=ids) within 1e-4; a wrong value is matched against the mistakes that give it."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # the model's one-off notice about its loss type is not for the learner
    cases = []
    for name, model in models.items():
        with torch.no_grad():
            out = model.eval()(input_ids=ids, attention_mask=torch.ones_like(ids), labels=ids)
        logits, want = out.logits.float(), float(out.loss)
        v = logits.shape[-1]
        mistakes = {
            "the loss of predicting each token from itself (no shift): position t's logits are the guess for the token "
            "after t": F.cross_entropy(logits.reshape(-1, v), ids.reshape(-1)),
            "shifted the wrong way: logits[:, 1:] against ids[:, :-1] predicts each token from the one after it": (
                F.cross_entropy(logits[:, 1:].reshape(-1, v), ids[:, :-1].reshape(-1))
            ),
            "the sum over the tokens, not their mean": F.cross_entropy(
                logits[:, :-1].reshape(-1, v), ids[:, 1:].reshape(-1), reduction="sum"
            ),
            "torch.roll wraps around: the last position 'predicts' the block's first token": F.cross_entropy(
                logits.reshape(-1, v), torch.roll(ids, -1, dims=1).reshape(-1)
            ),
        }

        def judge(got, want=want, mistakes=mistakes):
            if not torch.is_tensor(got) or got.dim() != 0:
                shape = tuple(getattr(got, "shape", ()))
                return f"returned {type(got).__name__} {shape}; return one number as a 0-dim tensor (the mean)"
            value = float(got)
            if _close(value, want):
                return None
            for mistake, wrong in mistakes.items():
                if _close(value, float(wrong)):
                    return f"{value:.4f} is {mistake}; the model's own loss is {want:.4f}"
            return f"{value:.4f}, but the model's own loss is {want:.4f}"

        cases.append((f"the {name} model, {len(ids)} validation blocks", (logits, ids), judge))
    return cases


# Exercise 2: masking from (seed, epoch, block) ------------------------------------------------------------------

SPECIAL = (2, 3, 0)  # [CLS], [SEP], [PAD] in the course's VocabSubset (specials first: pad 0, unk 1, cls 2, sep 3)


def _block(index: int, length: int = 32, with_specials: bool = True) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + index)
    ids = torch.randint(5, 4096, (length,), generator=g)
    if with_specials:
        ids[0], ids[length // 2] = SPECIAL[0], SPECIAL[1]  # a [CLS] and a [SEP] inside, as packing leaves them
    return ids


def mask_cases(fn) -> list:
    """grade(mask_positions, mask_cases(mask_positions)): one case whose judge calls the learner's function again, to
    hold it to what a DDP run needs: the same mask on a rerun, a new one for each epoch, block and seed, never a
    special token, about `rate` of the tokens, at least one per block, and torch's global generator left alone."""
    ids = _block(0)
    torch.manual_seed(1234)
    expected_after = torch.rand(4)  # what the global generator gives next if the call leaves it alone
    torch.manual_seed(1234)

    def judge(first):
        untouched = torch.equal(torch.rand(4), expected_after)
        if not torch.is_tensor(first) or first.shape != ids.shape:
            shape = tuple(getattr(first, "shape", ()))
            return (
                f"returned {type(first).__name__} {shape}: return a tensor of {tuple(ids.shape)} booleans, True "
                "where the token is to be predicted"
            )
        first = first.bool()
        if not untouched:
            return (
                "it moved torch's global generator (torch.manual_seed, or torch.rand without a generator): the run's "
                "dropout and shuffling draw from it; seed a torch.Generator of your own"
            )
        if not torch.equal(fn(ids, 0, 1, 0, SPECIAL).bool(), first):
            return (
                "called twice with the same (seed, epoch, block), it masked differently: a resumed run cannot repeat it"
            )
        if (first & torch.isin(ids, torch.tensor(SPECIAL))).any():
            return "it chose a special token ([CLS] or [SEP]) to predict: only the text's own tokens are predicted"
        for (seed, epoch, index), mistake in [
            (
                (0, 2, 0),
                "block 0 was masked the same in epochs 1 and 2: the epoch must enter the seed, or every epoch "
                "asks the same questions",
            ),
            (
                (0, 1, 1),
                "blocks 0 and 1 (the same tokens) got the same positions: without the block's index every "
                "block of an epoch is masked at the same positions",
            ),
            ((1, 1, 0), "seeds 0 and 1 masked block 0 the same: the run's seed must enter it"),
        ]:
            if torch.equal(fn(ids, seed, epoch, index, SPECIAL).bool(), first):
                return mistake
        if torch.equal(fn(ids, 0, 2, 0, SPECIAL).bool(), fn(ids, 0, 1, 1, SPECIAL).bool()):
            return (
                "epoch 2's block 0 masks like epoch 1's block 1: seed + epoch + index collide; combine them so that "
                "different triples give different seeds (hash the three together)"
            )
        chosen = maskable = 0
        for index in range(300):
            block = _block(index)
            mask, text = fn(block, 7, 3, index, SPECIAL).bool(), ~torch.isin(block, torch.tensor(SPECIAL))
            if (mask & ~text).any():
                return (
                    f"it chose a special token ([CLS] or [SEP]) in block {index}: only the text's tokens are predicted"
                )
            chosen, maskable = chosen + int(mask.sum()), maskable + int(text.sum())
        share = chosen / maskable
        if abs(share - 0.15) > 5 * math.sqrt(0.15 * 0.85 / maskable):  # 5 standard errors: about 1 point here
            return f"it chose {100 * share:.1f}% of the maskable tokens over 300 blocks; rate=0.15 asks for about 15%"
        short = torch.tensor([SPECIAL[0], 11, 12, SPECIAL[1]])
        empty = [index for index in range(200) if not fn(short, 0, 1, index, SPECIAL).bool().any()]
        if empty:
            return (
                f"{len(empty)} of 200 short blocks (2 text tokens) had nothing to predict: a block with no masked "
                "token teaches nothing; choose one of its text tokens then"
            )
        return None

    return [
        ("block 0 in epoch 1, then other epochs, blocks and seeds, and 300 blocks more", (ids, 0, 1, 0, SPECIAL), judge)
    ]


# Exercises 3-5: predictions --------------------------------------------------------------------------------------


def lm_prediction(prediction, clm: float, mlm: float) -> str | None:
    """Exercise 3: after the same training, is the masked LM's perplexity "lower" or "higher" than the causal LM's?"""
    if prediction is None:
        return "fill in MY_MLM_VS_CLM first ('lower' or 'higher')"
    said = str(prediction).strip().lower()
    if said not in ("lower", "higher"):
        return f"MY_MLM_VS_CLM = {prediction!r}: write 'lower' or 'higher'"
    lower = mlm < clm
    if (said == "lower") == lower:
        return None
    return f"'{said}', but the masked LM's perplexity was {mlm:.0f} against the causal LM's {clm:.0f}: " + (
        "a masked token sees the words on both sides of it, the next token only those before it"
        if lower
        else "it learns from the 15% of the tokens it masks, the causal LM from every token"
    )


def blocks_prediction(prediction: dict, short: int, long: int, steps_short: int, steps_long: int) -> str | None:
    """Exercise 4: with --block_size 64 instead of 32, how many training blocks, and how many optimizer steps per epoch.
    Right within one block and one step (the text's last partial block is dropped)."""
    missing = [k for k, v in prediction.items() if v is None]
    if missing:
        return f"fill in {', '.join(missing)} first (e.g. {{'blocks': 1000, 'steps': 50}})"
    if abs(prediction["blocks"] - long) > 1:
        if abs(prediction["blocks"] - 2 * short) <= 2:
            return f"twice as long, half as many: {long} blocks of 64 from the same tokens, not {prediction['blocks']}"
        return f"{prediction['blocks']} blocks, but the same tokens cut into blocks of 64 make {long}"
    if abs(prediction["steps"] - steps_long) > 1:
        return (
            f"{prediction['steps']} steps, but {long} blocks over the ranks in batches of the same size make "
            f"{steps_long} steps per epoch (from {steps_short}): each step now carries twice the tokens"
        )
    return None


def vocab_prediction(prediction: dict, small: dict, big: dict) -> str | None:
    """Exercise 5: --lm_vocab 8192: the share of the training tokens it keeps (percent, within 3 points) and how many
    times larger the output layer gets (within 5%)."""
    missing = [k for k, v in prediction.items() if v is None]
    if missing:
        return f"fill in {', '.join(missing)} first (e.g. {{'coverage_percent': 95, 'output_layer_times': 2}})"
    coverage, times = 100 * big["coverage"], big["output_weights"] / small["output_weights"]
    if abs(prediction["coverage_percent"] - coverage) > 3:
        return (
            f"{prediction['coverage_percent']}%, but 8,192 tokens keep {coverage:.1f}% (4,096 kept "
            f"{100 * small['coverage']:.1f}%): the next 4,096 tokens are rare ones, each adding little"
        )
    if abs(prediction["output_layer_times"] / times - 1) > 0.05:
        return (
            f"{prediction['output_layer_times']}x, but the output layer is vocabulary x width: twice the "
            f"vocabulary, {times:.1f}x the weights"
        )
    return None


class PredictionRuns:
    """Exercises 3-5's runs, each made the first time it is asked for:
    3. the masked LM and the causal LM, one epoch on 500 texts in one process each (train_single.py);
    4. the chapter's data cut into blocks of 64 instead of 32 (plan.prepare, as train_ddp.py does);
    5. the vocabulary of the 8,192 most frequent tokens instead of 4,096."""

    def __init__(
        self, cfg, run, cores: list, timeout: float, nproc: int, steps_per_epoch: int, out="outputs/exercises/11"
    ):
        self.cfg, self.run, self.cores, self.timeout, self.nproc = cfg, run, list(cores), timeout, nproc
        self.steps_32, self.out, self.done = steps_per_epoch, Path(out), {}

    def _steps(self, blocks: int) -> int:
        """Optimizer steps per epoch: DistributedSampler's ceil(blocks / nproc) per rank, in batches, the last short."""
        per_rank = -(-blocks // self.nproc)
        return -(-per_rank // self.cfg.batch_size)

    def result(self, n: int) -> dict:
        if n not in self.done:
            self.done[n] = {3: self._lms, 4: self._blocks, 5: self._vocab}[n]()
        return self.done[n]

    def _lms(self) -> dict:
        """Both models trained side by side (one process each: on a CPU, a core each), one epoch on 500 texts."""
        from concurrent.futures import ThreadPoolExecutor

        from .launch import run_python
        from .plots import load_metrics

        def train(task):
            out = self.out / task
            args = [
                "--config",
                "cpu_smoke",
                "--task",
                task,
                "--epochs",
                1,
                "--num_samples",
                500,
                "--eval_samples",
                200,
                "--lr",
                3e-3,
                "--no-progress",
                "--no-snapshots",
                *self.cores,
                "--output",
                out,
                "--checkpoint",
                out / f"{task}.pt",
            ]
            run_python("scripts/train_single.py", args, timeout=self.timeout, echo=False)
            return load_metrics(out)["epochs"][-1]["val_perplexity"]

        with ThreadPoolExecutor(2) as pool:
            return dict(zip(("clm", "mlm"), pool.map(train, ("clm", "mlm"))))

    def _blocks(self) -> dict:
        from dataclasses import replace

        from distrinews_lib import plan

        longer = plan.prepare(plan.decide(replace(self.cfg, block_size=64)), log=lambda *a: None)
        short, long = len(self.run.train_ds), len(longer.train_ds)
        return {"short": short, "long": long, "steps_short": self._steps(short), "steps_long": self._steps(long)}

    def _vocab(self) -> dict:
        from distrinews_lib.data import tokenization
        from distrinews_lib.data.tokenization import tiny_tokenizer
        from distrinews_lib.lm import data as lm

        wp = tiny_tokenizer()
        ids = [x[1:-1] for x in tokenization.tokenize_texts(self.run.splits.train_texts, wp, 512)]
        found = {}
        for size in (4096, 8192):
            vocab = lm.VocabSubset.from_corpus(wp, ids, size)
            model, _ = self.run.task.build_model(vocab, self.cfg.block_size, self.cfg.seed)  # the run's own model
            found[size] = {
                "coverage": vocab.coverage(ids),
                "tokens": len(vocab),
                "output_weights": model.get_output_embeddings().weight.numel(),
                "parameters": sum(p.numel() for p in model.parameters()),  # unique: the output layer is tied
            }
        return found

    def line(self, n: int) -> str:
        r = self.result(n)
        if n == 3:
            return f"after one epoch on 500 texts: masked LM perplexity {r['mlm']:.0f}, causal LM {r['clm']:.0f}"
        if n == 4:
            return (
                f"blocks of 32: {r['short']} ({r['steps_short']} steps per epoch); blocks of 64: {r['long']} "
                f"({r['steps_long']} steps)"
            )
        small, big = r[4096], r[8192]
        return (
            f"4,096 tokens keep {100 * small['coverage']:.1f}% of the training text, 8,192 keep "
            f"{100 * big['coverage']:.1f}%; the built model's output layer grows from "
            f"{small['output_weights'] / 1e6:.2f}M to {big['output_weights'] / 1e6:.2f}M weights, "
            f"of {small['parameters'] / 1e6:.2f}M and "
            f"{big['parameters'] / 1e6:.2f}M parameters in all (tied to the embedding)"
        )

    def grade(self, n: int, prediction) -> str | None:
        r = self.result(n)
        if n == 3:
            return lm_prediction(prediction, r["clm"], r["mlm"])
        if n == 4:
            return blocks_prediction(prediction, r["short"], r["long"], r["steps_short"], r["steps_long"])
        return vocab_prediction(prediction, r[4096], r[8192])

    def report(self, predictions: dict, run_all: bool = False) -> None:
        """For each exercise: 'not attempted yet', or what its run measured and the verdict on the prediction."""
        for n, prediction in predictions.items():
            blank = prediction is None or (isinstance(prediction, dict) and None in prediction.values())
            if blank and not run_all:
                print(f"exercise {n}: not attempted yet (write your prediction above, then run this cell)")
                continue
            print(f"exercise {n}: {self.line(n)}")
            if not blank:
                print(f"   your prediction: {self.grade(n, prediction) or 'right'}")

    def claims(self) -> list:
        """What the runs show. The block count halves within one block (the text's last partial block is dropped);
        the steps formula gives the chapter's run its own count at 32; doubling the vocabulary adds under 10 points of
        coverage (the added tokens are rare). The output layer's size is read from the two built models (line 5), not
        claimed: it is vocabulary x width by construction."""
        from .claims import Claim

        lms, b, v = self.result(3), self.result(4), self.result(5)
        gain = v[8192]["coverage"] - v[4096]["coverage"]
        return [
            Claim(
                f"both language models learned in one epoch: perplexities {lms['clm']:.0f} (causal) and "
                f"{lms['mlm']:.0f} (masked), far below the vocabulary's {len(self.run.tokenizer)}",
                max(lms.values()) < len(self.run.tokenizer) / 3,
            ),
            Claim(
                f"blocks twice as long, half as many: {b['short']} -> {b['long']}, the same tokens",
                abs(b["long"] - b["short"] / 2) <= 1,
            ),
            Claim(
                f"so half the optimizer steps per epoch ({b['steps_short']} -> {b['steps_long']}), each on twice the "
                f"tokens; at 32 the count is the run's own ({self.steps_32})",
                b["steps_short"] == self.steps_32 and b["steps_long"] <= b["steps_short"] / 2 + 1,
            ),
            Claim(
                f"doubling the vocabulary keeps {100 * gain:.1f} points more of the text (the added tokens are rare)",
                0 < gain < 0.1,
            ),
        ]
