"""What chapter 11 claims about its language model, decided from the run's own figures.

    settle(objective_enters_twice(script_lines()[0]))   # the lines where the objective enters train_ddp.py
    settle(blind_guess(model, val_loader, V).claims(initial.loss))  # the untrained loss: real next tokens, random
    settle(ddp_evaluation_exact(one_process_validation(model, val_loader, task), m["epochs"][-1], nproc))
    settle(perplexity_fell(output, ppl, nproc))     # DDP's promise, and perplexity falling every epoch
    settle(masking_claims(*first_masks(...), mask_share(...), masks_alike(...), same_blocks_by_epoch(...)))

Each claim's margin is in the docstring of the function that decides it.
"""

from __future__ import annotations

import ast
import math
import re
import statistics
import textwrap
from dataclasses import dataclass
from pathlib import Path

import torch

from .claims import Claim

DDP_MARKS = (
    "init_process_group",
    "broadcast_object_list",
    "DistributedSampler(",
    "DDP(model",
    "set_epoch",
    "no_sync",
    "max_param_difference",
    "if rank == 0",
    "dist.barrier(",
    "destroy_process_group",
)


def script_lines(script="scripts/train_ddp.py") -> tuple[list[str], list[str]]:
    """(the statements of the script that name the objective: the task, the labels, or a language-model word in the
    code before a line's comment, such as `if cfg.clm:`; its DDP statements), each whole: a call spread over several
    lines is joined into one (a compound statement, such as an `if`, is shown by its header line)."""
    source = Path(script).read_text()
    lines = source.splitlines()
    spans = {}  # a line -> the (first, last) lines of the smallest simple statement holding it
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.stmt) and not hasattr(node, "body"):
            for n in range(node.lineno, node.end_lineno + 1):
                first, last = spans.get(n, (node.lineno, node.end_lineno))
                if node.end_lineno - node.lineno <= last - first:
                    spans[n] = (node.lineno, node.end_lineno)

    def statement(n: int) -> str:
        first, last = spans.get(n, (n, n))
        parts = [lines[i - 1].strip() for i in range(first, last + 1)]
        return " ".join([*(x.split("  #")[0].rstrip() for x in parts[:-1]), parts[-1]])

    names = re.compile(r"\btask\b|labels=|\b(clm|mlm)\b|causal|masked", re.I)
    objective, ddp = [], []
    for n, line in enumerate(lines, 1):
        code = line.strip()
        if not code or code.startswith("#"):
            continue
        for found, hit in ((objective, names.search(code.split("  #")[0])), (ddp, any(m in code for m in DDP_MARKS))):
            if hit and statement(n) not in found:
                found.append(statement(n))
    return objective, ddp


def script_listing(objective: list[str], ddp: list[str], width: int = 110) -> str:
    """The two kinds of statements, each fitted to `width` for the page: a trailing comment that does not fit is
    dropped whole (no word cut in two), then a statement still too long is wrapped onto indented lines, never cut."""

    def fit(line: str) -> list[str]:
        if len(line) <= width:
            return [line]
        code = line.split("  # ", 1)[0].rstrip()
        return textwrap.wrap(code, width, subsequent_indent="    ", break_on_hyphens=False)

    return "\n".join(
        [
            "the statements of train_ddp.py that name the objective:",
            *(f"  {x}" for line in objective for x in fit(line)),
            f"its {len(ddp)} DDP statements:",
            *(f"  {x}" for line in ddp for x in fit(line)),
        ]
    )


def objective_enters_twice(objective: list[str]) -> Claim:
    """Every line of train_ddp.py that names the objective is the forward asking the model for its own loss
    (labels=) or the evaluation told the task: no branch on the task anywhere in the script."""
    forward = [line for line in objective if 'labels=batch["labels"]' in line]
    evaluation = [line for line in objective if re.search(r"evaluation\.evaluate\(.*task=run\.task", line)]
    return Claim(
        f"the objective enters train_ddp.py in two places: the forward's labels= ({len(forward)} line) and the "
        f"evaluation's task= ({len(evaluation)} lines); no other line names it",
        len(forward) == 1 and len(evaluation) >= 1 and len(forward) + len(evaluation) == len(objective),
    )


