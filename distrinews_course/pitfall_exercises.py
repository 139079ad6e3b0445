"""The checkers of chapter 04's exercises: code the learner writes, and predictions written down before a run.

    grade(exact_accuracy, exact_accuracy_cases())          # exercise 1: pitfall 6's fix, written by the learner
    grade(accumulate_step, accumulation_cases())           # exercise 2: pitfall 8's loop, against a stand-in DDP
    ex = PredictionRuns(PITFALLS, OUT, NP, timeout).run()  # exercises 3-5: pitfalls 12, 8 and 6 run again
    ex.grade(MY_BATCHNORM, MY_ALLREDUCES, MY_EVEN_SIZE_STILL_WRONG)   # {3: None when right, else the mistake, ...}

Every failing case says in one line which mistake it found.
"""

from __future__ import annotations

import contextlib
import copy
import json
from pathlib import Path

import torch
from torch.utils.data import DistributedSampler

# Exercise 1 -------------------------------------------------------------------------------------------------------


def evaluated_pairs(n: int, world: int, correct) -> list:
    """What `world` ranks evaluated of an n-sample set with DistributedSampler (no shuffle, padding included): per
    rank, the (dataset index, correct) pairs, as evaluation.gather returns them."""
    return [
        [(i, bool(correct[i])) for i in DistributedSampler(range(n), num_replicas=world, rank=r, shuffle=False)]
        for r in range(world)
    ]


def _judge_accuracy(per_rank, truth: float):
    pairs = [p for pr in per_rank for p in pr]
    padded = sum(c for _, c in pairs) / len(pairs)
    n = len({i for i, _ in pairs})
    deduped_over_padded = sum(dict(pairs).values()) / len(pairs)
    kept = [p for pr in per_rank for p in pr[:-1]]
    last_dropped = sum(c for _, c in kept) / len(kept) if kept else None

    def judge(got):
        if got is None:
            return "it returned None: return the accuracy, a number between 0 and 1"
        got = float(got)
        if abs(got - truth) < 1e-12:
            return None
        if abs(got - 100 * truth) < 1e-9:
            return f"{got:.2f} is a percentage; return a fraction ({truth:.4f})"
        if abs(got - padded) < 1e-12:
            return f"{got:.4f}: the sampler's padded duplicates were counted too ({len(pairs)} pairs for {n} samples)"
        if abs(got - deduped_over_padded) < 1e-12:
            return (
                f"{got:.4f}: each sample's vote counted once, but divided by the {len(pairs)} pairs; divide by "
                f"the {n} samples"
            )
        if last_dropped is not None and abs(got - last_dropped) < 1e-12:
            return (
                f"{got:.4f}: every rank's last pair was dropped, but only the ranks that got a repeated index "
                "hold padding; keep one vote per dataset index instead"
            )
        return f"{got:.4f}, but the true accuracy of the {n} samples is {truth:.4f}"

    return judge


def exact_accuracy_cases() -> list:
    """(what, args, judge) for grade(exact_accuracy, ...): sizes that pad and one that does not; correct on every
    third sample and the last (the last sample is never a padded one, the first always is)."""
    cases = []
    for n, world in ((9, 2), (10, 4), (7, 3), (13, 4), (8, 2)):
        correct = [i % 3 == 0 or i == n - 1 for i in range(n)]
        per_rank = evaluated_pairs(n, world, correct)
        padded = sum(len(pr) for pr in per_rank)
        what = f"{n} samples on {world} ranks" + (f" (padded to {padded})" if padded > n else " (no padding)")
        cases.append((what, ([list(pr) for pr in per_rank],), _judge_accuracy(per_rank, sum(correct) / n)))
    return cases


# Exercise 2 -------------------------------------------------------------------------------------------------------


class StandInDDP(torch.nn.Module):
    """DDP on one rank, as far as accumulation can tell: a forward run outside no_sync() makes its backward
    all-reduce (DDP decides it in the forward, as the real one does: prepare_for_backward); inside no_sync() the
    backward only adds into .grad. `synced` lists, per backward, whether it all-reduced; `forwards` counts."""

    def __init__(self, module: torch.nn.Module):
        super().__init__()
        self.module, self.synced, self.forwards, self._sync = module, [], 0, True

    @contextlib.contextmanager
    def no_sync(self):
        before, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = before

    def forward(self, *args, **kwargs):
        out = self.module(*args, **kwargs)
        self.forwards += 1
        if out.requires_grad:
            sync = self._sync
            out.register_hook(lambda grad: self.synced.append(sync))
        return out


