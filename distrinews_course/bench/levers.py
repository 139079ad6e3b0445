"""Chapter 05's levers, each against plain DDP: small gradient buckets (compared within the sweep's rounds),
gradient compression hooks (the bytes each rank really wrote, and the accuracy they cost), gradient accumulation with
and without no_sync, fp16 autocast on GPUs, and the profiler's Chrome traces.

    print(levers.small_buckets_line(levers.small_buckets(sweep, fit, emb_share)))
    hooks = levers.Hooks(R, out); print(hooks.table()); settle(hooks.claims())
    acc = levers.NoSync(R, out, accum=4); print(acc.table()); settle(acc.claims())
"""

from __future__ import annotations

import contextlib
import json
import statistics
from pathlib import Path

from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel as DDP

from ..claims import Claim
from ..perf_model import best_bucket_mb
from . import loopback, quiet

HOOK_BYTES_BOUND = 0.02  # fp16 writes half the plain run's bytes within 2% (the rest: a few barriers and headers)
POWERSGD_SHARE = 0.10  # rank-1 PowerSGD writes under a tenth of them (1.7% measured on this model)
ACCURACY_POINTS = 0.03  # 16-bit gradients cost at most 3 points of accuracy on this short run
LEARNED = 0.40  # both no_sync runs score above this on held-out texts (chance: 25%, four topics)
NO_SYNC_WEIGHTS = 0.01  # no_sync's weights within 1% of how far training moved them: rounding, not a new result


def small_buckets(sweep: loopback.Sweep, fit, emb_share: float) -> dict | None:
    """Small buckets against plain DDP at the largest batch, round by round (the runs of a round ran back to back):
    each round's step ratio, their median, all-reduces per step of each, and the exposed communication the bucket
    model (perf_model.best_bucket_mb) predicts for each. None where the sweep had no `buckets` runs."""
    b = sweep.large
    names = [(f"ddp_b{b}_r{k}", f"buckets_b{b}_r{k}") for k in range(sweep.rounds)]
    if any(small not in sweep.R for _, small in names):
        return None
    runs = [(sweep.R[plain], sweep.R[small]) for plain, small in names]
    ratios = [loopback.step_s(s) / loopback.step_s(p) for p, s in runs]
    per_step = lambda run: run["ranks"][0]["allreduces"] / run["ranks"][0]["synced_backwards"]  # noqa: E731
    plain = sweep.run("ddp")
    backward = loopback.part(plain, "backward")
    last = sweep.model.grad_bytes * emb_share
    exposed = best_bucket_mb(fit, sweep.model.grad_bytes, backward, last, [loopback.SMALL_BUCKET_MB, 25])
    return dict(
        ratios=ratios,
        ratio=statistics.median(ratios),
        plain_ms=1000 * sweep.ddp_s,  # section 2's DDP step (the round of the median speedup): one figure, one value
        small_ms=1000 * statistics.median(loopback.step_s(s) for _, s in runs),
        allreduces=(per_step(runs[0][0]), per_step(runs[0][1])),
        exposed_ms={cap: 1000 * v for cap, v in exposed.items()},
        quiet=quiet.all_quiet([r for pair in runs for r in pair], sweep.gpus),
        runs=[r for pair in runs for r in pair],
    )


def embedding_share(out, run: str) -> float:
    """The share of the gradient bytes held by the input embeddings (word and position) of the model `run` trained:
    the LAST gradients backward makes (they belong to the first layer), each one tensor that no bucket splits. From
    the model's own shapes (cluster_model.transformer_tensors), built as the run built it."""
    from ..cluster_model import transformer_tensors

    tensors = transformer_tensors(_model(out, run))
    return sum(b for b, ready in tensors if ready == 1.0) / sum(b for b, _ in tensors)


def _model(out, run: str):
    """The model `run` trained, with the weights it started from (same config, same seed)."""
    from distrinews_lib.data.texts import AG_NEWS_LABELS
    from distrinews_lib.models.build import build_model
    from distrinews_lib.training.config import RunConfig

    cfg = _metrics(out, run)["config"]
    return build_model(RunConfig(model=cfg["model_resolved"], seed=cfg["seed"]), AG_NEWS_LABELS)[0]


