"""Train the AG News classifier in ONE process: the baseline that notebook 02 turns into DDP.

    python scripts/train_single.py --epochs 3
"""
import torch
from torch.distributed.elastic.multiprocessing.errors import record

from distrinews_lib import checkpoint, plan
from distrinews_lib.data import batching
from distrinews_lib.errors import main_guard
from distrinews_lib.training import config, epochs, evaluation, flops, optim, precision, snapshot
from distrinews_lib.training.tracking import RunTracker


@record  # under torchrun, a crashing rank's traceback is reported as the root cause
@main_guard
def main():
    cfg = config.setup("Train the AG News classifier in one process.")  # and set --threads
    device = precision.resolve_device()
    amp = precision.resolve_amp(cfg.amp, device)
    print(f"preset {cfg.preset} | 1 process | device {device} | {amp.reason}")

    run_plan = plan.decide(cfg)  # data source, model and the snapshot to resume from, decided once
    cfg = run_plan.cfg  # as the plan settled it (a model from random weights gets its own learning rate)
    run = plan.prepare(run_plan)  # texts, model and tokenizer as planned; tokenized once and cached
    model = run.model.to(device)

    # The sampler decides which examples this process sees, in which order.
    sampler = batching.ShuffleSampler(run.train_ds, seed=cfg.seed)
    opts = batching.loader_options(cfg, run.tokenizer.pad_token_id, device)
    train_loader = batching.make_loader(run.train_ds, cfg.batch_size, sampler, seed=cfg.seed,
                                        group_by_length=cfg.group_by_length, **opts)
    val_loader = batching.make_loader(run.val_ds, cfg.eval_batch_size, **opts)

    optimizer = optim.make_optimizer(model, cfg.lr, cfg.weight_decay, cfg.fused_adam)
    steps = epochs.steps_per_epoch(len(train_loader), cfg.grad_accum, cfg.max_steps_per_epoch)
    scheduler = optim.make_scheduler(optimizer, cfg.epochs * steps, cfg.warmup_ratio)
    scaler = precision.make_grad_scaler(amp, device)  # fp16 only: scales the loss so small gradients survive
    tracker = RunTracker.for_run(cfg, run_plan, run, world_size=1, backend=None, enabled=True)
    snap = snapshot.Snapshotter(cfg, model=model, optimizer=optimizer, scheduler=scheduler, scaler=scaler,
                                tracker=tracker, label_names=run.label_names)
    start = snap.resume(run_plan.resume)  # --resume auto: continue from the newest good snapshot
    model = precision.compile_if_asked(model, cfg)  # --compile: torch.compile

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
        print(epochs.epoch_line(epoch, cfg.epochs, train, val, flops.model_mfu(train, model, amp)))
        snap.epoch_end(epoch)
    val = val or evaluation.evaluate(model, val_loader, device=device, amp=amp, task=run.task)  # resumed at the end

    checkpoint.save_checkpoint(cfg.checkpoint, model, run.tokenizer, run.label_names,
                               tracker.checkpoint_metadata(val), cfg.max_length)
    tracker.finish(checkpoint=cfg.checkpoint)
    print(f"saved {cfg.checkpoint} | metrics in {tracker.json_path}")


if __name__ == "__main__":
    main()
