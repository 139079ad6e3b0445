"""The machinery of scripts/train_accelerate.py that is not its lesson: train_ddp.py's command line and choices
(backend, device, mixed precision), the data and model rank 0 plans for every rank, the loaders, optimizer and
schedule, the snapshots, metrics.json, the epoch line and the checkpoint. The script keeps the Accelerate calls
and the training loop in plain sight.

    cfg, launch = accelerate_run.parse()             # train_ddp.py's flags; what to hand Accelerator(...)
    accelerator = Accelerator(cpu=launch.cpu, mixed_precision=launch.mixed_precision, ...)
    run = accelerate_run.Run(cfg, launch, accelerator)   # run.model, run.optimizer, run.val_loader, run.scheduler
    for epoch in run.epochs():
        for batch in run.train_batches(epoch):      # this rank's micro-batches, on its device
            ...; run.record(loss, grad_norm)        # grad_norm: after a step, None between a step's micro-batches
        train, val = run.end_epoch(epoch, losses, hits)   # every rank's gathered losses and hits
    run.save(accelerator.unwrap_model(model), val)   # rank 0: the checkpoint chapter 10 serves, and metrics.json

The training loader keeps train_ddp.py's DistributedSampler (not accelerator.prepare's sharding), so that every
rank trains on the same examples in both scripts: chapter 09 compares their weights bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from . import checkpoint, plan, tasks
from . import distributed as D
from .data import batching
from .errors import UserError
from .training import config, epochs, evaluation, flops, optim, precision, snapshot
from .training.classify import CLASSIFY
from .training.tracking import RunTracker


def run_and_end(main) -> None:
    """The script's entry point: main() under torchrun's @record (a crashing rank's traceback is reported as the root
    cause) and main_guard (a mistake in the flags: one paragraph and exit code 2, not a traceback), then the end
    without the interpreter's teardown (distributed.run_and_end), where gloo's threads can abort a finished rank."""
    from torch.distributed.elastic.multiprocessing.errors import record

    from .errors import main_guard

    D.run_and_end(record(main_guard(main)))


@dataclass(frozen=True)
class Launch:
    """What Accelerator(...) is told, decided as train_ddp.py decides it."""

    cpu: bool  # no GPU for this rank: gloo on the CPU
    backend: str  # gloo or nccl, as train_ddp.py picks it (the checkpoint records it)
    mixed_precision: str  # "no", "fp16" or "bf16"
    log_with: str | None  # Accelerate's tracker: tensorboard, wandb, trackio, or None
    amp: precision.AmpSettings


def parse(argv=None) -> tuple[config.RunConfig, Launch]:
    """train_ddp.py's command line, for a classifier only (a UserError names train_ddp.py for the other tasks)."""
    cfg = config.parse("Train the AG News classifier with Accelerate (accelerate launch, or torchrun).", argv, ddp=True)
    if tasks.choose_task(cfg.task) is not CLASSIFY:  # its evaluation is written for classes; train_ddp.py takes all
        raise UserError(
            f"--task {cfg.task}: train_accelerate.py trains classifiers; use scripts/train_ddp.py for language models."
        )
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    _, local_rank, _, _ = D.torchrun_env()
    backend, _ = D.choose_backend(cfg.backend)
    device = D.device_for(backend, local_rank)  # nccl: this rank's own GPU, cuda:LOCAL_RANK
    amp = precision.resolve_amp(cfg.amp, device)
    mixed = {"off": "no"}.get(amp.mode, amp.mode)
    return cfg, Launch(device.type == "cpu", backend, mixed, None if cfg.report_to == "none" else cfg.report_to, amp)


