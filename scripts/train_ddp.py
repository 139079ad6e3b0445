"""Train the AG News classifier with DistributedDataParallel: one process per GPU (or CPU slot).

    torchrun --standalone --nproc_per_node=2 scripts/train_ddp.py --epochs 3
"""
import os
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data.distributed import DistributedSampler

from distrinews_lib import LABEL_NAMES, checkpoint, cli, data, engine, recipe, snapshot
from distrinews_lib import distributed as D
from distrinews_lib.errors import main_guard


@record  # under torchrun, a crashing rank's traceback is reported as the root cause
@main_guard
def main():
    args = cli.parse_train_args("Train the AG News classifier with DDP (launch with torchrun).", ddp=True)
    if args.threads:
        torch.set_num_threads(args.threads)
    D.ensure_torchrun_env()  # torchrun sets these; plain `python` gets a world of one
    rank, local_rank, world_size = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"])
    backend, why = D.choose_backend(args.backend)
    dist.init_process_group(backend=backend, timeout=timedelta(seconds=args.ddp_timeout))
    try:
        device = torch.device("cuda", local_rank) if backend == "nccl" else torch.device("cpu")
        if device.type == "cuda":
            torch.cuda.set_device(device)
        amp = engine.resolve_amp(args.amp, device)
        D.print0(f"preset {args.preset} | {world_size} processes | {why} | device {device} | {amp.reason}")

        splits, model, tokenizer, info, train_ds, val_ds = recipe.load_data_and_model(args, log=D.print0)
        model.to(device)
        mfu_shape, peak = recipe.mfu_setup(model, device, amp)  # MFU printed next to samples/s on GPUs
        model = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None,
                    bucket_cap_mb=args.bucket_cap_mb, gradient_as_bucket_view=args.gradient_as_bucket_view)
        model = recipe.maybe_compile(model, args.compile)

        # Each rank gets its own 1/world_size of the data; the shards are disjoint.
        train_sampler = DistributedSampler(train_ds, num_replicas=world_size, rank=rank, shuffle=True, seed=args.seed)
        opts = recipe.loader_options(args, tokenizer, device)
        train_loader = data.make_loader(train_ds, args.batch_size, train_sampler, seed=args.seed, group_by_length=args.group_by_length, **opts)
        val_loader = data.make_loader(val_ds, args.eval_batch_size, DistributedSampler(val_ds, world_size, rank, shuffle=False), **opts)

        optimizer = engine.make_optimizer(model, args.lr, args.weight_decay, "auto" if args.fused_adam is None else args.fused_adam)
        total_steps = args.epochs * engine.optimizer_steps_per_epoch(len(train_loader), args.grad_accum)
        scheduler = engine.make_scheduler(optimizer, total_steps, args.warmup_ratio)
        tracker = recipe.make_tracker(args, splits, info, world_size=world_size, backend=backend, enabled=rank == 0)
        scaler = engine.make_grad_scaler(amp, device)  # one for the whole run: its loss scale adapts over steps
        snap = snapshot.Snapshotter(args, model, optimizer, scheduler, scaler, train_sampler, tracker, LABEL_NAMES, log=D.print0)
        start_epoch = snap.resume(args.resume)  # --resume auto: continue from the newest good snapshot

        val = None
        for epoch in range(start_epoch, args.epochs + 1):
            train_sampler.set_epoch(epoch)  # a new shuffle every epoch, the same on every rank
            train = engine.train_one_epoch(model, train_loader, optimizer, scheduler, device=device, amp=amp, scaler=scaler,
                                           grad_accum=args.grad_accum, max_grad_norm=args.max_grad_norm,
                                           progress=args.progress, desc=f"epoch {epoch}", max_steps=args.max_steps,
                                           non_blocking=opts["pin_memory"], use_no_sync=args.no_sync,
                                           skip_batches=snap.skip_batches(epoch), on_step=snap.on_step(epoch))
            val = engine.evaluate(model, val_loader, device=device, amp=amp)
            tracker.log_epoch(epoch, train, val)
            D.print0(recipe.epoch_line(epoch, args.epochs, train, val, recipe.epoch_mfu(train, mfu_shape, peak, world_size)))
            snap.save_epoch_end(epoch)
        val = val or engine.evaluate(model, val_loader, device=device, amp=amp)  # resumed after the last epoch

        max_diff = D.max_param_difference(model)  # DDP's promise: every rank holds the same weights
        D.print0(f"parameters identical on all {world_size} ranks: {max_diff == 0.0} (max difference {max_diff:.3g})")
        if rank == 0:  # one writer: N ranks writing one file would corrupt it
            meta = recipe.checkpoint_metadata(args, splits, info, world_size=world_size, backend=backend, final=val)
            checkpoint.save_checkpoint(args.checkpoint, model, tokenizer, LABEL_NAMES, meta, args.max_length)
            tracker.finish(checkpoint=args.checkpoint, params_max_difference=max_diff)
            print(f"saved {args.checkpoint} | metrics in {tracker.json_path}")
        dist.barrier()  # nobody exits (and tears the group down) before rank 0 has saved
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
