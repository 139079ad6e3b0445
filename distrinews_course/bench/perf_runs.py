"""Which runs chapter 05 launches, with which flags: the course's own scripts (train_single.py, train_ddp.py), run
unchanged by scripts/bench_runs.py, many in one torchrun launch.

    plan = perf_runs.Plan(env, batches=None, samples=None, rounds=3, accum=4)
    print(plan.describe())                 # one line: what the loopback launch measures
    R = plan.launch_loopback()             # the sweep, the levers and the all-reduces: {run name: what it measured}
    R.update(plan.launch_four_ranks())     # all_reduce on 4 processes ('collectives4')

Every run of the sweep has the same global work in its timed window (`samples` examples, at least 2 steps) after one
warm-up step (DDP builds its buckets in the first step). On a CPU each process gets one core (--threads 1), standing
in for one GPU, as in chapters 01 and 02.
"""

from __future__ import annotations

from pathlib import Path

from . import launches, loopback

SIZES = [4096 * 4**k for k in range(8)]  # 4 KiB .. 64 MiB: latency-bound to bandwidth-bound
HALVES_AT = 4 * 2**20  # the ring's two halves (reduce-scatter, all-gather) are timed at this size
WARMUP = 1
ACC_B, ACC_STEPS = 8, 48  # accumulation: 48 optimizer steps of 8 x ACCUM x N texts, enough to learn above chance
HOOK_B, HOOK_STEPS = 32, 40  # compression hooks: 40 steps of 64 texts, enough to learn above chance
LEARNING_RATE = 4e-3  # the accumulation and hook runs train briefly: a high rate, so that accuracy means something
HOOKS = ("allreduce", "fp16", "powersgd")