@dataclass
class BlindGuess:
    real: float  # the mean loss per predicted token on the real next tokens
    blind: float  # the mean loss the same logits give a token drawn at random from the vocabulary
    se: float  # the standard error of their difference, from its spread over blocks
    vocab: int

    def claims(self, evaluated_loss: float) -> list:
        """The untrained model knows nothing: its loss on the real next tokens equals its loss on random tokens within
        4 standard errors (a model that knew anything would be hundreds of them apart: trained, the gap is over 2
        nats; 4 leaves a false alarm about 1 time in 16,000). And the real loss, recomputed by blind_guess from the
        logits and the input ids alone (it does not call the evaluation's token_losses), equals the evaluation's within
        1e-6 (fp64 sums of the same fp32 numbers): a shift or a count the evaluation got wrong would move it by far
        more. The message does not say how the loss is recomputed: that is exercise 1."""
        raised = 100 * (math.exp(self.real) / self.vocab - 1)
        return [
            Claim(
                f"the evaluation's loss ({evaluated_loss:.4f}) is the next-token cross-entropy: recomputed here by "
                f"hand from the same logits and token ids, it is {self.real:.4f} (exercise 1: write it yourself)",
                abs(self.real - evaluated_loss) < 1e-6,
            ),
            Claim(
                f"the untrained model finds the real next tokens no likelier than random ones ({self.real:.4f} vs "
                f"{self.blind:.4f} nats, within 4 standard errors): it knows nothing yet, and its perplexity is the "
                f"vocabulary's {self.vocab}, {raised:+.1f}% from its logits' small spread",
                abs(self.real - self.blind) < 4 * self.se,
            ),
        ]

    def table(self) -> str:
        return (
            f"a flat guess over {self.vocab} tokens  : loss log({self.vocab}) = {math.log(self.vocab):.4f}, perplexity "
            f"{self.vocab}\n"
            f"a random token, this model's logits: loss {self.blind:.4f}, perplexity {math.exp(self.blind):.0f}\n"
            f"the real next tokens               : loss {self.real:.4f}, perplexity {math.exp(self.real):.0f} "
            f"(standard error of the gap {self.se:.4f})"
        )


@torch.no_grad()
def blind_guess(model, loader, vocab_size: int) -> BlindGuess:
    """Per block: the loss on the real next tokens, computed here from the logits and the input ids alone
    (F.cross_entropy of position t's logits against token t+1, where token t+1 is not padding; not the evaluation's
    lm.task.token_losses), and the loss the same logits give a token drawn at random from the vocabulary (logsumexp
    minus the mean logit), which knows nothing about the text. Token-weighted means; the standard error of their
    difference from its spread over blocks."""
    import torch.nn.functional as F

    real, blind, counts = [], [], []
    model.eval()  # no dropout: the same numbers as the evaluation's
    for batch in loader:
        ids, attended = batch["input_ids"], batch["attention_mask"].bool()
        logits = model(input_ids=ids, attention_mask=batch["attention_mask"]).logits.float()[:, :-1]
        predicting = attended[:, 1:]  # position t predicts token t+1, where that token is text
        per_token = F.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
        n = predicting.sum(1)
        per_position = torch.logsumexp(logits, -1) - logits.mean(-1)
        real.append((per_token * predicting).sum(1).double() / n)
        blind.append((per_position * predicting).sum(1).double() / n)
        counts.append(n.double())
    real, blind, w = torch.cat(real), torch.cat(blind), torch.cat(counts)
    gap = real - blind
    mean = float((w * gap).sum() / w.sum())
    se = float(torch.sqrt(((w * (gap - mean)) ** 2).sum()) / w.sum())
    return BlindGuess(float((w * real).sum() / w.sum()), float((w * blind).sum() / w.sum()), se, vocab_size)


def epoch_table(initial, epochs: list) -> str:
    """Optimizer steps, loss and perplexity per epoch (epoch 0: before training), from the run's metrics.json epochs."""
    rows = [f"{'epoch':>5} {'steps':>6} {'train loss':>10} {'val loss':>9} {'perplexity':>10} {'seconds':>8}"]
    rows.append(f"{0:>5} {'':>6} {'':>10} {initial.loss:>9.3f} {initial.perplexity:>10.1f} {'':>8}")
    for e in epochs:
        rows.append(
            f"{e['epoch']:>5} {e.get('optimizer_steps', ''):>6} {e['train_loss']:>10.3f} {e['val_loss']:>9.3f} "
            f"{e['val_perplexity']:>10.1f} {e['epoch_time_s']:>8.1f}"
        )
    return "\n".join(rows)


