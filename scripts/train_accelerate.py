"""Train the AG News classifier with Hugging Face Accelerate: train_ddp.py, with Accelerate doing the plumbing.

    accelerate launch --config_file configs/accelerate/multi_process.yaml scripts/train_accelerate.py --epochs 3
    torchrun --standalone --nproc_per_node=2 scripts/train_accelerate.py --epochs 3
"""
from dataclasses import replace

import torch
import torch.nn.functional as F
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.utils import broadcast_object_list
from torch.distributed.elastic.multiprocessing.errors import record
from torch.utils.data.distributed import DistributedSampler

from distrinews_lib import checkpoint, plan, tasks
from distrinews_lib import distributed as D
from distrinews_lib.data import batching
from distrinews_lib.errors import UserError, main_guard
from distrinews_lib.training import config, epochs, evaluation, flops, optim, precision, snapshot
from distrinews_lib.training.classify import CLASSIFY
from distrinews_lib.training.tracking import RunTracker


@record  # under torchrun, a crashing rank's traceback is reported as the root cause
@main_guard
def main():
    cfg = config.parse("Train the AG News classifier with Accelerate (accelerate launch, or torchrun).", ddp=True)
    if tasks.choose_task(cfg.task) is not CLASSIFY:  # its evaluation is written for classes; train_ddp.py takes all
        raise UserError(f"--task {cfg.task}: train_accelerate.py trains classifiers; use scripts/train_ddp.py "
                        "for language models.")
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    rank, local_rank, world_size, _ = D.torchrun_env()  # who am I? (Accelerator starts the process group)
    backend, why = D.choose_backend(cfg.backend)
    device = D.device_for(backend, local_rank)  # nccl: this rank's own GPU, cuda:LOCAL_RANK
    amp = precision.resolve_amp(cfg.amp, device)
    accelerator = Accelerator(cpu=device.type == "cpu", mixed_precision={"off": "no"}.get(amp.mode, amp.mode),
                              gradient_accumulation_steps=cfg.grad_accum,  # accumulate(): no_sync, loss division
                              dataloader_config=DataLoaderConfiguration(split_batches=True),  # a prepared batch: global
                              log_with=None if cfg.report_to == "none" else cfg.report_to, project_dir=cfg.output)
    try:
        D.print0(f"preset {cfg.preset} | world size {accelerator.num_processes} | {accelerator.distributed_type} | "
                 f"device {accelerator.device} | {amp.reason}")

        run_plan = [plan.decide(cfg) if rank == 0 else None]  # data source, model, snapshot to resume: decided once
        broadcast_object_list(run_plan, from_process=0)  # ...by rank 0, for every rank
        run_plan, cfg = run_plan[0], run_plan[0].cfg
        run = plan.prepare(run_plan)  # texts, model and tokenizer as planned; tokenized once and cached
        model = run.model.to(device)
        shape, peak = flops.model_shape(model), flops.device_peak(device, amp.mode)  # for MFU (GPUs)

        # The sampler decides which examples this process sees, in which order: train_ddp.py's, so that every rank
        # trains on the same examples there and here (prepare() would cut each global batch into contiguous slices).
        sampler = DistributedSampler(run.train_ds, num_replicas=world_size, rank=rank, shuffle=True, seed=cfg.seed)
        opts = batching.loader_options(cfg, run.tokenizer.pad_token_id, device)
        train_loader = batching.make_loader(run.train_ds, cfg.batch_size, sampler, seed=cfg.seed,
                                            group_by_length=cfg.group_by_length, **opts)
        val_loader = batching.make_loader(run.val_ds, cfg.eval_batch_size * world_size, **opts)  # prepare() splits it

        optimizer = optim.make_optimizer(model, cfg.lr, cfg.weight_decay, cfg.fused_adam)
        steps = epochs.steps_per_epoch(len(train_loader), cfg.grad_accum, cfg.max_steps_per_epoch)
        scheduler = optim.make_scheduler(optimizer, cfg.epochs * steps, cfg.warmup_ratio)
        tracker = RunTracker.for_run(replace(cfg, report_to="none"), run_plan, run, world_size=world_size,
                                     backend=backend, enabled=rank == 0)
        snap = snapshot.Snapshotter(cfg, model=model, optimizer=optimizer, scheduler=scheduler, scaler=None,
                                    tracker=tracker, label_names=run.label_names)
        start = snap.resume(run_plan.resume)  # --resume auto: continue from the newest good snapshot
        model, optimizer, val_loader, scheduler = accelerator.prepare(model, optimizer, val_loader, scheduler)
        accelerator.init_trackers("distrinews", config=cfg.to_dict())  # --report_to: TensorBoard, W&B, Trackio
        if cfg.compile:
            model = torch.compile(model, mode=cfg.compile_mode)  # reduce-overhead: CUDA graphs

        val = None
        for epoch in range(start.epoch, cfg.epochs + 1):
            sampler.set_epoch(epoch)  # a new shuffle every epoch
            model.train()
            meter = epochs.EpochMeter(device, amp, epoch, start.meter_state(epoch))  # loss, samples, tokens, time
            for micro_batches in epochs.accumulate(train_loader, cfg.grad_accum, skip=start.skip(epoch),
                                                 limit=cfg.max_steps_per_epoch, progress=cfg.progress,
                                                 desc=f"epoch {epoch}"):
                for cpu_batch in micro_batches:  # grad_accum micro-batches make one optimizer step
                    batch = epochs.to_device(cpu_batch, device, opts["pin_memory"])
                    with accelerator.accumulate(model):  # no_sync on every micro-batch but the last of a step
                        with accelerator.autocast():
                            out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                        labels=batch["labels"])
                        loss = out.loss  # the model's own: over the classes
                        accelerator.backward(loss)  # scaled for fp16 and divided by grad_accum for you
                    meter.add(loss, cpu_batch)
                grad_norm = accelerator.clip_grad_norm_(model.parameters(), cfg.max_grad_norm or float("inf"))
                optimizer.step()  # Accelerate skips the step if fp16 gradients overflowed...
                scheduler.step()  # ...and the schedule with it
                optimizer.zero_grad(set_to_none=True)
                meter.step(grad_norm)
                snap.step(epoch, meter)  # a snapshot every --snapshot_every optimizer steps
            train = meter.finish(lr=scheduler.get_last_lr()[0])
            model.eval()
            losses, hits = [], []
            for batch in val_loader:
                with torch.no_grad(), accelerator.autocast():
                    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
                loss = F.cross_entropy(logits.float(), batch["labels"], reduction="none")
                loss, hit = accelerator.gather_for_metrics((loss, logits.argmax(-1) == batch["labels"]))  # every rank's
                losses.append(loss)
                hits.append(hit)
            losses, hits = torch.cat(losses).double(), torch.cat(hits).double()
            val = evaluation.ClassifierEval(float(losses.mean()), float(hits.mean()), len(hits), None, None, None)
            tracker.log_epoch(epoch, train, val)
            accelerator.log({"train/loss": train.loss, "val/loss": val.loss, "val/accuracy": val.accuracy}, step=epoch)
            D.print0(epochs.epoch_line(epoch, cfg.epochs, train, val, flops.epoch_mfu(train, shape, peak, world_size)))
            snap.epoch_end(epoch)

        max_diff = D.max_param_difference(model)  # DDP's promise: every rank holds the same weights
        D.print0(f"parameters identical on all {world_size} ranks: {max_diff == 0.0} (max difference {max_diff:.3g})")
        if accelerator.is_main_process:  # one writer: N ranks writing one file would corrupt it
            bare = accelerator.unwrap_model(model)  # the model inside DDP (and torch.compile): the server loads it
            checkpoint.save_checkpoint(cfg.checkpoint, bare, run.tokenizer, run.label_names,
                                       tracker.checkpoint_metadata(val), cfg.max_length)
            tracker.finish(checkpoint=cfg.checkpoint, params_max_difference=max_diff)
            print(f"saved {cfg.checkpoint} | metrics in {tracker.json_path}")
        accelerator.wait_for_everyone()  # nobody exits before rank 0 has saved
    finally:
        accelerator.end_training()  # closes the trackers and the process group


if __name__ == "__main__":
    D.run_and_end(main)  # end without the interpreter's teardown, where gloo's threads can abort a finished rank
