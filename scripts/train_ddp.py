"""Train the AG News classifier with DistributedDataParallel: one process per GPU (or CPU slot).

    torchrun --standalone --nproc_per_node=2 scripts/train_ddp.py --epochs 3
"""
import contextlib
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data.distributed import DistributedSampler

from distrinews_lib import checkpoint, plan
from distrinews_lib import distributed as D
from distrinews_lib.data import batching
from distrinews_lib.errors import main_guard
from distrinews_lib.training import config, epochs, evaluation, flops, optim, precision, snapshot
from distrinews_lib.training.tracking import RunTracker


@record  # under torchrun, a crashing rank's traceback is reported as the root cause
@main_guard
def main():
    cfg = config.setup("Train the AG News classifier with DDP (launch with torchrun).", ddp=True)  # and set --threads
    rank, local_rank, world_size, init_method = D.torchrun_env()  # who am I? (read from what torchrun sets)
    backend, why = D.choose_backend(cfg.backend)
    device = D.device_for(backend, local_rank)  # nccl: this rank's own GPU, cuda:LOCAL_RANK
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=cfg.ddp_timeout))
    try:
        amp = precision.resolve_amp(cfg.amp, device)
        D.print0(f"preset {cfg.preset} | world size {world_size} | {why} | device {device} | {amp.reason}")

        run_plan = [plan.decide(cfg) if rank == 0 else None]  # data source, model, snapshot to resume: decided once
        dist.broadcast_object_list(run_plan, src=0)  # ...by rank 0, for every rank
        run_plan, cfg = run_plan[0], run_plan[0].cfg
        run = plan.prepare(run_plan)  # texts, model and tokenizer as planned; tokenized once and cached
        model = run.model.to(device)

        # The sampler decides which examples this process sees, in which order.
        sampler = DistributedSampler(run.train_ds, num_replicas=world_size, rank=rank, shuffle=True, seed=cfg.seed)
        opts = batching.loader_options(cfg, run.tokenizer.pad_token_id, device)
        train_loader = batching.make_loader(run.train_ds, cfg.batch_size, sampler, seed=cfg.seed,
                                            group_by_length=cfg.group_by_length, **opts)
        val_sampler = DistributedSampler(run.val_ds, num_replicas=world_size, rank=rank, shuffle=False)
        val_loader = batching.make_loader(run.val_ds, cfg.eval_batch_size, val_sampler, **opts)

        optimizer = optim.make_optimizer(model, cfg.lr, cfg.weight_decay, cfg.fused_adam)
        steps = epochs.steps_per_epoch(len(train_loader), cfg.grad_accum, cfg.max_steps_per_epoch)
        scheduler = optim.make_scheduler(optimizer, cfg.epochs * steps, cfg.warmup_ratio)
        scaler = precision.make_grad_scaler(amp, device)  # fp16 only: scales the loss so small gradients survive
        tracker = RunTracker.for_run(cfg, run_plan, run, world_size=world_size, backend=backend, enabled=rank == 0)
        snap = snapshot.Snapshotter(cfg, model=model, optimizer=optimizer, scheduler=scheduler, scaler=scaler,
                                    tracker=tracker, label_names=run.label_names)
        start = snap.resume(run_plan.resume)  # --resume auto: continue from the newest good snapshot
        model = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None,  # rank 0's weights to all
                    bucket_cap_mb=cfg.bucket_cap_mb, gradient_as_bucket_view=cfg.gradient_as_bucket_view)
        model = precision.compile_if_asked(model, cfg)  # --compile: torch.compile

        val = None
        for epoch in range(start.epoch, cfg.epochs + 1):
            sampler.set_epoch(epoch)  # a new shuffle every epoch
            model.train()
            meter = epochs.EpochMeter(device, amp, epoch, start.meter_state(epoch))  # loss, samples, tokens, time
            for micro_batches in epochs.accumulate(train_loader, cfg.grad_accum, skip=start.skip(epoch),
                                                 limit=cfg.max_steps_per_epoch, progress=cfg.progress,
                                                 desc=f"epoch {epoch}"):
                for i, cpu_batch in enumerate(micro_batches):  # grad_accum micro-batches make one optimizer step
                    last = i == len(micro_batches) - 1  # all-reduce once per step: skip it before the last micro-batch
                    with model.no_sync() if cfg.no_sync and not last else contextlib.nullcontext():
                        batch = epochs.to_device(cpu_batch, device, opts["pin_memory"])
                        with amp.autocast(device):
                            out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                        labels=batch["labels"])
                        loss = out.loss  # the model's own cross-entropy against the batch's labels
                        scaler.scale(loss / len(micro_batches)).backward()  # gradients add up over the micro-batches
                    meter.add(loss, cpu_batch)
                scaler.unscale_(optimizer)  # clip the real gradients, not the fp16-scaled ones
                grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm or float("inf"))
                scale = scaler.get_scale()
                scaler.step(optimizer)  # the scaler skips the step if fp16 gradients overflowed...
                scaler.update()
                if scaler.get_scale() >= scale:  # ...and then the schedule does not move either
                    scheduler.step()
                optimizer.zero_grad(set_to_none=True)
                meter.step(grad_norm)
                snap.step(epoch, meter)  # a snapshot every --snapshot_every optimizer steps
            train = meter.finish(lr=scheduler.get_last_lr()[0])
            val = evaluation.evaluate(model, val_loader, device=device, amp=amp, task=run.task)
            tracker.log_epoch(epoch, train, val)
            D.print0(epochs.epoch_line(epoch, cfg.epochs, train, val, flops.model_mfu(train, model, amp, world_size)))
            snap.epoch_end(epoch)
        val = val or evaluation.evaluate(model, val_loader, device=device, amp=amp, task=run.task)  # resumed at the end

        max_diff = D.max_param_difference(model)  # DDP's promise: every rank holds the same weights
        D.print0(f"parameters identical on all {world_size} ranks: {max_diff == 0.0} (max difference {max_diff:.3g})")
        if rank == 0:  # one writer: N ranks writing one file would corrupt it
            checkpoint.save_checkpoint(cfg.checkpoint, model, run.tokenizer, run.label_names,
                                       tracker.checkpoint_metadata(val), cfg.max_length)
            tracker.finish(checkpoint=cfg.checkpoint, params_max_difference=max_diff)
            print(f"saved {cfg.checkpoint} | metrics in {tracker.json_path}")
        dist.barrier()  # nobody exits (and tears the group down) before rank 0 has saved
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    D.run_and_end(main)  # end without the interpreter's teardown, where gloo's threads can abort a finished rank
