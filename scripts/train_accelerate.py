"""Train the AG News classifier with Hugging Face Accelerate: train_ddp.py's training, with Accelerate doing DDP.

    accelerate launch --config_file configs/accelerate/multi_process.yaml scripts/train_accelerate.py --epochs 3
    torchrun --standalone --nproc_per_node=2 scripts/train_accelerate.py --epochs 3

What is not the lesson (flags, data, snapshots, metrics.json) is in distrinews_lib/accelerate_run.py.
"""
import torch
import torch.nn.functional as F
from accelerate import Accelerator, DataLoaderConfiguration

from distrinews_lib import accelerate_run


def main():
    cfg, launch = accelerate_run.parse()  # train_ddp.py's flags, backend and mixed precision
    accelerator = Accelerator(cpu=launch.cpu, mixed_precision=launch.mixed_precision,  # starts the process group
                              gradient_accumulation_steps=cfg.grad_accum,  # accumulate(): no_sync, loss division
                              # split_batches: a batch is global, and the prepared scheduler steps once per
                              # optimizer step (else once per rank: the LR schedule would run N times as fast)
                              dataloader_config=DataLoaderConfiguration(split_batches=True),
                              log_with=launch.log_with, project_dir=cfg.output)  # --report_to: TensorBoard, W&B
    run = accelerate_run.Run(cfg, launch, accelerator)  # data, model, loaders, optimizer: train_ddp.py's
    # DDP(model), the evaluation's sharding, the device: Accelerate's. Not the training loader: see the chapter.
    model, optimizer, val_loader, scheduler = accelerator.prepare(run.model, run.optimizer, run.val_loader,
                                                                  run.scheduler)
    model = run.compile(model)  # --compile
    accelerator.init_trackers("distrinews", config=cfg.to_dict())

    val = None
    for epoch in run.epochs():  # a new shuffle each; after --resume, from the snapshot's
        model.train()
        for batch in run.train_batches(epoch):  # this rank's micro-batches, on its device
            with accelerator.accumulate(model):  # no_sync on every micro-batch but the last of a step
                with accelerator.autocast():
                    loss = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                 labels=batch["labels"]).loss
                accelerator.backward(loss)  # divided by grad_accum, scaled for fp16; all-reduce on the last
                grad_norm = None
                if accelerator.sync_gradients:  # the step's last micro-batch: gradients all-reduced, clip them
                    grad_norm = accelerator.clip_grad_norm_(model.parameters(), run.max_grad_norm)
                optimizer.step()  # steps only when the gradients were synced (and fp16 did not overflow)
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
            run.record(loss, grad_norm)  # the epoch's loss; a step's gradient norm and snapshot

        model.eval()
        losses, hits = [], []
        for batch in val_loader:  # prepared: each rank gets its slice of every global batch
            with torch.no_grad(), accelerator.autocast():
                logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            loss = F.cross_entropy(logits.float(), batch["labels"], reduction="none")
            loss, hit = accelerator.gather_for_metrics((loss, logits.argmax(-1) == batch["labels"]))  # all ranks'
            losses.append(loss)
            hits.append(hit)
        train, val = run.end_epoch(epoch, losses, hits)  # metrics.json, the epoch line, a snapshot
        accelerator.log({"train/loss": train.loss, "val/loss": val.loss, "val/accuracy": val.accuracy}, step=epoch)

    run.check_same_weights(model)  # DDP's promise: every rank holds the same weights
    if accelerator.is_main_process:  # one writer: N ranks writing one file would corrupt it
        run.save(accelerator.unwrap_model(model), val)  # the bare model, out of DDP: the format chapter 10 serves
    accelerator.wait_for_everyone()  # nobody exits before rank 0 has saved
    accelerator.end_training()  # closes the trackers and the process group


if __name__ == "__main__":
    accelerate_run.run_and_end(main)  # @record, main_guard, and an end gloo's teardown cannot abort
