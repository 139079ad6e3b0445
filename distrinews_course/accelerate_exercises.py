"""Chapter 09's exercise checkers: gradient accumulation under DDP by hand (what `accelerator.accumulate` and
`accelerator.backward` do), and reading a TensorBoard file back. Each is a test for attempt.try_exercise: it raises
NotYet for the untouched stub and AssertionError with one line naming the mistake.

    try_exercise(accumulation_test, my_accumulation_step)
    try_exercise(scalars_test(run_dir, metrics), my_scalars)

The accumulation test runs the learner's step on a small real DDP model in this process (a gloo world of one, so no
second process is needed), counts the all-reduces DDP makes and the optimizer's steps, and compares the weights
with one step on the whole batch.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from .attempt import NotYet, is_stub

MICRO_BATCHES, EXAMPLES, LR = 4, 5, 0.1  # four micro-batches of five examples, plain SGD


def _data(seed: int):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(EXAMPLES, 6, generator=g), torch.randint(0, 3, (EXAMPLES,), generator=g)) for _ in range(4)]


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def _flat(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()])


def _grad(model, batches) -> torch.Tensor:
    """The gradient of the mean loss over `batches` (what one step on the whole batch uses), at model's weights."""
    model.zero_grad(set_to_none=True)
    x, y = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])
    F.cross_entropy(model(x), y).backward()
    return torch.cat([p.grad.reshape(-1).clone() for p in model.parameters()])


@contextlib.contextmanager
def _world_of_one():
    """A gloo process group of one process, for DDP in this kernel; left as it was found."""
    import torch.distributed as dist

    if dist.is_initialized():
        yield
        return
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


class _CountingSGD(torch.optim.SGD):
    steps = 0

    def step(self, closure=None):
        self.steps += 1
        return super().step(closure)


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.allclose(a, b, rtol=1e-4, atol=1e-6)


def accumulation_test(fn) -> None:
    """fn(model, micro_batches, optimizer, loss_fn): one optimizer step from several micro-batches on a DDP model.
    Right: one all-reduce per step (every micro-batch but the last under model.no_sync()), each micro-batch's loss
    divided by their number, the gradients zeroed once per step, one optimizer step. Called for two steps in a row."""
    if is_stub(fn):
        raise NotYet()
    from torch.nn.parallel import DistributedDataParallel as DDP

    plain, k = _model(), MICRO_BATCHES
    with _world_of_one():
        model = DDP(_model())
        calls = []

        def counting_allreduce(state, bucket):  # a world of one: the all-reduce's result is the bucket itself
            calls.append(1)
            done = torch.futures.Future()
            done.set_result(bucket.buffer())
            return done

        model.register_comm_hook(None, counting_allreduce)
        backwards, seen = [], []  # at each forward: how many backward passes had run (0, 1, 2, 3 when right)
        model.module.register_forward_pre_hook(lambda m, args: seen.append(len(backwards)))

        def count_backward(module, args, out):  # fires when backward reaches this forward's output
            out.register_hook(lambda grad: backwards.append(1))

        model.module.register_forward_hook(count_backward)
        opt = _CountingSGD(model.parameters(), lr=LR)
        for step, batches in enumerate((_data(1), _data(2))):
            before, calls[:], opt.steps, backwards[:], seen[:] = _flat(model.module), [], 0, [], []
            fn(model, batches, opt, F.cross_entropy)
            if len(seen) == k and seen != list(range(k)):
                raise AssertionError(
                    "every micro-batch's forward ran before the backward of the one before it: their activations "
                    "were all alive at once, which accumulation avoids; call backward on each micro-batch's loss "
                    "before the next forward"
                )
            _judge_step(step, before, _flat(model.module), len(calls), opt.steps, plain, batches, k)
            with torch.no_grad():  # the reference model follows the right path
                for p, q in zip(plain.parameters(), model.module.parameters()):
                    p.copy_(q)


def _judge_step(step, before, after, allreduces, steps, plain, batches, k) -> None:
    if steps == 0:
        raise AssertionError("the weights did not move: call optimizer.step() once, after the last micro-batch")
    if steps > 1:
        raise AssertionError(f"the optimizer stepped {steps} times for {k} micro-batches: step once, after the last")
    if allreduces == 0:
        raise AssertionError(
            "DDP never all-reduced: run the last micro-batch's backward outside model.no_sync(), so that DDP "
            "all-reduces the accumulated gradients"
        )
    if allreduces > 1:
        raise AssertionError(
            f"DDP all-reduced {allreduces} times in one step: wrap every micro-batch but the last in model.no_sync()"
        )
    update, whole = before - after, LR * _grad(plain, batches)
    if _close(update, whole):
        return
    if _close(update, k * whole):
        raise AssertionError(
            f"the update is {k} times too large: divide each micro-batch's loss by the number of micro-batches "
            "(accelerator.backward does it for you)"
        )
    last = LR * _grad(plain, batches[-1:])
    if _close(update, last / k) or _close(update, last):
        raise AssertionError(
            "only the last micro-batch's gradients reached the step: zero the gradients once, before the first "
            "micro-batch, not between them"
        )
    if step == 1:
        raise AssertionError(
            "the second step's update is off: the first step's gradients were still there; zero them at the start "
            "of each step (optimizer.zero_grad(set_to_none=True))"
        )
    raise AssertionError(
        f"one step moved the weights by {float(update.norm()):.4g}, one step on the whole batch by "
        f"{float(whole.norm()):.4g}: each micro-batch's mean loss / {k}, backward, one step"
    )


def scalars_test(run_dir, metrics: dict):
    """A test of my_scalars(run_dir, tag) -> [(step, value), ...] against the run's metrics.json: the validation
    accuracy of every epoch, and one training loss per optimizer step, in step order."""
    want_acc = [e["val_accuracy"] for e in metrics["epochs"]]
    steps = sum(e["optimizer_steps"] for e in metrics["epochs"])

    def test(fn):
        if is_stub(fn):
            raise NotYet()
        acc, loss = fn(run_dir, "val/accuracy"), fn(run_dir, "train/loss_step")
        for name, got in (("val/accuracy", acc), ("train/loss_step", loss)):
            if not isinstance(got, (list, tuple)) or not all(isinstance(x, (list, tuple)) and len(x) == 2 for x in got):
                raise AssertionError(f"{name}: returned {got!r:.80}; return a list of (step, value) pairs")
        if [s for s, _ in loss] != sorted(s for s, _ in loss):
            raise AssertionError("train/loss_step: the pairs are not in step order; sort them by step")
        got_acc = [round(float(v), 6) for _, v in acc]
        if got_acc != [round(v, 6) for v in want_acc]:
            raise AssertionError(f"val/accuracy: expected {want_acc} (metrics.json), got {got_acc}")
        if len(loss) != steps:
            raise AssertionError(f"train/loss_step: expected {steps} points, one per optimizer step, got {len(loss)}")

    return test


def judge_wandb_upload(predicted, run_dir) -> bool | None:
    """Exercise 4: the learner's command for uploading the offline W&B run in `run_dir` later. Right when it is
    `wandb sync` (with or without the run's folder); prints the command for this run. None when nothing was written."""
    from .attempt import judge_prediction

    right = str(predicted or "").split()[:2] == ["wandb", "sync"]
    return judge_prediction("MY_WANDB_UPLOAD", predicted, f"wandb sync {run_dir}", right=right)