class Plan:
    """The chapter's runs on this machine (`env` from notebook.setup), their flags and where they write."""

    def __init__(self, env, batches=None, samples=None, rounds=3, accum=4, timeout_s=None, out="outputs/bench"):
        self.n, self.gpus, self.preset = env.nproc, env.n_gpus, env.preset
        self.batches = list(batches or ((8, 16, 32) if self.gpus else (16, 64, 256)))
        self.samples, self.rounds, self.accum = samples or 768, rounds, accum
        self.timeout = timeout_s or 1800  # a hang guard, not a speed claim: the launch takes about a minute here
        self.out = Path(out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.loopback_s = 0.0  # the loopback launches' seconds, once they ran

    @property
    def small(self) -> int:
        return self.batches[0]

    @property
    def large(self) -> int:
        return self.batches[-1]

    def base_flags(self) -> list:
        cores = [] if self.gpus else ["--threads", 1]
        return ["--config", self.preset, "--epochs", 1, "--eval_samples", 40, "--no-progress", "--no-snapshots", *cores]

    def flags(self, name, batch, steps, *extra, world=1, warmup=WARMUP) -> list:
        """A run's command line: `steps` timed optimizer steps after `warmup` ones, `batch` per process, `world`
        processes sharing the run's examples; its metrics and checkpoint in out/name."""
        return [
            *self.base_flags(),
            "--batch_size", batch,
            "--num_samples", (steps + warmup) * batch * world,
            "--max_steps_per_epoch", steps + warmup,
            "--output", self.out / name,
            "--checkpoint", self.out / name / "m.pt",
            *extra,
        ]  # fmt: skip

    def run(self, name, batch, steps, *extra, world=None, warmup=WARMUP, **more) -> dict:
        """One entry of a plan for scripts/bench_runs.py: `world` 1 runs train_single.py, N train_ddp.py."""
        world = self.n if world is None else world
        flags = self.flags(name, batch, steps, *extra, world=world, warmup=warmup)
        return dict(world=world, warmup=warmup, steps=steps, per_rank=batch, flags=[str(f) for f in flags], **more)

    def levers(self) -> dict:
        """The runs of sections 6 and 7: a profiled DDP run (Chrome traces), accumulation with and without no_sync,
        the compression hooks, and on GPUs fp16 against fp32."""
        runs = {"profiled": self.run("profiled", 64, 2, profile=str(self.out / "trace"))}
        for flag in ("--no_sync", "--no-no_sync"):
            name = "accum" + flag.replace("-", "_")
            flags = [
                *self.base_flags(),
                "--batch_size", ACC_B, "--grad_accum", self.accum, "--lr", LEARNING_RATE,
                "--num_samples", (ACC_STEPS + 1) * ACC_B * self.accum * self.n, "--eval_samples", 400,
                "--output", self.out / name, "--checkpoint", self.out / name / "m.pt", flag,
            ]  # fmt: skip
            runs[name] = dict(world=self.n, warmup=WARMUP, steps=ACC_STEPS, per_rank=ACC_B, flags=list(map(str, flags)))
        for hook in HOOKS:  # 2 warm-up steps: PowerSGD's plain ones; breakdown: the bytes each rank really wrote
            extra = ("--lr", LEARNING_RATE, "--eval_samples", 400)
            runs[f"hook_{hook}"] = self.run(
                f"hook_{hook}", HOOK_B, HOOK_STEPS, *extra, warmup=2, breakdown=True,
                **({"hook": hook} if hook != "allreduce" else {}),
            )  # fmt: skip
        if self.gpus:
            for amp in ("fp16", "off"):
                runs[f"amp_{amp}"] = self.run(f"ddp_amp_{amp}", self.large, 10, "--amp", amp)
        return runs

    def loopback_runs(self) -> dict:
        """Everything the loopback launch runs, in order: the all-reduces, the sweep's rounds, then the levers."""
        runs = {"collectives": {"collectives": {"sizes": SIZES, "halves_at": HALVES_AT}}}
        runs.update(loopback.sweep_plan(self.flags, self.batches, self.n, self.samples, self.rounds, WARMUP))
        return runs | self.levers()

    def describe(self) -> str:
        runs = self.loopback_runs()
        return (
            f"{len(runs)} runs in one launch: all_reduce at {len(SIZES)} sizes; {self.rounds} rounds of single, pair "
            f"and ddp at {self.batches} per process; then the levers"
        )

    def launch_loopback(self) -> dict:
        """The loopback launch; the cell shows one line per round as it ends, the whole log goes to out/bench.log."""
        R, self.loopback_s, _, _ = launches.launch_watched(
            "bench", self.n, self.loopback_runs(), self.out, self.timeout, self.gpus, echo=self.progress
        )
        print(f"{len(R)} runs in {self.loopback_s:.0f} s (each run's line in {self.out / 'bench.log'})")
        return R

    def progress(self, line: str) -> str | None:
        """bench_runs.py prints a line per run; the cell shows one per round of the sweep, and one for the levers."""
        name = (loopback.run_line(line) or "").split(":")[0]
        if name.startswith(f"solo_b{self.large}_r"):
            k = int(name.rsplit("_r", 1)[1])
            return f"round {k + 1} of {self.rounds}: single, pair and ddp at {self.batches} per process measured"
        return "the levers (traces, accumulation, compression hooks) measured" if name == "hook_powersgd" else None

    def launch_four_ranks(self) -> dict:
        """all_reduce on 4 processes over loopback (two to a core here: an upper bound on their time)."""
        plan = {"collectives4": {"collectives": {"sizes": SIZES[:-1]}}}
        R4, seconds = launches.launch("collectives4", 4, plan, self.out, self.timeout, self.gpus)
        self.loopback_s += seconds
        return R4

    # ------------------------------------------------------------------ the exercises' launches

    def straggler(self, sleep_ms: float) -> dict:
        """Exercise 2: plain DDP, then the same with the last rank sleeping `sleep_ms` after each optimizer step."""
        b = self.batches[len(self.batches) // 2]
        runs = {
            "ddp_normal": self.run("ddp_normal", b, 16, breakdown=True),
            "ddp_straggler": self.run("ddp_straggler", b, 16, breakdown=True, straggler_ms=sleep_ms),
        }
        R, *_ = launches.launch_watched("ex2", self.n, runs, self.out, self.timeout, self.gpus)
        return R

    def same_hardware(self, cores: int) -> dict:
        """Exercise 3: one process on one core, one on `cores` cores, and DDP (one core each), side by side."""
        steps, b = max(3, self.samples // (self.n * self.large)), self.large
        runs = {
            "one_core": self.run("one_core", self.n * b, steps, world=1),
            "all_cores": self.run("all_cores", self.n * b, steps, "--threads", cores, world=1),
            "ddp": self.run("ex3_ddp", b, steps),
        }
        R, *_ = launches.launch_watched("ex3", self.n, runs, self.out, self.timeout, self.gpus)
        return R