def perplexity_fell(output: str, ppl: list, nproc: int) -> list:
    """DDP's promise for a language model (train_ddp.py's own line: parameters identical on every rank), and the
    validation perplexity falling every epoch, by at least 5x from the untrained model's. The CPU course's two
    epochs give about 15x (the data and the seeds are fixed); 5x is far above what an unlearned model shows (1x) and
    leaves room for the other presets' runs."""
    return [
        Claim(
            "DDP's promise holds for a language model too: parameters identical on every rank",
            f"parameters identical on all {nproc} ranks: True" in output,
        ),
        Claim(
            f"the validation perplexity fell every epoch: {' -> '.join(f'{p:.0f}' for p in ppl)}",
            len(ppl) > 1 and all(b < a for a, b in zip(ppl, ppl[1:])),
        ),
        Claim(f"... by {ppl[0] / ppl[-1]:.0f}x from the untrained model's (at least 5x)", ppl[-1] * 5 <= ppl[0]),
    ]


def validation_split(n_blocks: int, nproc: int) -> str:
    """How DistributedSampler splits the validation blocks: each rank gets ceil(n / nproc) of them, the last few
    repeated from the start when n does not divide by nproc (the padded duplicates the evaluation must drop)."""
    each = -(-n_blocks // nproc)
    padded = each * nproc - n_blocks
    return (
        f"validation: {n_blocks} blocks over {nproc} ranks, {each} each: {padded} padded duplicate"
        f"{'' if padded == 1 else 's'} in this run"
        + ("" if padded else f" ({n_blocks} divides by {nproc}: the sampler repeated no block)")
    )


@dataclass
class OneProcess:
    """One process's validation of a model: every block's loss sum and predicted-token count, in block order."""

    sums: torch.Tensor
    counts: torch.Tensor

    @property
    def n(self) -> int:
        return len(self.sums)

    @property
    def loss(self) -> float:
        return float(self.sums.sum() / self.counts.sum())

    @property
    def perplexity(self) -> float:
        return math.exp(self.loss)

    def rank_means(self, nproc: int) -> list:
        """Each rank's own mean loss per token, over the blocks DistributedSampler deals it in validation
        (shuffle=False): ceil(n / nproc) blocks each, the last ranks' padded with repeats of the first blocks."""
        from torch.utils.data import DistributedSampler

        means = []
        for rank in range(nproc):
            idx = torch.tensor(list(DistributedSampler(range(self.n), num_replicas=nproc, rank=rank, shuffle=False)))
            means.append(float(self.sums[idx].sum() / self.counts[idx].sum()))
        return means


@torch.no_grad()
def one_process_validation(model, loader, task) -> OneProcess:
    """The model validated here, in one process, over every block of the loader: each block's loss sum and token
    count (the same token_losses the training's evaluation sums), put in block order."""
    from distrinews_lib.lm.task import token_losses

    was_training = model.training
    model.eval()
    idx, sums, counts = [], [], []
    for batch in loader:
        s, c = token_losses(model, batch, task)
        idx.append(batch["index"])
        sums.append(s)
        counts.append(c)
    model.train(was_training)
    order = torch.cat(idx).argsort()
    return OneProcess(torch.cat(sums)[order], torch.cat(counts)[order])


def ddp_evaluation_exact(one_process, epoch: dict, nproc: int | None = None, tolerance: float = 1e-5) -> Claim:
    """The DDP run's validation of its final model (each rank its shard, every block's loss sum and token count
    gathered by block index, repeats dropped) equals one process's evaluation of the same checkpoint over every
    block: as many blocks (metrics.json's val_examples), and the loss within `tolerance` = 1e-5 nats. metrics.json
    keeps the loss to 6 decimals (5e-7), and the two evaluations batch the blocks differently, so their fp32 sums
    differ in the last bits (3e-7 on the CPU course). One rank's shard alone, a repeated block counted twice, or a
    mean of the ranks' means with unequal token counts moves the loss by far more than 1e-5.
    nproc (with a OneProcess): the text also gives what a plain mean of the ranks' own losses would have reported,
    the sampler's repeats counted twice, and whether this check tells it from the gathered loss (it cannot when the
    blocks divide by the ranks, or when the repeated blocks' losses happen to sit at the mean)."""
    ddp_loss, blocks = epoch["val_loss"], epoch.get("val_examples")
    plain = ""
    if nproc and isinstance(one_process, OneProcess):
        repeats = -(-one_process.n // nproc) * nproc - one_process.n
        mean = statistics.fmean(one_process.rank_means(nproc))
        off = abs(mean - one_process.loss)
        if not repeats:
            plain = f"; with no repeated block, a plain mean of the {nproc} ranks' own losses gives {mean:.6f} too"
        else:
            plain = (
                f"; a plain mean of the {nproc} ranks' own losses, the {repeats} repeated block"
                f"{'' if repeats == 1 else 's'} counted twice, gives {mean:.6f}, {off:.1e} nats off: "
                + ("this check would catch it" if off >= tolerance else "too close for this check to tell")
            )
    return Claim(
        (
            f"one process evaluating the saved model over all {one_process.n} validation blocks gets perplexity "
            f"{one_process.perplexity:.2f}, the DDP run's {epoch['val_perplexity']:.2f} (loss {one_process.loss:.6f}"
            f" vs {ddp_loss:.6f}, within {tolerance:.0e} nats)" + plain
        ).replace("e-0", "e-"),
        blocks == one_process.n and abs(one_process.loss - ddp_loss) < tolerance,
    )


def seen_prompt(vocab, prompt: str) -> str:
    """The prompt as the model reads it: its WordPieces through the vocabulary, a word outside it as [UNK]."""
    words = vocab.tokenizer(prompt, add_special_tokens=False)["input_ids"]
    return vocab.decode(vocab.encode(words), skip_special_tokens=False)


@torch.no_grad()
def text_perplexity(model, vocab, text: str, block_size: int) -> float:
    """The perplexity a causal LM gives one text: one block of block_size tokens, [CLS] and the text's first
    block_size - 1 tokens."""
    from distrinews_lib.lm.task import CLM, token_losses

    words = vocab.tokenizer(text, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([[vocab.cls_token_id, *vocab.encode(words)][:block_size]])
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}
    s, c = token_losses(model.eval(), batch, CLM)
    return float(torch.exp(s.sum() / c.sum()))


def text_perplexities(untrained, trained, vocab, texts, block_size: int) -> list:
    """(untrained perplexity, trained perplexity) for each text."""
    return [
        (text_perplexity(untrained, vocab, t, block_size), text_perplexity(trained, vocab, t, block_size))
        for t in texts
    ]


def real_text_likelier(pairs: list) -> Claim:
    """The trained model finds every real held-out text more likely than the untrained one did, the median text over
    5x (over 10x in the CPU course's run): a test of what it learned that, unlike a sample, does not depend on a
    random draw."""
    ratios = sorted(before / after for before, after in pairs)
    median = statistics.median(ratios)
    return Claim(
        f"the trained model finds every one of {len(ratios)} real held-out texts likelier: {ratios[0]:.1f}x to "
        f"{ratios[-1]:.0f}x less surprising, the median {median:.0f}x",
        ratios[0] > 1 and median > 5,
    )


def first_masks(blocks: list, vocab, seed: int, world: int = 2, epochs=(1, 2), batch_size: int = 4, task=None):
    """The masked LM's first batch on each rank in each epoch, made by the training's own sampler and collator
    ({(epoch, rank): batch}), after a batch of epoch 0 (as a run that trains epoch 0 first); and the first one again,
    as a resumed process builds it: a new dataset from the blocks, a new sampler and collator, started at that epoch,
    with torch's global generator in another state (a new process's). `task`: the masked LM (tests pass a wrong one)."""
    from torch.utils.data import DataLoader, DistributedSampler

    from distrinews_lib.lm import data as lm
    from distrinews_lib.lm.task import MLM

    task = task or MLM

    def batch(dataset, epoch, rank):
        sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=seed)
        sampler.set_epoch(epoch)
        return next(
            iter(DataLoader(dataset, batch_size=batch_size, sampler=sampler, collate_fn=dataset.collator_for(sampler)))
        )

    with torch.random.fork_rng():  # the notebook's own generator is left as it was
        torch.manual_seed(seed)
        dataset = lm.BlockDataset(blocks, task, vocab, seed=seed)
        batch(dataset, 0, 0)
        first = {(e, r): batch(dataset, e, r) for e in epochs for r in range(world)}
        torch.manual_seed(seed + 1)  # the resumed process: its generator elsewhere, its objects new
        resumed = lm.BlockDataset([list(b) for b in blocks], task, vocab, seed=seed)
        return first, batch(resumed, epochs[0], 0)


def same_blocks_by_epoch(blocks: list, vocab, seed: int, epochs=(1, 2), size: int = 4) -> list:
    """The labels the training's collator (collator_for(sampler)) gives the same `size` blocks after
    sampler.set_epoch(e), for each of `epochs`: alike when the collator never reads the sampler's epoch."""
    from distrinews_lib.lm import data as lm
    from distrinews_lib.lm.task import MLM

    dataset = lm.BlockDataset(blocks, MLM, vocab, seed=seed)
    sampler = torch.utils.data.DistributedSampler(dataset, num_replicas=2, rank=0, shuffle=True, seed=seed)
    collate, items = dataset.collator_for(sampler), [dataset[i] for i in range(size)]
    return [(sampler.set_epoch(e), collate(items)["labels"])[1] for e in epochs]


def masks_alike(blocks: list, vocab, seed: int, mask=None) -> tuple[int, int, int]:
    """(how many blocks mask alike in epochs 1 and 2, how many mask alike when the same tokens sit at another index,
    how many blocks): each block against itself, so a collator that leaves the epoch or the index out of its seed
    scores every block. A right one masks a block alike by chance only when ~30 coin flips all agree (~1 in 7,000).
    `mask`: the training's `mask_block` (tests pass wrong ones)."""
    from distrinews_lib.lm import data as lm

    mask, n = mask or lm.mask_block, len(blocks)
    tensors = [torch.tensor(block) for block in blocks]

    def same(i, a, b):  # block i's tokens masked as (epoch, index) a and as b
        return torch.equal(mask(tensors[i], vocab, seed, *a)[1], mask(tensors[i], vocab, seed, *b)[1])

    epochs = sum(same(i, (1, i), (2, i)) for i in range(n))
    indices = sum(same(i, (1, i), (1, i + n)) for i in range(n))
    return epochs, indices, n


def mask_share(blocks: list, vocab, seed: int, epochs=range(1, 41), mask=None) -> tuple[float, int]:
    """(the share of the maskable tokens chosen for prediction, how many maskable tokens) over all the blocks in each
    of `epochs`, as mask_split counts (each epoch masks anew): 40 epochs of 64 blocks of 32 tokens are ~80,000
    maskable tokens, so masking_claims' 4 standard errors are about half a point. `mask`: the training's
    `mask_block` (tests pass one with a wrong rate)."""
    from distrinews_lib.lm import data as lm

    mask = mask or lm.mask_block
    special = {vocab.cls_token_id, vocab.sep_token_id, vocab.pad_token_id}
    tensors = [torch.tensor(block) for block in blocks]
    chosen = sum(
        int((mask(ids, vocab, seed, epoch, i)[1] != lm.IGNORE).sum())
        for epoch in epochs
        for i, ids in enumerate(tensors)
    )
    maskable = len(epochs) * sum(int(t) not in special for block in blocks for t in block)
    return chosen / max(maskable, 1), maskable


def mask_split(blocks: list, vocab, seed: int, epochs=range(1, 41), task=None) -> dict:
    """Of the tokens the training's collator chose for prediction, over all the blocks in each of `epochs` (each epoch
    masks anew), the share shown as [MASK], as another token, and as themselves (BERT's 80/10/10); 'chosen': how many.
    40 epochs of 64 blocks of 32 tokens choose ~12,000 tokens, enough for split_claim's margin to be about 1.5
    points. `task`: the masked LM (tests pass a wrong one)."""
    from distrinews_lib.lm import data as lm
    from distrinews_lib.lm.task import MLM

    dataset = lm.BlockDataset(blocks, task or MLM, vocab, seed=seed)
    items = [dataset[i] for i in range(len(dataset))]
    shown = {"mask": 0, "random": 0, "kept": 0}
    for epoch in epochs:
        batch = lm.LMCollator(dataset.task, vocab, seed, fixed_epoch=epoch)(items)
        ids, inputs = torch.tensor([it["input_ids"] for it in items]), batch["input_ids"]
        chosen = batch["labels"] != lm.IGNORE
        shown["mask"] += int((chosen & (inputs == vocab.mask_token_id)).sum())
        shown["kept"] += int((chosen & (inputs == ids)).sum())
        shown["random"] += int((chosen & (inputs != ids) & (inputs != vocab.mask_token_id)).sum())
    n = max(sum(shown.values()), 1)
    return {**{k: v / n for k, v in shown.items()}, "chosen": n}


def split_claim(split: dict, expected=(0.8, 0.1, 0.1)) -> Claim:
    """The chosen tokens are shown 80% as [MASK], 10% as a random token, 10% as themselves, each within 4 standard
    errors of a binomial over the chosen tokens: over mask_split's ~12,000 that is 1.4 points for 80% and 1.1 for
    10%, so a 75/12.5/12.5 collator (5 and 2.5 points off) fails, while a right one strays past 4 standard errors
    about once in 16,000 runs. A random token that happens to be the original (1 in 4,096) counts as kept: far
    below the margin."""
    keys = ("mask", "random", "kept")
    margin = {k: 4 * math.sqrt(p * (1 - p) / split["chosen"]) for k, p in zip(keys, expected)}
    ok = all(abs(split[k] - p) < margin[k] for k, p in zip(keys, expected))
    return Claim(
        f"of the {split['chosen']:,} tokens chosen to predict, {100 * split['mask']:.1f}% are shown as [MASK], "
        f"{100 * split['random']:.1f}% as another token, {100 * split['kept']:.1f}% as themselves: BERT's 80/10/10, "
        f"each within 4 binomial standard errors (±{100 * margin['mask']:.1f} points for 80%, "
        f"±{100 * margin['random']:.1f} for 10%)",
        ok,
    )


def masking_claims(first: dict, again: dict, share: tuple[float, int], alike: tuple, by_epoch: list, rate=0.15) -> list:
    """Masking depends only on (seed, epoch, block): a rebuild at the same epoch masks the same; the same block masks
    anew each epoch, and the same tokens at another index mask otherwise (masks_alike's counts: at most 1 block in
    16 alike, where a collator blind to the epoch or the index has all of them alike). The share of predicted tokens
    is the rate within 4 standard errors of a binomial over the maskable tokens mask_share counts (about half a point
    over its ~80,000), so a collator masking 14% or 16% fails, while a right one strays past 4 standard errors about
    once in 16,000 runs. (The rule that every block predicts at least one token adds ~0.01 tokens a block.)"""
    from distrinews_lib.lm import data as lm

    key = min(first)
    got, n = share
    se = math.sqrt(rate * (1 - rate) / max(n, 1))
    return [
        Claim(
            "a resumed process (a new dataset, sampler and collator, its generator elsewhere) masks the same blocks "
            "the same way at the same epoch",
            torch.equal(again["labels"], first[key]["labels"])
            and torch.equal(again["input_ids"], first[key]["input_ids"]),
        ),
        Claim(
            f"every epoch masks anew: of {alike[2]} blocks, {alike[0]} mask alike in epochs 1 and 2; and a block's "
            f"index enters its mask: the same tokens at another index mask alike in {alike[1]}",
            max(alike[:2]) <= alike[2] // 16,
        ),
        Claim(
            f"{100 * got:.1f}% of the {n:,} maskable tokens are to be predicted: the {100 * rate:.0f}% BERT asks for, "
            f"within 4 binomial standard errors (±{400 * se:.1f} points)",
            abs(got - rate) < 4 * se,
        ),
        Claim(  # the training's own collator and sampler: masks_alike above calls mask_block directly
            f"the training's collator reads the sampler's epoch: the same {len(by_epoch[0])} blocks mask otherwise "
            "after set_epoch(1) and set_epoch(2); and each rank's first batch masks otherwise",
            lm.all_masks_differ(by_epoch) and lm.all_masks_differ([b["labels"] for b in first.values()]),
        ),
    ]


def shown_block(batch: dict, vocab, row: int = 0) -> str:
    """One block as the masked LM reads it: a position it must predict in <...>, what it sees there inside."""
    from distrinews_lib.lm import data as lm

    ids, labels = batch["input_ids"][row].tolist(), batch["labels"][row].tolist()
    return " ".join(
        f"<{vocab.decode([t], skip_special_tokens=False)}>" if label != lm.IGNORE else vocab.decode([t])
        for t, label in zip(ids, labels)
    )