class CountingSGD(torch.optim.SGD):
    """Plain SGD that counts its steps."""

    def __init__(self, params, lr):
        super().__init__(params, lr=lr)
        self.steps = 0

    def step(self, closure=None):
        self.steps += 1
        return super().step(closure)


def _micro_batches(k: int, size: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(size, 6, generator=g), torch.randint(0, 3, (size,), generator=g)) for _ in range(k)]


def _grad_of(model, batches) -> torch.Tensor:
    """The gradient of the mean loss over `batches` (equal sizes: the mean of their means), flattened."""
    model = copy.deepcopy(model)
    loss = sum(torch.nn.functional.cross_entropy(model(x), y) for x, y in batches) / len(batches)
    loss.backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


LR = 0.5


def _accumulation_case(k: int, seed: int):
    torch.manual_seed(seed)
    net = torch.nn.Linear(6, 3)
    batches = _micro_batches(k, 4, seed)
    want = _grad_of(net, batches)
    last = _grad_of(net, batches[-1:])
    candidates = {
        f"the gradient is {k}x too large: divide each micro-batch's loss by the number of micro-batches ({k})": k
        * want,
        "only the last micro-batch's gradient reached the step: zero_grad() inside the loop threw the others away": (
            last / k
        ),
        "only the last micro-batch's gradient reached the step, undivided: zero the gradients once, before the loop": (
            last
        ),
    }
    model = StandInDDP(net)
    stale = [torch.full_like(p, 0.25) for p in net.parameters()]  # what the previous step left behind
    for p, s in zip(net.parameters(), stale):
        p.grad = s.clone()
    candidates["the step used the previous step's leftover gradients too: zero them before the first micro-batch"] = (
        want + torch.cat([s.reshape(-1) for s in stale])
    )
    before = torch.cat([p.detach().reshape(-1) for p in net.parameters()]).clone()
    optimizer = CountingSGD(net.parameters(), LR)

    def judge(_):
        if optimizer.steps != 1:
            return (
                f"optimizer.step() ran {optimizer.steps} times for {k} micro-batches: step once, after the last "
                "backward"
                if optimizer.steps
                else "optimizer.step() never ran: step once, after the last backward"
            )
        if model.forwards != k:
            return (
                f"{model.forwards} forward pass(es) for {k} micro-batches: run each micro-batch through the model on "
                "its own (that is what keeps its activations small)"
            )
        synced = model.synced
        if len(synced) != k:
            return f"{len(synced)} backward pass(es) for {k} micro-batches: one backward per micro-batch"
        if not any(synced):
            return (
                "no backward ran outside model.no_sync(): the gradients were never averaged across the ranks; the "
                "last micro-batch must run outside it"
            )
        if all(synced) and k > 1:
            return (
                f"all {k} backwards all-reduced: {k}x the communication; run every micro-batch but the last inside "
                "model.no_sync()"
            )
        if sum(synced) > 1:
            return f"{sum(synced)} of the {k} backwards all-reduced: only the last one should"
        if not synced[-1]:
            return (
                f"the backward that all-reduced was micro-batch {synced.index(True) + 1} of {k}, not the last: the "
                "gradients added after it were never averaged"
            )
        after = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
        used = (before - after) / LR
        if torch.allclose(used, want, atol=1e-6):
            return None
        for mistake, grad in candidates.items():
            if torch.allclose(used, grad, atol=1e-6):
                return mistake
        moved, should = float((before - after).norm()), float((LR * want).norm())
        return f"the step moved the weights by {moved:.4f}; the mean loss's gradient moves them by {should:.4f}"

    loss_fn = torch.nn.functional.cross_entropy
    what = f"{k} micro-batch{'es' if k > 1 else ''} of 4 samples"
    return (what, (model, optimizer, batches, loss_fn), judge)