class Run:
    """One Accelerate run's data, model, optimizer, schedule, tracker and snapshots, as train_ddp.py makes them.
    Construct it after Accelerator(...): rank 0 decides the plan (data, model, snapshot to resume) for every rank."""

    def __init__(self, cfg, launch: Launch, accelerator):
        from accelerate.utils import broadcast_object_list

        self.rank, self.world, self.device = accelerator.process_index, accelerator.num_processes, accelerator.device
        self.amp = launch.amp
        D.print0(
            f"preset {cfg.preset} | world size {self.world} | {accelerator.distributed_type} | "
            f"device {self.device} | {self.amp.reason}"
        )
        run_plan = [plan.decide(cfg) if self.rank == 0 else None]  # decided once, by rank 0...
        broadcast_object_list(run_plan, from_process=0)  # ...for every rank
        self.plan, self.cfg = run_plan[0], run_plan[0].cfg
        cfg = self.cfg
        self.data = plan.prepare(self.plan)  # texts, model and tokenizer as planned; tokenized once and cached
        self.model = self.data.model.to(self.device)
        self.shape, self.peak = flops.model_shape(self.model), flops.device_peak(self.device, self.amp.mode)

        # train_ddp.py's sampler: every rank trains on the same examples there and here
        self.sampler = torch.utils.data.DistributedSampler(
            self.data.train_ds, num_replicas=self.world, rank=self.rank, shuffle=True, seed=cfg.seed
        )
        self.opts = batching.loader_options(cfg, self.data.tokenizer.pad_token_id, self.device)
        self.train_loader = batching.make_loader(
            self.data.train_ds,
            cfg.batch_size,
            self.sampler,
            seed=cfg.seed,
            group_by_length=cfg.group_by_length,
            **self.opts,
        )
        # one global batch per step: accelerator.prepare splits it among the ranks (split_batches=True)
        self.val_loader = batching.make_loader(self.data.val_ds, cfg.eval_batch_size * self.world, **self.opts)

        self.optimizer = optim.make_optimizer(self.model, cfg.lr, cfg.weight_decay, cfg.fused_adam)
        steps = epochs.steps_per_epoch(len(self.train_loader), cfg.grad_accum, cfg.max_steps_per_epoch)
        self.scheduler = optim.make_scheduler(self.optimizer, cfg.epochs * steps, cfg.warmup_ratio)
        self.tracker = RunTracker.for_run(  # metrics.json; Accelerate's own trackers write the event files
            replace(cfg, report_to="none"),
            self.plan,
            self.data,
            world_size=self.world,
            backend=launch.backend,
            enabled=self.rank == 0,
        )
        self.snap = snapshot.Snapshotter(
            cfg,
            model=self.model,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            scaler=None,
            tracker=self.tracker,
            label_names=self.data.label_names,
        )
        self.start = self.snap.resume(self.plan.resume)  # --resume auto: continue from the newest good snapshot
        self.meter = None

    @property
    def max_grad_norm(self) -> float:
        return self.cfg.max_grad_norm or float("inf")

    def compile(self, model):
        """torch.compile(model) with --compile (reduce-overhead: CUDA graphs), else the model unchanged."""
        return torch.compile(model, mode=self.cfg.compile_mode) if self.cfg.compile else model

    def epochs(self):
        """The epochs still to train (after a resume, from the snapshot's), each with a new shuffle."""
        for epoch in range(self.start.epoch, self.cfg.epochs + 1):
            self.sampler.set_epoch(epoch)
            self.meter = epochs.EpochMeter(self.device, self.amp, epoch, self.start.meter_state(epoch))
            yield epoch

    def train_batches(self, epoch: int):
        """This rank's micro-batches of the epoch, on its device (a resume skips those trained on already)."""
        cfg = self.cfg
        groups = epochs.accumulate(
            self.train_loader,
            cfg.grad_accum,
            skip=self.start.skip(epoch),
            limit=cfg.max_steps_per_epoch,
            progress=cfg.progress,
            desc=f"epoch {epoch}",
        )
        for group in groups:
            for cpu_batch in group:
                self._cpu_batch = cpu_batch  # record() counts its samples and tokens on the host
                yield epochs.to_device(cpu_batch, self.device, self.opts["pin_memory"])

    def record(self, loss, grad_norm=None) -> None:
        """A micro-batch's loss into the epoch's figures; with grad_norm, an optimizer step (and maybe a snapshot)."""
        self.meter.add(loss, self._cpu_batch)
        if grad_norm is not None:
            self.meter.step(grad_norm)
            self.snap.step(self.meter.epoch, self.meter)  # a snapshot every --snapshot_every optimizer steps

    def end_epoch(self, epoch: int, losses: list, hits: list):
        """The epoch's training figures and its evaluation from every rank's gathered losses and hits (each held-out
        text once): into metrics.json, the epoch line, and the epoch's snapshot. Returns (train, val)."""
        train = self.meter.finish(lr=self.scheduler.get_last_lr()[0])
        losses, hits = torch.cat(losses).double(), torch.cat(hits).double()
        val = evaluation.ClassifierEval(float(losses.mean()), float(hits.mean()), len(hits), None, None, None)
        self.tracker.log_epoch(epoch, train, val)
        mfu = flops.epoch_mfu(train, self.shape, self.peak, self.world)
        D.print0(epochs.epoch_line(epoch, self.cfg.epochs, train, val, mfu))
        self.snap.epoch_end(epoch)
        return train, val

    def check_same_weights(self, model) -> float:
        """DDP's promise, printed: every rank holds the same weights (collective: every rank calls it)."""
        diff = D.max_param_difference(model)
        D.print0(f"parameters identical on all {self.world} ranks: {diff == 0.0} (max difference {diff:.3g})")
        self.max_diff = diff
        return diff

    def save(self, bare_model, val) -> None:
        """Rank 0 only: the inference checkpoint (the bare model, no `module.` prefix) and metrics.json."""
        cfg, data = self.cfg, self.data
        meta = self.tracker.checkpoint_metadata(val)
        checkpoint.save_checkpoint(cfg.checkpoint, bare_model, data.tokenizer, data.label_names, meta, cfg.max_length)
        self.tracker.finish(checkpoint=cfg.checkpoint, params_max_difference=getattr(self, "max_diff", None))
        print(f"saved {cfg.checkpoint} | metrics in {self.tracker.json_path}")