def small_buckets_line(s: dict) -> str:
    """Small buckets' step beside what the bucket model predicts for it, shown and not checked: the model predicts the
    step longer by the difference in exposed communication (zero here: the embeddings' gradient, most of the bytes, is
    one tensor backward makes last, so its all-reduce starts after backward whatever the bucket size). The whole
    exposed communication at stake is ~10 ms on a ~380 ms step, while the rounds' paired differences spread over tens
    of ms: a check within that noise could only confirm "no large change", a null result. So the line prints the
    prediction beside each round's measured difference and says which side of the prediction the rounds fell: all
    of them (the model misses a cost, or a saving), or both (this box cannot tell)."""
    runs = [(loopback.step_s(p), loopback.step_s(q)) for p, q in zip(s["runs"][::2], s["runs"][1::2])]
    diffs = sorted(1000 * (small - plain) for plain, small in runs)
    exposed = s["exposed_ms"]
    small_cap, plain_cap = min(exposed), max(exposed)
    predicted = exposed[small_cap] - exposed[plain_cap]
    if diffs[0] <= predicted <= diffs[-1]:
        tell = "its runs fall on both sides of the prediction: this box cannot tell the two apart"
    elif diffs[0] > predicted:
        tell = (
            "every round was slower than predicted: the model charges an all-reduce that overlaps backward nothing, "
            "yet it runs beside backward on the same cores (on a GPU, the same device)"
        )
    else:
        tell = "every round was faster than predicted: small buckets hid communication the model says cannot hide"
    small, plain = s["allreduces"][1], s["allreduces"][0]
    rounds = ", ".join(f"{d:+.0f}" for d in diffs)
    return (
        f"{small_cap} MiB buckets ({small:.0f} all-reduces a step, against {plain:.0f} with {plain_cap} MiB):\n"
        f"  predicted by the bucket model: the step {predicted:+.1f} ms (exposed communication "
        f"{exposed[small_cap]:.1f} ms, against {exposed[plain_cap]:.1f})\n"
        f"  measured, small minus plain: {rounds} ms (median {statistics.median(diffs):+.0f} ms, "
        f"{s['ratio']:.2f}x plain DDP's step; section 2's DDP step: {s['plain_ms']:.1f} ms)\n"
        f"  {tell}" + ("" if s["quiet"] else f" ({quiet.busy_reason(s['runs'])})")
    )


def _metrics(out: Path, name: str) -> dict:
    return json.loads((Path(out) / name / "metrics.json").read_text())


