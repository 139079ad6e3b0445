"""Chapter 02's last section: why the DDP run and the one-process run do not train bit for bit the same thing, and a
control that removes the reasons.

    steps = StepComposition.count(lengths, global_batch=32, world=2, seed=0)   # which examples share each step
    print(steps.table()); settle(steps.claims(grouped_run=True))
    folder = no_dropout_copy(CONTROL / "tiny_no_dropout", seed=0)            # the tiny model, dropout off
    ... both scripts on the same texts, --no-group_by_length --model folder ...
    print(control_table(c1, c2, gap, moved)); settle(control_claims(...))

A step of DDP with N processes trains on every rank's batch t put together; a step of one process on its own batch
t. Rebuilding both runs' samplers (DistributedSampler for DDP, the course's ShuffleSampler for one process, both
seeded seed + epoch) and their batch samplers gives each step's examples exactly, without running anything.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from torch.utils.data import BatchSampler
from torch.utils.data.distributed import DistributedSampler

from .claims import Claim

# A training loss above 95% of ln 4 (AG News's 4 classes) is a model still close to guessing evenly: the control's
# table says so, so that nobody reads its two runs as two finished classifiers.
NEAR_EVEN_GUESS = 0.95


def steps_of(lengths, world: int, batch: int, grouped: bool, seed: int, epoch: int = 1) -> list[frozenset]:
    """An epoch's optimizer steps as sets of example indices: every rank's batch t, put together. world=1 is
    train_single.py's sampler; world>1 train_ddp.py's (a DistributedSampler per rank)."""
    from distrinews_lib.data.batching import LengthGroupedBatchSampler, ShuffleSampler

    n = len(lengths)
    per_rank = []
    for rank in range(world):
        s = (
            ShuffleSampler(range(n), seed=seed)
            if world == 1
            else DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=True, seed=seed)
        )
        s.set_epoch(epoch)
        batches = LengthGroupedBatchSampler(s, lengths, batch, seed=seed) if grouped else BatchSampler(s, batch, False)
        per_rank.append(list(batches))
    return [frozenset(i for b in step for i in b) for step in zip(*per_rank)]


def training_set(args) -> tuple:
    """(the run's settings, the token length of every training text) for train_ddp.py's flags `args`: the same plan
    and tokenization the run used (tokenized once and cached, so this is quick after the run)."""
    from distrinews_lib import plan
    from distrinews_lib.training import config

    cfg = config.parse("02", [str(a) for a in [*args, "--resume", "off"]], ddp=True)
    silent = lambda *a: None
    return cfg, list(plan.prepare(plan.decide(cfg, log=silent), log=silent).train_ds.lengths)


@dataclass
class StepComposition:
    """For length-grouped and plain batching: how many of an epoch's steps train one process and N processes on
    exactly the same examples, and the share of examples two such steps have in common."""

    world: int
    global_batch: int
    rows: dict  # grouped (bool) -> (steps, identical steps, share of examples in common)

    @classmethod
    def count(cls, lengths, global_batch: int, world: int, seed: int, epoch: int = 1) -> StepComposition:
        rows = {}
        for grouped in (True, False):
            one = steps_of(lengths, 1, global_batch, grouped, seed, epoch)
            many = steps_of(lengths, world, global_batch // world, grouped, seed, epoch)
            same = sum(a == b for a, b in zip(one, many))
            shared = sum(len(a & b) for a, b in zip(one, many)) / sum(len(a) for a in one)
            rows[grouped] = (len(one), same, shared)
        return cls(world, global_batch, rows)

    def table(self) -> str:
        lines = [f"{'batching':<36} {'steps':>5} {'steps with the same examples':>29} {'examples in common':>19}"]
        for grouped, label in (
            (True, "length-grouped (the runs above)"),
            (False, "not grouped (--no-group_by_length)"),
        ):
            steps, same, shared = self.rows[grouped]
            lines.append(f"{label:<36} {steps:>5} {same:>29} {100 * shared:>18.1f}%")
        return "\n".join(lines)

    @property
    def other_steps(self) -> int:
        """Steps of the length-grouped epoch whose examples differ between one process and N."""
        steps, same, _ = self.rows[True]
        return steps - same

    def claims(self, grouped_run: bool) -> list[Claim]:
        steps, same_grouped, _ = self.rows[True]
        _, same_plain, shared_plain = self.rows[False]
        setting = " (this run's setting)" if grouped_run else ""
        return [
            Claim(
                f"with length grouping{setting}, {self.other_steps} of {steps} steps of {self.world} processes train "
                "on other examples than one process's",
                same_grouped < steps,
            ),
            Claim(
                f"without it, every one of the {steps} steps has exactly one process's examples: one order, dealt out",
                same_plain == steps and shared_plain == 1.0,
            ),
        ]


def no_dropout_copy(folder, seed: int) -> Path:
    """The cpu_smoke preset's tiny DistilBERT with every dropout off, saved where --model FOLDER reads it (its config,
    its weights, the course's tokenizer), initialised from `seed`."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForSequenceClassification, DistilBertConfig

    from distrinews_lib.data.texts import AG_NEWS_LABELS
    from distrinews_lib.data.tokenization import tiny_tokenizer
    from distrinews_lib.models.build import TINY_CONFIG, quiet_transformers

    folder = Path(folder)
    quiet_transformers()
    torch.manual_seed(seed)
    tokenizer = tiny_tokenizer()
    labels = list(AG_NEWS_LABELS)
    config = DistilBertConfig(
        vocab_size=tokenizer.vocab_size,
        num_labels=len(labels),
        id2label=dict(enumerate(labels)),
        label2id={n: i for i, n in enumerate(labels)},
        pad_token_id=tokenizer.pad_token_id,
        **{**TINY_CONFIG, "dropout": 0.0},
        attention_dropout=0.0,
        seq_classif_dropout=0.0,
    )
    config.save_pretrained(folder)
    model = AutoModelForSequenceClassification.from_config(config)
    save_file(model.state_dict(), folder / "model.safetensors", metadata={"format": "pt"})
    tokenizer.save_pretrained(folder)
    return folder


@dataclass
class Control:
    """The two control runs read back: their metrics, and how far apart their trained weights are."""

    single: dict  # metrics.json of train_single.py
    ddp: dict  # metrics.json of train_ddp.py
    gap: float  # the largest difference between any weight of the two trained models
    moved: float  # the largest change training made to any weight (the scale the gap is judged against)

    @classmethod
    def read(cls, folder) -> Control:
        from safetensors.torch import load_file

        from distrinews_lib.serving.inference import read_checkpoint

        from .plots import load_metrics

        folder = Path(folder)
        w1, w2 = (read_checkpoint(folder / name / "model.pt")["state_dict"] for name in ("single", "ddp"))
        start = load_file(folder / "tiny_no_dropout" / "model.safetensors")
        gap = max(float((w1[k] - w2[k]).abs().max()) for k in w1)
        moved = max(float((w1[k] - start[k]).abs().max()) for k in w1)
        return cls(load_metrics(folder / "single"), load_metrics(folder / "ddp"), gap, moved)

    def table(self) -> str:
        lines = [f"{'control run':<14} {'global batch':>12} {'steps':>5} {'train loss':>10} {'val acc':>8}"]
        for m in (self.single, self.ddp):
            e = m["epochs"][-1]
            name = "1 process" if m["ddp"]["world_size"] == 1 else f"DDP x{m['ddp']['world_size']}"
            lines.append(
                f"{name:<14} {m['ddp']['global_batch_size']:>12} {e['optimizer_steps']:>5} {e['train_loss']:>10.5f} "
                f"{100 * e['val_accuracy']:>7.2f}%"
            )
        lines.append(
            f"largest weight difference between the two: {self.gap:.1e}; training moved a weight by up to "
            f"{self.moved:.3f}"
        )
        loss = max(m["epochs"][-1]["train_loss"] for m in (self.single, self.ddp))
        if loss > NEAR_EVEN_GUESS * math.log(4):
            lines.append(
                f"a short control: its training loss {loss:.4f} is still near ln 4 = {math.log(4):.4f}, where a model "
                "guessing evenly among the 4 classes sits. What it compares is where training moved the weights, "
                "not two finished classifiers"
            )
        return "\n".join(lines)

    def claims(self) -> list[Claim]:
        """Both runs' own records must say the setting in which every DDP step holds one process's examples (the
        same texts, seed and global batch, no length grouping: StepComposition counts that rule) and the same number
        of steps. Rounding alone (a mean of means summed in another order) leaves the weights ~1e-5 apart after tens
        of steps: 1% of how far training moved them separates that from training on other examples, which moves them
        apart by as much as training itself."""
        m1, m2 = self.single, self.ddp
        e1, e2 = m1["epochs"][-1], m2["epochs"][-1]
        n = m2["ddp"]["world_size"]
        return [
            Claim(
                f"both control runs recorded the same texts ({m1['data']['fingerprint']}), seed "
                f"{m1['config']['seed']}, global batch {m1['ddp']['global_batch_size']}, no length grouping and "
                f"{e1['optimizer_steps']} steps: the setting in which every DDP step holds one process's examples",
                m1["data"]["fingerprint"] == m2["data"]["fingerprint"]
                and m1["config"]["seed"] == m2["config"]["seed"]
                and m1["ddp"]["global_batch_size"] == m2["ddp"]["global_batch_size"]
                and not (m1["config"]["group_by_length"] or m2["config"]["group_by_length"])
                and e1["optimizer_steps"] == e2["optimizer_steps"],
            ),
            Claim("training moved the weights (the comparison is not of two untouched models)", self.moved > 0.01),
            Claim(
                f"with the same examples in every step and no dropout, DDP x{n} trained what one process trained, up "
                f"to float rounding: weights {self.gap:.0e} apart, under 1% of how far training moved them, and the "
                "same training loss",
                self.gap < 0.01 * self.moved and abs(e1["train_loss"] - e2["train_loss"]) < 1e-3,
            ),
        ]


def difference_note(ddp_acc: float, single_acc: float, control: Control, steps: StepComposition, nproc: int) -> str:
    """What separates the chapter's two runs, in their own numbers (a Markdown paragraph)."""
    apart = abs(ddp_acc - single_acc)
    total = steps.rows[True][0]
    if nproc == 1:
        return (
            f"With one process DDP took the same steps as notebook 01, the same texts in the same order "
            f"({100 * ddp_acc:.2f}% vs {100 * single_acc:.2f}%). With {steps.world} processes, {steps.other_steps} of "
            f"{total} steps of an epoch would train on other examples than one process's (counted above), and every "
            "step would draw other dropout masks: randomness of the same kind as a different seed."
        )
    gap = f", {100 * apart:.1f} points apart" if apart >= 0.0005 else ""
    return (
        f"So, on this short control, DDP with {nproc} processes trained what one process trained, {control.gap:.0e} "
        "apart in the weights: with the same examples it took one process's steps at the global batch, up to "
        "rounding. (It cannot tell a mean of the gradients from their sum: AdamW divides each step by the "
        "gradient's own size, so a sum N times too large steps almost alike; chapter 00's section 4 checks that DDP's "
        ".grad is the mean of the ranks' local gradients.) The control takes the "
        "first two reasons away together, so it cannot say how much of the gap between this chapter's two runs "
        f"({100 * ddp_acc:.1f}% with DDP, {100 * single_acc:.1f}% in 01{gap}) comes from each, nor how rounding adds "
        f"up over a longer run. The two runs keep both: {steps.other_steps} of {total} steps of an epoch trained on "
        "other examples than one process's, and every step drew other dropout masks. That is why the accuracy check "
        "above allows a tolerance instead of asking for the same digits."
    )
