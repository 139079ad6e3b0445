"""--int8 mode of scripts/bench_serving.py: what `--quantize int8` costs in accuracy and gains in speed, per checkpoint,
in one run; writes benchmarks/serving_int8_<machine>.json.

For each checkpoint:
* accuracy: the fp32 model and the int8 one (serving.loading.check_for_serving, as the server loads and checks them)
  classify every test text of --data (the 7,600 of AG News' test set with --data ../shared/data/ag_news), in this
  process; accuracy of each, the difference in points, how often their labels agree, the largest probability
  difference;
* model speed without HTTP: the same texts in chunks of 512 that alternate between fp32 and int8 (batch 64, the
  server's torch threads);
* where fp32 spends its forward pass: the share of its time in the Linear layers (torch.profiler), the part int8
  speeds up, and the tokenizer's share of the work: a bound on int8's gain (Amdahl);
* serving: `python -m distrinews_lib.serving` and the same with --quantize int8, raced as in --litserve
  (serving_race.py: alternating rounds, the other paused) at concurrency 1 and 16: requests/s, latency, the ratio.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import torch

from distrinews_lib.errors import UserError

from .serving_race import RACE_DOC, our_settings, race
from .serving_servers import REPO, Server, free_port, make_checkpoint, model_description

ACCURACY_TOLERANCE_POINTS = 0.5
SPEEDUP_TARGET_AT_16 = 1.5


def test_split(data: str, quick: bool) -> tuple[list, list, list, str]:
    """(texts, labels, label names, where from) of AG News' test split from --data; 256 texts with --quick."""
    from distrinews_lib.data.sources import load_dataset_splits, resolve_source

    source = resolve_source(data, "ag_news", hub=False)
    splits = load_dataset_splits("ag_news", source)
    texts, labels = splits.test_texts, splits.test_labels
    if quick:
        texts, labels = texts[:256], labels[:256]
    return texts, labels, list(splits.label_names), splits.detail