def accumulation_cases() -> list:
    """(what, args, judge) for grade(accumulate_step, ...): a stand-in DDP over a real linear model, plain SGD that
    counts its steps, and gradients left over from a previous step. Judged: one optimizer step; a forward and a
    backward per micro-batch; only the last backward all-reducing; and the weights moved by the mean loss's gradient."""
    return [_accumulation_case(4, 0), _accumulation_case(3, 1), _accumulation_case(1, 2)]


# Exercises 3-5: predictions -----------------------------------------------------------------------------------------


def _blank(prediction: dict, example: str):
    missing = [k for k, v in prediction.items() if v is None]
    return f"fill in {', '.join(missing)} first (e.g. {example})" if missing else None


def batchnorm_prediction(prediction: dict, small: dict, big: dict) -> str | None:
    """Exercise 3: with 64 samples per rank instead of 4, do the unsynchronised running means come closer to the global
    batch's ("closer") or go "further"; and does SyncBatchNorm still match it within float rounding, a difference
    below 1e-4 (True/False)? Not exactly: the same sums, added in another order in fp32. None when right."""
    if problem := _blank(prediction, '{"closer_or_further": "closer", "sync_within_rounding": True}'):
        return problem
    closer = big["broken"]["mean_diff_to_global"] < small["broken"]["mean_diff_to_global"]
    said = str(prediction["closer_or_further"]).strip().lower()
    if said not in ("closer", "further"):
        return f"closer_or_further = {prediction['closer_or_further']!r}: write 'closer' or 'further'"
    if (said == "closer") != closer:
        return (
            f"'{said}', but the run went {'closer' if closer else 'further'}: a mean over 64 samples varies less "
            "than one over 4, so each rank's statistics come nearer the global batch's"
        )
    diff = big["fixed"]["mean_diff_to_global"]
    if bool(prediction["sync_within_rounding"]) != (diff < 1e-4):
        if diff >= 1e-4:  # the run, not the prediction, is off: its claims (PredictionRuns.claims) fail too
            return f"this run's SyncBatchNorm ended {diff:.1e} from the global batch's: not within float rounding"
        return (
            "SyncBatchNorm all-reduces the sums, so it computes the global batch's statistics at any per-rank "
            f"batch: it stays equal within float rounding (max difference {diff:.1e})"
        )
    return None


def accumulation_prediction(prediction: dict, r8: dict, per_backward: int) -> str | None:
    """Exercise 4: all-reduces per optimizer step with --accum 8, without and with no_sync. None when right.

    The trap: one backward all-reduces once per gradient bucket (per_backward), not once."""
    if problem := _blank(prediction, '{"without": 8, "with": 1}'):
        return problem
    without, with_ = r8["broken"]["allreduce_per_step"], r8["fixed"]["allreduce_per_step"]
    got = (prediction["without"], prediction["with"])
    if got == (without, with_):
        return None
    if got == (without / per_backward, with_ / per_backward) and per_backward > 1:
        return (
            f"you counted backwards, not all-reduces: each backward all-reduces {per_backward} gradient buckets, so "
            f"{without:.0f} without no_sync and {with_:.0f} with it"
        )
    if prediction["with"] == 0:
        return f"with no_sync the last micro-batch still all-reduces: {with_:.0f}, not 0"
    return f"({got[0]}, {got[1]}), but the run made {without:.0f} without no_sync and {with_:.0f} with it"


def even_size_prediction(still_wrong, r: dict) -> str | None:
    """Exercise 5: with an evaluation set whose size divides by the ranks, is the broken evaluation still wrong
    (True) or exact (False)? None when right."""
    if still_wrong is None:
        return "fill in MY_EVEN_SIZE_STILL_WRONG first (True or False)"
    wrong = abs(r["broken"]["accuracy"] - r["truth_accuracy"]) > 1e-12
    if bool(still_wrong) == wrong:
        return None
    return (
        "it is exact here: a size that divides by the ranks needs no padding, so nothing is counted twice; that is "
        "why the bug survives a quick test on a round number of samples"
    )