class Hooks:
    """The compression hooks' runs: plain all-reduce, fp16, PowerSGD rank 1, each training the same short run."""

    NAMES = {"allreduce": "hook_allreduce", "fp16": "hook_fp16", "powersgd": "hook_powersgd"}

    def __init__(self, R: dict, out, gpus: bool = False):
        self.gpus = gpus
        self.rows = {}
        for hook, name in self.NAMES.items():
            r, rank0 = R[name], R[name]["ranks"][0]
            self.rows[hook] = dict(
                counted=rank0["bytes_sent_per_step"] / 2**20,  # what the hook handed to all_reduce
                wire=(rank0.get("wire_bytes_per_step") or 0) / 2**20,  # what the process really wrote
                ms=1000 * r["seconds"] / r["steps"],
                acc=_metrics(out, name)["epochs"][-1]["val_accuracy"],
            )

    def table(self) -> str:
        lines = [f"{'hook':<10} {'MiB written/step':>16} {'ms/step':>8} {'val acc':>8}"]
        for hook, r in self.rows.items():
            wire = f"{r['wire']:.2f}" if r["wire"] else "n/a"
            lines.append(f"{hook:<10} {wire:>16} {r['ms']:>8.1f} {100 * r['acc']:>7.1f}%")
        return "\n".join(lines)

    def claims(self) -> list[Claim]:
        """What each rank really wrote (its /proc/self/io, not the hook's own count): fp16 half the plain run's bytes
        within HOOK_BYTES_BOUND, PowerSGD under POWERSGD_SHARE of them; 16-bit gradients cost at most ACCURACY_POINTS
        of accuracy. On GPUs NCCL's bytes are not the process's writes: the byte claims are shown, not checked."""
        plain, fp16, psgd = (self.rows[h] for h in ("allreduce", "fp16", "powersgd"))
        why = "nothing here counts the bytes a GPU sends (NCCL)" if self.gpus or not plain["wire"] else None
        half = fp16["wire"] / plain["wire"] if plain["wire"] else float("nan")
        share = psgd["wire"] / plain["wire"] if plain["wire"] else float("nan")
        return [
            Claim(
                f"fp16 compression writes half the bytes ({half:.3f} of the plain run's)",
                abs(half / 0.5 - 1) < HOOK_BYTES_BOUND,
                why,
            ),
            Claim(f"PowerSGD (rank 1) writes {100 * share:.1f}% of them", share < POWERSGD_SHARE, why),
            Claim(
                f"16-bit gradients cost at most {100 * ACCURACY_POINTS:.0f} points of accuracy on this run "
                f"({100 * fp16['acc']:.1f}% against {100 * plain['acc']:.1f}%)",
                abs(fp16["acc"] - plain["acc"]) <= ACCURACY_POINTS,
            ),
        ]

    def powersgd_line(self) -> str:
        plain, psgd = self.rows["allreduce"], self.rows["powersgd"]
        verdict = "about as well" if psgd["acc"] >= plain["acc"] - 0.05 else "noticeably less"
        return (
            f"PowerSGD: {100 * psgd['acc']:.1f}% against {100 * plain['acc']:.1f}% with plain all-reduce: on this "
            f"short run it learns {verdict}"
        )


class NoSync:
    """Gradient accumulation over `accum` micro-batches, with no_sync (one all-reduce per optimizer step) and without
    (one per micro-batch), both from the same seed on the same data."""

    RUNS = ("accum__no_sync", "accum__no_no_sync")

    def __init__(self, R: dict, out, accum: int):
        import torch

        self.out, self.accum = Path(out), accum
        self.on, self.off = (R[n] for n in self.RUNS)
        w = {n: torch.load(self.out / n / "m.pt", weights_only=True)["state_dict"] for n in self.RUNS}
        self.diff = max(float((w[self.RUNS[0]][k] - w[self.RUNS[1]][k]).abs().max()) for k in w[self.RUNS[0]])
        self.moved = max(float((w[self.RUNS[0]][k] - v).abs().max()) for k, v in self._initial().items())
        self.metrics = {n: _metrics(self.out, n)["epochs"][-1] for n in self.RUNS}

    def _initial(self) -> dict:
        """The weights both runs started from (same config, same seed)."""
        return _model(self.out, self.RUNS[0]).state_dict()

    @property
    def time_ratio(self) -> float:
        return self.off["seconds"] / self.on["seconds"]

    def table(self) -> str:
        lines = [
            f"{'run':<18} {'synced backwards':>16} {'all-reduces':>11} {'MiB sent':>8} {'seconds':>8} {'val acc':>8}"
        ]
        for name, r in zip(self.RUNS, (self.on, self.off)):
            r0 = r["ranks"][0]
            lines.append(
                f"{name:<18} {r0['synced_backwards']:>16} {r0['allreduces']:>11} {r0['allreduce_bytes'] / 2**20:>8.0f} "
                f"{r['seconds']:>8.2f} {100 * self.metrics[name]['val_accuracy']:>7.1f}%"
            )
        lines.append(
            f"with no_sync the run took {self.time_ratio:.2f}x less time; the two trained models' weights differ by up "
            f"to {self.diff:.1e}, and training moved a weight by up to {self.moved:.2f}"
        )
        return "\n".join(lines)

    def claims(self) -> list[Claim]:
        """Counted by the communication hook on every all-reduce DDP launched: no_sync syncs once per optimizer step,
        without it once per micro-batch (accum x the bytes); both learn (above LEARNED on held-out texts, chance
        25%); and skipping the intermediate all-reduces changes nothing but rounding: the same loss to 1e-3, weights
        within NO_SYNC_WEIGHTS of how far training moved them."""
        on, off = self.on["ranks"][0], self.off["ranks"][0]
        steps, acc = self.on["steps"], [m["val_accuracy"] for m in self.metrics.values()]
        losses = [m["train_loss"] for m in self.metrics.values()]
        return [
            Claim(f"with no_sync: one all-reduce round per optimizer step ({steps})", on["synced_backwards"] == steps),
            Claim(
                f"without: one per micro-batch ({self.accum} per step), {self.accum}x the bytes",
                off["synced_backwards"] == self.accum * steps
                and off["allreduce_bytes"] == self.accum * on["allreduce_bytes"],
            ),
            Claim(
                f"both runs learned: above {100 * LEARNED:.0f}% on held-out texts (chance 25%; the lower scored "
                f"{100 * min(acc):.1f}%)",
                min(acc) > LEARNED,
            ),
            Claim(
                f"skipping the intermediate all-reduces did not change the training: loss {losses[0]:.4f} vs "
                f"{losses[1]:.4f}, weights within {100 * self.diff / self.moved:.2f}% of how far training moved them",
                abs(losses[0] - losses[1]) < 1e-3 and self.diff < NO_SYNC_WEIGHTS * self.moved,
            ),
        ]


