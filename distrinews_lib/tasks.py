"""The tasks a run can learn, registered here, where the import graph shows them: classification (the core's,
training/classify.py) and the language models (lm/task.py: --task clm, mlm). choose_task is the one place a task's
name is read; the plan calls it once, and every rank then holds the same object."""

from __future__ import annotations

from .errors import UserError
from .training.classify import CLASSIFY
from .training.task import Task


def registered() -> dict:
    """Every task, by the name --task and its checkpoints give it."""
    from .lm.task import LM_TASKS  # deferred: a classifier's run never loads the language models

    return {CLASSIFY.name: CLASSIFY, **LM_TASKS}


def choose_task(name: str) -> Task:
    if name == CLASSIFY.name:
        return CLASSIFY
    tasks = registered()
    if name not in tasks:
        raise UserError(f"unknown --task {name!r}: choose one of {', '.join(tasks)}")
    return tasks[name]
