"""The task, as one object: everything that differs between learning to classify the texts and learning to model
their language. A task owns its datasets (each brings its own collator), its model head, its evaluation and the
result type that reports it, and the name its checkpoints carry. The plan chooses it once: tasks.choose_task is the
one place where a task's name is looked up; everything else asks the task object.

Classification is the core's task (training/classify.py). The language-model tasks (--task clm, mlm) live beside
the core, in distrinews_lib.lm, which the core never imports; distrinews_lib/tasks.py registers them all.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..data.texts import TextSplits
from ..models.build import ModelInfo


class Task:
    """What a task is asked for. `name` is what --task calls it and what its checkpoints record. Each task is one
    object at the top of its module, named by `instance`: the plan that rank 0 broadcasts carries it by that name,
    so every rank holds the same object."""

    name: str
    instance: str  # the module-level name of the one object of this class

    def __reduce__(self) -> str:
        return self.instance  # pickled as a reference to the module's object, not as a copy

    def prepare(self, plan, splits: TextSplits, log) -> PreparedRun:
        """This rank's model, tokenizer and datasets for the plan, from the texts every rank agreed on. Collective."""
        raise NotImplementedError

    def label_names(self, splits: TextSplits) -> list:
        """The classes, in the order of the model's outputs (what the snapshot and the checkpoint record)."""
        raise NotImplementedError

    def evaluate(self, model, loader, device, amp, gather: bool):
        """The bare model in eval mode over the loader: the task's result type (metric_line, row, figures,
        summary), exact under DDP when gather=True. Called by training.evaluation.evaluate."""
        raise NotImplementedError

    def read_checkpoint(self, path) -> dict:
        """checkpoint.read_checkpoint, refusing a checkpoint that another task wrote."""
        from ..checkpoint_reading import read_checkpoint  # deferred: a run that only saves never reads a checkpoint

        return read_checkpoint(path, task=self.name)

    def __repr__(self) -> str:
        return f"<task {self.name}>"


@dataclass
class PreparedRun:
    """What every rank loaded according to the plan."""

    splits: TextSplits
    model: object
    tokenizer: object
    info: ModelInfo
    train_ds: object  # a Dataset whose collator_for(sampler, pad_id, pad_to_multiple_of) makes its batches
    val_ds: object
    task: Task

    @property
    def label_names(self) -> list:
        """The classes, in the order of the model's outputs: from the data, or --label_names (none for an LM)."""
        return self.task.label_names(self.splits)


def tokenizer_name(tokenizer) -> str:
    return getattr(tokenizer, "name_or_path", None) or type(tokenizer).__name__