def amp(R: dict, gpu_names) -> tuple[str, Claim | None]:
    """fp16 autocast against fp32 on GPUs (a line, and the claim that it is faster); on a CPU, why nothing is
    measured."""
    if "amp_fp16" not in R:
        return (
            "skipped: fp16 autocast, measured on GPUs only (a T4 has fp16 tensor cores; a CPU has none).",
            None,
        )
    speedup = R["amp_off"]["seconds"] / R["amp_fp16"]["seconds"]
    line = (
        f"fp16: {R['amp_fp16']['samples_per_s']:.0f} samples/s | fp32: {R['amp_off']['samples_per_s']:.0f} "
        f"samples/s: {speedup:.2f}x on {', '.join(gpu_names)}"
    )
    return line, Claim("fp16 autocast is faster than fp32 on this GPU", speedup > 1.0)


def traces(out) -> tuple[str, Claim]:
    """The profiled run's Chrome traces, one per rank: their sizes, and the claim that each holds the all-reduce and the
    optimizer step (the profiler saw both: what the learner will look for in Perfetto)."""
    files = sorted(Path(out).glob("trace_rank*.json"))
    names = [{e.get("name", "") for e in json.loads(t.read_text())["traceEvents"]} for t in files]
    lines = "\n".join(
        f"{t}  {t.stat().st_size / 2**20:.1f} MiB, {len(n)} distinct event names" for t, n in zip(files, names)
    )
    ok = len(files) >= 2 and all(
        any("all_reduce" in x for x in n) and any("Optimizer.step" in x for x in n) for n in names
    )
    return lines, Claim(
        f"one Chrome trace per rank ({len(files)}), each with the all-reduce and the optimizer step", ok
    )


def with_levers(model, micro_batches, optimizer, accum=4, powersgd=False):
    """Section 6's levers in your own loop, as on Kaggle: the torch calls the chapter's launch made, one a run."""
    model = DDP(model, bucket_cap_mb=0.25)  # smaller buckets (25 MiB by default)
    if powersgd:  # rank-1 approximations with error feedback, after 2 plain steps
        state = powerSGD_hook.PowerSGDState(None, matrix_approximation_rank=1, start_powerSGD_iter=2)
        model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    else:  # half the bytes: each bucket cast to fp16, all-reduced, cast back
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    for i, batch in enumerate(micro_batches, 1):  # no_sync: one all-reduce every `accum` micro-batches
        with model.no_sync() if i % accum else contextlib.nullcontext():
            (model(**batch).loss / accum).backward()
        if i % accum == 0:
            optimizer.step()
            optimizer.zero_grad()
    return model