def accuracy_and_speed(fp32, int8, texts: list, labels: list, names: list) -> dict:
    """Both models on every text: accuracy, agreement, and texts/s in alternating chunks."""
    from distrinews_lib.serving.inference import predict_proba

    if list(fp32.label_names) != names:
        raise UserError(
            f"checkpoint {fp32.path} has the labels {fp32.label_names}, the test data {names}: "
            "it was not trained on this dataset."
        )
    probs, seconds = {"fp32": [], "int8": []}, {"fp32": 0.0, "int8": 0.0}
    for i in range(0, len(texts), 512):
        chunk = texts[i : i + 512]
        for name, loaded in (
            (("fp32", fp32), ("int8", int8)) if (i // 512) % 2 == 0 else (("int8", int8), ("fp32", fp32))
        ):
            t = time.perf_counter()
            probs[name].append(predict_proba(loaded, chunk, batch_size=64))
            seconds[name] += time.perf_counter() - t
    p32, p8 = torch.cat(probs["fp32"]), torch.cat(probs["int8"])
    y = torch.tensor(labels)
    acc32 = float((p32.argmax(-1) == y).float().mean())
    acc8 = float((p8.argmax(-1) == y).float().mean())
    return {
        "texts": len(texts),
        "accuracy": {
            "fp32": round(acc32, 5),
            "int8": round(acc8, 5),
            "delta_points": round(100 * (acc8 - acc32), 3),
            "labels_agree": round(float((p32.argmax(-1) == p8.argmax(-1)).float().mean()), 5),
            "largest_probability_difference": round(float((p32 - p8).abs().max()), 4),
        },
        "model_only": {
            "fp32_texts_per_s": round(len(texts) / seconds["fp32"], 1),
            "int8_texts_per_s": round(len(texts) / seconds["int8"], 1),
            "speedup": round(seconds["fp32"] / seconds["int8"], 3),
            "batch_size": 64,
            "torch_threads": torch.get_num_threads(),
        },
    }


def where_time_goes(loaded, texts: list) -> dict:
    """fp32: tokenizer vs forward pass, and the Linear layers' share of the forward pass (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    from distrinews_lib.serving.inference import model_accepts_token_type_ids, predict_proba

    batch = texts[:64]
    predict_proba(loaded, batch)  # warm
    t = time.perf_counter()
    enc = loaded.tokenizer(batch, truncation=True, max_length=loaded.max_length, padding=True, return_tensors="pt")
    tokenize_s = time.perf_counter() - t
    if not model_accepts_token_type_ids(loaded.model):
        enc.pop("token_type_ids", None)
    with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU]) as prof:
        t = time.perf_counter()
        for _ in range(3):
            loaded.model(**enc)
        forward_s = (time.perf_counter() - t) / 3
    linear_us = sum(e.cpu_time_total for e in prof.key_averages() if e.key == "aten::linear") / 3
    return {
        "batch": len(batch),
        "tokenize_ms": round(1000 * tokenize_s, 2),
        "forward_ms": round(1000 * forward_s, 2),
        "linear_share_of_forward": round(min(1.0, linear_us / 1e6 / forward_s), 3),
        "note": "Linear time from torch.profiler (aten::linear, in a profiled run, so slower than unprofiled); "
        "the share is what int8 can speed up",
    }


def weights(model) -> dict:
    embed = sum(
        p.numel() for m in model.modules() if isinstance(m, torch.nn.Embedding) for p in m.parameters(recurse=False)
    )
    linear = sum(p.numel() for m in model.modules() if type(m) is torch.nn.Linear for p in m.parameters(recurse=False))
    total = sum(p.numel() for p in model.parameters())
    return {
        "parameters": total,
        "embedding_parameters": embed,
        "linear_parameters": linear,
        "linear_share_of_all": round(linear / total, 4),
    }


def measure_checkpoint(
    checkpoint: Path, data: tuple, levels: list, duration: float, warmup: float, rounds: int, quick: bool
) -> dict:
    from distrinews_lib.serving.loading import check_for_serving

    texts, labels, names, _ = data
    torch.set_num_threads(max(1, our_settings()["torch_threads"]))  # as the server runs it (1 thread per pass)
    fp32 = check_for_serving(checkpoint, "cpu")
    row = {"model": {**model_description(checkpoint), **weights(fp32.model)}}
    row["fp32_time"] = where_time_goes(fp32, texts)
    int8 = check_for_serving(checkpoint, "cpu", "int8")  # refused as the server refuses it
    row["quantization"] = int8.quantization
    print(f"[{checkpoint}] accuracy on {len(texts)} test texts, fp32 and int8 ...", flush=True)
    row.update(accuracy_and_speed(fp32, int8, texts, labels, names))
    del fp32, int8
    ports = free_port(), free_port()
    servers = {
        "fp32": Server(checkpoint, ports[0], ["--device", "cpu"]),
        "int8": Server(checkpoint, ports[1], ["--device", "cpu", "--quantize", "int8"]),
    }
    for server in servers.values():
        server.launch()
    try:
        for name, server in servers.items():
            server.__enter__()
            print(f"[{name}] ready: {' '.join(server.cmd)}", flush=True)
        row["serving"] = race(servers, levels, duration, warmup, rounds)
    finally:
        for server in servers.values():
            server.__exit__(None, None, None)
    at16 = next((r for r in row["serving"] if r["concurrency"] == 16), None)
    acc = row["accuracy"]
    row["targets"] = {
        "accuracy": {
            "target": f"int8 within {ACCURACY_TOLERANCE_POINTS} points of fp32",
            "delta_points": acc["delta_points"],
            "met": abs(acc["delta_points"]) <= ACCURACY_TOLERANCE_POINTS,
        }
    }
    if at16:
        speedup = at16["int8"]["answered_per_s"] / max(at16["fp32"]["answered_per_s"], 1e-9)
        row["speedup_at_16_clients"] = round(speedup, 3)
        row["targets"]["throughput_at_16"] = {
            "target": f">= {SPEEDUP_TARGET_AT_16}x fp32's requests/s at 16 clients",
            "speedup": round(speedup, 3),
            "met": speedup >= SPEEDUP_TARGET_AT_16,
        }
    return row


def headline(r: dict) -> str:
    m, acc = r["model"], r["accuracy"]
    return (
        f"{m['checkpoint']} ({m['metadata_model']}, {m['parameters']:,} parameters, Linear "
        f"{100 * m['linear_share_of_all']:.0f}% of them and {100 * r['fp32_time']['linear_share_of_forward']:.0f}% "
        f"of the forward time): accuracy fp32 {100 * acc['fp32']:.2f}% int8 {100 * acc['int8']:.2f}% "
        f"({acc['delta_points']:+.2f} points); model-only speedup {r['model_only']['speedup']}x; "
        f"serving at 16 clients {r.get('speedup_at_16_clients')}x"
    )


def int8_main(args) -> None:
    from .provenance import load_average, machine_slug, provenance
    from .serving_compare import parse_levels

    levels = parse_levels(args.levels) if args.levels_given else ([16] if args.quick else [1, 16])
    duration = args.duration if args.duration is not None else (0.6 if args.quick else 4.0)
    warmup = args.warmup if args.warmup is not None else (0.3 if args.quick else 1.0)
    rounds = args.rounds if args.rounds is not None else (1 if args.quick else 3)
    info = provenance()
    started = time.time()
    data = test_split(args.data, args.quick)
    print(f"test data: {data[3]}, {len(data[0])} texts", flush=True)
    results = []
    with tempfile.TemporaryDirectory(prefix="distrinews-int8-") as tmp:
        checkpoints = args.checkpoint or [make_checkpoint(Path(tmp))]
        for checkpoint in checkpoints:
            if not Path(checkpoint).is_file():
                raise UserError(f"--checkpoint {checkpoint} does not exist")
            results.append(measure_checkpoint(Path(checkpoint), data, levels, duration, warmup, rounds, args.quick))
    report = {
        "what": "--quantize int8 against fp32, per checkpoint: accuracy on the test set, model speed, and serving "
        "throughput side by side (issue 34)",
        "quick": args.quick,
        "provenance": info,
        "data": {"detail": data[3], "test_texts": len(data[0])},
        "settings": {
            "concurrency_levels": levels,
            "duration_s_per_slice": duration,
            "warmup_s_per_slice": warmup,
            "rounds": rounds,
            "method": __doc__,
            "serving_method": RACE_DOC,
        },
        "checkpoints": results,
        "load_average_at_end": load_average(),  # 1, 5 and 15 minutes; the start is in provenance
        "wall_time_s": round(time.time() - started, 1),
    }
    report["headline"] = {"lines": [headline(r) for r in results]}
    out = args.output if args.output_given else REPO / "benchmarks" / f"serving_int8_{machine_slug()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print("\n" + "\n".join(report["headline"]["lines"]))
    print(f"wrote {out}")
