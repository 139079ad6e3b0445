"""sharded_run.Timeline: the hooks that time train_sharded.py's steps for chapter 07's save timeline, so that the
lesson's loop carries no clock. A step is numbered as the checkpoints number it and spans forward to optimizer.step."""

import time

import torch

from distrinews_lib import sharded_run


def test_each_step_is_numbered_from_the_resume_and_spans_forward_to_the_optimizer_step():
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    timeline = sharded_run.Timeline(model, optimizer, first_step=20)  # resumed from the checkpoint of step 20
    for _ in range(2):
        before = time.time()
        model(torch.randn(4, 3)).sum().backward()
        time.sleep(0.01)  # a step that takes time: its span must cover it
        optimizer.step()
        optimizer.zero_grad()
    with torch.no_grad():
        model(torch.randn(4, 3))  # an evaluation's forward: no optimizer step, no entry
    assert [s for s, _, _ in timeline.steps] == [21, 22]
    (_, start1, end1), (_, start2, end2) = timeline.steps
    assert end1 - start1 >= 0.01 and end2 - start2 >= 0.01
    assert end1 <= start2 and before <= start2  # the second step starts at its own forward, after the first ended
