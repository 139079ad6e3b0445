"""gpu_check's T4 forecast: the training FLOPs of DistilBERT-base per AG News text, and what they come to for an
epoch on one T4 and on two at an assumed MFU, each step no shorter than the CPU's launch floor (bench/launch_floor).
A FORECAST, labelled so, never a measurement."""

from __future__ import annotations

from distrinews_lib.data import sources, tokenization

T4_FP16_PEAK_TFLOPS = 65.0  # NVIDIA's datasheet, dense (flops.PEAK_TFLOPS["T4"])
SEED_CLAIMS_MINUTES = {"1x T4": 8.0, "2x T4": 4.5}  # the seed's figures for a 120,000-row epoch, never measured


def flops_per_text(data_arg: str, max_length: int = 128) -> dict:
    """Training FLOPs of DistilBERT-base per AG News text (throughput.training_flops over the real lengths)."""
    import torch
    from transformers import AutoModelForSequenceClassification, DistilBertConfig

    from distrinews_lib.data.tokenization import tiny_tokenizer
    from distrinews_lib.training import flops

    from . import throughput

    splits = sources.load_agnews(data_arg)
    lengths = [len(x) for x in tokenization.tokenize_texts(splits.train_texts, tiny_tokenizer(), max_length)]
    with torch.device("meta"):
        shape = flops.model_shape(AutoModelForSequenceClassification.from_config(DistilBertConfig(num_labels=4)))
    return {
        "flops_per_text": throughput.training_flops(shape, lengths) / len(lengths),
        "texts": len(lengths),
        "mean_tokens": sum(lengths) / len(lengths),
        "max_length": max_length,
        "data": splits.source,
    }


def t4_epoch_estimate(
    flops_per_sample: float,
    mfu_scenarios: dict,
    floors: dict | None = None,
    rows: int = 120_000,
    ddp_efficiency: float = 0.9,
    batch: int = 32,
) -> dict:
    """FORECAST minutes for one epoch of `rows` texts on one T4 and on 2x T4. scenarios: GPU-bound, at the T4's dense
    fp16 peak times each assumed MFU (2x T4: divided by 2 x ddp_efficiency). floors ({name: seconds per step}, the
    CPU launch floor of bench/launch_floor, measured or its proxy): each step as max(the GPU's time at the first
    scenario's MFU, the floor), batch `batch` per GPU. Not a measurement."""
    from .launch_floor import t4_gpu_seconds, t4_step_forecast

    out = {
        "label": "FORECAST from FLOPs per text, the T4's fp16 peak at an assumed MFU, and the CPU launch floor "
        "(each step: max of the two); not a measurement",
        "rows": rows,
        "flops_per_text": flops_per_sample,
        "t4_fp16_peak_tflops": T4_FP16_PEAK_TFLOPS,
        "ddp_efficiency_assumed": ddp_efficiency,
        "seed_claims_minutes": SEED_CLAIMS_MINUTES,
        "scenarios": {},
    }
    for name, mfu in mfu_scenarios.items():
        if not mfu:
            continue
        one = rows * flops_per_sample / (T4_FP16_PEAK_TFLOPS * 1e12 * mfu) / 60
        out["scenarios"][name] = {
            "mfu": mfu,
            "1x T4 minutes": round(one, 2),
            "2x T4 minutes": round(one / (2 * ddp_efficiency), 2),
        }
    mfu = next((m for m in mfu_scenarios.values() if m), None)
    if floors and mfu:
        out["floors"] = {}
        for name, floor_s in floors.items():
            f = t4_step_forecast(t4_gpu_seconds(batch * flops_per_sample, mfu), floor_s, ddp_efficiency=ddp_efficiency)
            out["floors"][name] = {
                **f,
                "mfu": mfu,
                "batch_per_gpu": batch,
                "1x T4 minutes": round(rows / batch * f["1x_step_seconds"] / 60, 2),
                "2x T4 minutes": round(rows / (2 * batch) * f["2x_step_seconds"] / 60, 2),
                "2x speedup": round(f["2x_speedup"], 3),
            }
    return out
