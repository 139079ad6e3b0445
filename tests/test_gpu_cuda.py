"""CUDA unit tests: the GPU path on a real GPU (skipped without one; scripts/gpu_check.py runs them where
there is one and counts a skip for want of CUDA as a failure).

What they pin down: AMP picks by compute capability (bf16 only with it in hardware), a training step in
each precision on the GPU (GradScaler for fp16, the fused AdamW kernel), the CUDA data path (pinned
memory, widths padded to multiples of 8), the peak table knows this GPU, the first-cell report sees what
torch sees, and an NCCL all-reduce over every visible GPU.
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from distrinews_course import gpu_env
from distrinews_lib.data import batching, tokenization
from distrinews_lib.data.texts import AG_NEWS_LABELS
from distrinews_lib.errors import UserError
from distrinews_lib.training import epochs, flops, optim, precision
from distrinews_lib.training.config import RunConfig

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def device():
    return torch.device("cuda", 0)


def test_amp_auto_follows_the_compute_capability(device):
    native = torch.cuda.get_device_capability(device) >= (8, 0)
    amp = precision.resolve_amp("auto", device)
    assert (amp.mode, amp.use_scaler) == (("bf16", False) if native else ("fp16", True))
    if native:
        assert precision.resolve_amp("bf16", device).dtype == torch.bfloat16
    else:
        with pytest.raises(UserError, match="no bf16 in hardware"):
            precision.resolve_amp("bf16", device)


@pytest.mark.parametrize("mode", ["fp16", "bf16"])
def test_one_training_step_in_each_precision(device, mode):
    from distrinews_lib.models.build import build_model

    if mode == "bf16" and not precision.native_bf16(device):
        pytest.skip(f"{torch.cuda.get_device_name(device)} has no native bf16 (refusal tested above)")
    amp = precision.resolve_amp(mode, device)
    model = build_model(RunConfig(model="tiny", seed=0), AG_NEWS_LABELS)[0].to(device)
    opt = optim.make_optimizer(model, 1e-3)
    assert opt.param_groups[0]["fused"]  # the fused CUDA kernel
    scaler = precision.make_grad_scaler(amp, device)
    before = [p.detach().clone() for p in model.parameters()]
    ids = torch.randint(1000, 2000, (8, 32), device=device)
    with amp.autocast(device):
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    assert logits.dtype == amp.dtype
    loss = F.cross_entropy(logits.float(), torch.arange(8, device=device) % 4)
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    scaler.step(opt)
    scaler.update()
    assert torch.isfinite(loss)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_the_cuda_data_path_pins_and_pads_to_multiples_of_8(device):
    from distrinews_lib.training import config

    opts = batching.loader_options(config.RunConfig(), 0, device)
    assert opts["pin_memory"] and opts["pad_to_multiple_of"] == 8
    ds = tokenization.TokenizedDataset([[101, 5, 102], [101, 6, 7, 8, 9, 102]], [0, 1])
    batch = next(iter(batching.make_loader(ds, 2, **opts)))
    assert batch["input_ids"].shape[1] % 8 == 0 and batch["input_ids"].is_pinned()
    moved = epochs.to_device(batch, device, non_blocking=True)
    assert moved["input_ids"].device.type == "cuda"


def test_the_peak_table_knows_this_gpu(device):
    name = torch.cuda.get_device_name(device)
    known = ("H100", "H200", "A100", "L4", "L40S", "T4", "V100", "A10")
    if not any(k in name for k in known):
        pytest.skip(f"{name} is not one of the GPUs the table lists; pass --peak_tflops to the benchmarks")
    dtype = flops.matmul_dtype(precision.resolve_amp("auto", device).mode, "cuda")
    assert flops.device_peak(device, precision.resolve_amp("auto", device).mode) == flops.peak_tflops(name, dtype) > 0


def test_the_first_cell_report_sees_what_torch_sees():
    report = gpu_env.inspect(check_copy=False)
    assert report.n_gpus == torch.cuda.device_count()
    assert report.versions["cuda"] == torch.version.cuda and report.versions["nccl"]
    if report.n_gpus >= 2:
        assert set(report.p2p) == {f"{i}-{j}" for i in range(report.n_gpus) for j in range(i + 1, report.n_gpus)}


@pytest.mark.slow
def test_nccl_all_reduce_over_every_gpu(tmp_path):
    worker = tmp_path / "allreduce.py"
    worker.write_text(
        textwrap.dedent("""
        import os, torch, torch.distributed as dist
        rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local)
        dist.init_process_group("nccl")
        t = torch.full((1 << 20,), float(rank + 1), device="cuda")
        dist.all_reduce(t)
        n = dist.get_world_size()
        assert torch.all(t == n * (n + 1) / 2), t[:4]
        dist.destroy_process_group()
        print("ok", rank, flush=True)
    """)
    )
    n = torch.cuda.device_count()
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}", str(worker)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**os.environ},
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stdout.count("ok") == n