class PredictionRuns:
    """Exercises 3-5's runs, in one launch the first time they are asked for: pitfall 12 with 64 samples per rank,
    8 with 8 micro-batches per step, and 6 with an evaluation set of 4 x ranks samples. Beside them, the chapter's own
    runs of 12, 8 and 6 (their JSONs in `out`), which the answers compare against."""

    def __init__(self, folder, out, nproc: int, timeout: float):
        from .demo import SharedLaunch

        self.out, folder, ex = Path(out), Path(folder), Path(out) / "exercises"
        self.launch = SharedLaunch(
            [
                (folder / "12_batchnorm.py", ["--batch", 64, "--out", ex / "12_batch64.json"], ex / "12_batch64.json"),
                (
                    folder / "08_no_sync.py",
                    ["--accum", 8, "--steps", 2, "--out", ex / "08_accum8.json"],
                    ex / "08_accum8.json",
                ),
                (folder / "06_eval_padding.py", ["--n", 4 * nproc, "--out", ex / "06_even.json"], ex / "06_even.json"),
            ],
            nproc,
            timeout,
        )
        self.done = False

    def run(self):
        """Launch (once) and read every result: big, small (pitfall 12), r8, r4 (pitfall 8), even (pitfall 6)."""
        read = lambda name: json.loads((self.out / name).read_text())
        self.big, self.r8, self.even = (
            self.launch(n, echo=False)[1] for n in ("12_batchnorm.py", "08_no_sync.py", "06_eval_padding.py")
        )
        self.small, self.r4 = read("12_batchnorm.json"), read("08_no_sync.json")
        self.per_backward = round(self.r4["fixed"]["allreduce_per_step"])  # bucket all-reduces of ONE backward
        self.done = True
        return self

    def table(self) -> str:
        rows = [
            f"{r['batch_per_rank']:>3} per rank: unsynchronised running means off the global batch's by up to "
            f"{r['broken']['mean_diff_to_global']:.3f}; SyncBatchNorm by {r['fixed']['mean_diff_to_global']:.1e}"
            for r in (self.small, self.big)
        ]
        rows.append(
            f"--accum 8: {self.r8['broken']['allreduce_per_step']:.0f} all-reduces per step without no_sync, "
            f"{self.r8['fixed']['allreduce_per_step']:.0f} with it (one backward: {self.per_backward})"
        )
        e = self.even
        rows.append(
            f"{e['n']} samples on {e['world_size']} ranks: padded to {e['padded_to']}; broken counted "
            f"{e['broken']['counted']}, accuracy {e['broken']['accuracy']:.4f} (truth {e['truth_accuracy']:.4f})"
        )
        return "\n".join(rows)

    def grade(self, batchnorm: dict, allreduces: dict, still_wrong) -> dict:
        """{exercise number: None when right, else the mistake}."""
        return {
            3: batchnorm_prediction(batchnorm, self.small, self.big),
            4: accumulation_prediction(allreduces, self.r8, self.per_backward),
            5: even_size_prediction(still_wrong, self.even),
        }

    def claims(self) -> list:
        """What the three runs show. Margins as in pitfall_symptoms: above 1e-3 is a real difference, below 1e-4 the
        same statistics summed in another order; the parameters agree within 1e-5 (fp32 sums, reordered)."""
        from .claims import Claim

        big, small, r8, even, k = self.big, self.small, self.r8, self.even, self.per_backward
        return [
            Claim(
                "with 64 per rank the per-rank statistics come closer to the global batch's (less sampling noise)...",
                big["broken"]["mean_diff_to_global"] < small["broken"]["mean_diff_to_global"],
            ),
            Claim(
                "... but still differ: only synchronising makes them equal, at any per-rank batch",
                big["broken"]["mean_diff_to_global"] > 1e-3 and big["fixed"]["mean_diff_to_global"] < 1e-4,
            ),
            Claim(
                f"--accum 8 without no_sync: 8 backwards x {k} bucket(s) each; with it, one synced backward",
                r8["broken"]["allreduce_per_step"] == 8 * k and r8["fixed"]["allreduce_per_step"] == k,
            ),
            Claim("and the same parameters either way", r8["max_param_diff_broken_vs_fixed"] < 1e-5),
            Claim(
                f"{even['n']} samples divide by {even['world_size']} ranks: no padding, so the broken evaluation is "
                "exact here, which is why the bug survives tests on round numbers",
                even["padded_to"] == even["n"] == even["broken"]["counted"]
                and abs(even["broken"]["accuracy"] - even["truth_accuracy"]) < 1e-12,
            ),
        ]
