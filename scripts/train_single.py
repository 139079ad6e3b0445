"""Train the AG News classifier in ONE process: the baseline that notebook 02 turns into DDP.

    python scripts/train_single.py --epochs 3
"""
import torch
from torch.distributed.elastic.multiprocessing.errors import record
from torch.utils.data import RandomSampler

from distrinews_lib import LABEL_NAMES, checkpoint, cli, data, engine, recipe, snapshot
from distrinews_lib.errors import main_guard


@record  # under torchrun, a crashing rank's traceback is reported as the root cause
@main_guard
def main():
    args = cli.parse_train_args("Train the AG News classifier in one process.")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = engine.pick_device()
    amp = engine.resolve_amp(args.amp, device)
    print(f"preset {args.preset} | 1 process | device {device} | {amp.reason}")

    splits, model, tokenizer, info, train_ds, val_ds = recipe.load_data_and_model(args)
    model.to(device)
    mfu_shape, peak = recipe.mfu_setup(model, device, amp)  # MFU printed next to samples/s on GPUs
    model = recipe.maybe_compile(model, args.compile)

    # The sampler decides which examples this process sees, in which order.
    train_sampler = RandomSampler(train_ds, generator=torch.Generator().manual_seed(args.seed))
    opts = recipe.loader_options(args, tokenizer, device)
    train_loader = data.make_loader(train_ds, args.batch_size, train_sampler, seed=args.seed, group_by_length=args.group_by_length, **opts)
    val_loader = data.make_loader(val_ds, args.eval_batch_size, **opts)

    optimizer = engine.make_optimizer(model, args.lr, args.weight_decay, "auto" if args.fused_adam is None else args.fused_adam)
    total_steps = args.epochs * engine.optimizer_steps_per_epoch(len(train_loader), args.grad_accum)
    scheduler = engine.make_scheduler(optimizer, total_steps, args.warmup_ratio)
    tracker = recipe.make_tracker(args, splits, info, world_size=1, backend=None, enabled=True)
    scaler = engine.make_grad_scaler(amp, device)  # one for the whole run: its loss scale adapts over steps
    snap = snapshot.Snapshotter(args, model, optimizer, scheduler, scaler, train_sampler, tracker, LABEL_NAMES)
    start_epoch = snap.resume(args.resume)  # --resume auto: continue from the newest good snapshot

    val = None
    for epoch in range(start_epoch, args.epochs + 1):
        train = engine.train_one_epoch(model, train_loader, optimizer, scheduler, device=device, amp=amp, scaler=scaler,
                                       grad_accum=args.grad_accum, max_grad_norm=args.max_grad_norm,
                                       progress=args.progress, desc=f"epoch {epoch}", max_steps=args.max_steps,
                                       non_blocking=opts["pin_memory"],
                                       skip_batches=snap.skip_batches(epoch), on_step=snap.on_step(epoch))
        val = engine.evaluate(model, val_loader, device=device, amp=amp)
        tracker.log_epoch(epoch, train, val)
        print(recipe.epoch_line(epoch, args.epochs, train, val, recipe.epoch_mfu(train, mfu_shape, peak)))
        snap.save_epoch_end(epoch)
    val = val or engine.evaluate(model, val_loader, device=device, amp=amp)  # resumed after the last epoch

    meta = recipe.checkpoint_metadata(args, splits, info, world_size=1, backend=None, final=val)
    checkpoint.save_checkpoint(args.checkpoint, model, tokenizer, LABEL_NAMES, meta, args.max_length)
    tracker.finish(checkpoint=args.checkpoint)
    print(f"saved {args.checkpoint} | metrics in {tracker.json_path}")


if __name__ == "__main__":
    main()
