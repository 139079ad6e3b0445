"""A real Slurm cluster on this machine: scripts/slurm/local_cluster.sh starts munged, slurmctld and two slurmd (one per
network namespace, so the job's two torchrun agents really sit on two hosts), the tests submit
scripts/slurm/train_ddp.sbatch with sbatch, wait for it (bounded), and check what it trained. A second job is
requeued mid-run, as Slurm does when a node fails, and must end bit-identical to the first.

Skips, saying why, where Slurm is not installed (CI installs it: .ci/run calls `local_cluster.sh install`) or the
machine refuses (not root, not Linux). The cluster is stopped in the fixture's teardown, whatever happens.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest
import torch

from .helpers import ROOT, SCRIPTS

LOCAL = SCRIPTS / "slurm" / "local_cluster.sh"
SBATCH = SCRIPTS / "slurm" / "train_ddp.sbatch"
TRAIN = [
    "--config",
    "cpu_smoke",
    "--data",
    "embedded",
    "--epochs",
    "2",
    "--num_samples",
    "640",
    "--eval_samples",
    "64",
    "--batch_size",
    "16",
    "--snapshot_every",
    "3",
    "--no-progress",
    "--threads",
    "1",
    "--ddp_timeout",
    "60",
]
JOB_TIMEOUT = 300  # seconds a job may take before the test cancels it and fails
TIMINGS = {}


def _why_not() -> str | None:
    if not sys.platform.startswith("linux"):
        return "Slurm runs on Linux only"
    if os.geteuid() != 0:
        return "the local cluster runs slurmctld/slurmd as root; this test runs as uid %d" % os.geteuid()
    missing = [c for c in ("slurmctld", "slurmd", "sbatch", "scontrol", "munged") if not shutil.which(c)]
    if missing:
        return (
            f"Slurm is not installed ({', '.join(missing)} missing); install it with `bash scripts/slurm/"
            "local_cluster.sh install` (root, apt-get; CI does this in .ci/run)"
        )
    return None


pytestmark = [pytest.mark.slow, pytest.mark.skipif(_why_not() is not None, reason=str(_why_not()))]


class Cluster:
    def __init__(self, state):
        self.env = dict(os.environ, SLURM_LOCAL_DIR=str(state))

    def sh(self, *args, timeout=60, check=True) -> str:
        r = subprocess.run(
            ["bash", str(LOCAL), *map(str, args)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env,
            cwd=ROOT,
        )
        if check and r.returncode != 0:
            raise AssertionError(
                f"local_cluster.sh {' '.join(map(str, args[:3]))} failed ({r.returncode}):\n"
                f"{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
            )
        return r.stdout

    def submit(self, out, log, extra_env=()) -> str:
        env = ["env", f"OUTPUT={out}", *extra_env]
        if self.nodes == 2:  # two nodes, one rank each
            env.append("GLOO_SOCKET_IFNAME=veth0")
            shape = ["--nodes=2"]
        else:  # one node (no namespaces here): its two CPUs, two ranks
            env.append("NPROC_PER_NODE=2")
            shape = ["--nodes=1", "--cpus-per-task=2"]
        return (
            self.sh("run", *env, "sbatch", "--parsable", f"--output={log}", *shape, SBATCH, *TRAIN)
            .strip()
            .split(";")[0]
        )

    def job(self, job_id) -> dict:
        text = self.sh("run", "scontrol", "show", "job", "-o", job_id)
        return dict(kv.split("=", 1) for kv in text.split() if "=" in kv)

    def wait(self, job_id, log, timeout=JOB_TIMEOUT) -> dict:
        deadline = time.time() + timeout
        while time.time() < deadline:
            info = self.job(job_id)
            if info["JobState"] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"):
                return info
            time.sleep(1)
        self.sh("run", "scancel", job_id, check=False)
        raise AssertionError(f"job {job_id} still {info['JobState']} after {timeout} s; log:\n{_tail(log)}")


def _tail(path, n=60) -> str:
    try:
        return "\n".join(path.read_text().splitlines()[-n:])
    except OSError:
        return "(no log)"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    state = tmp_path_factory.mktemp("slurm_state")
    c = Cluster(state)
    t = time.time()
    try:
        print(c.sh("start", timeout=120))
        c.nodes = int((state / "nodes").read_text())
        TIMINGS["cluster start (s)"] = round(time.time() - t, 1)
        yield c
    finally:
        c.sh("stop", timeout=120, check=False)
        TIMINGS["module wall time (s)"] = round(time.time() - t, 1)
        print("\nSlurm timings:", json.dumps(TIMINGS, indent=1))
        left = subprocess.run(["pgrep", "-f", f"{state}/slurm.conf"], capture_output=True, text=True).stdout.split()
        assert not left, f"Slurm daemons left running: {left}"


@pytest.fixture(scope="module")
def first_job(cluster, tmp_path_factory):
    """An uninterrupted job: (output folder, log, scontrol's record, seconds)."""
    work = tmp_path_factory.mktemp("job1")
    out, log = work / "run", work / "job.out"
    t = time.time()
    job_id = cluster.submit(out, log)
    info = cluster.wait(job_id, log)
    TIMINGS["sbatch job, submit -> COMPLETED (s)"] = round(time.time() - t, 1)
    return out, log, info


def test_sbatch_trains_on_every_node_of_the_allocation(cluster, first_job):
    out, log, info = first_job
    text = log.read_text()
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", _tail(log)
    n = cluster.nodes
    assert "+ srun --kill-on-bad-exit=1" in text and f"--nnodes={n}" in text and "--rdzv_backend=c10d" in text
    ids = [line for line in text.splitlines() if line.startswith("[identity]")]
    assert sorted(line.split(" | ")[0] for line in ids) == ["[identity] RANK 0", "[identity] RANK 1"], ids
    if n == 2:  # one rank per node, each on its own host and address, the store on the first node
        assert "nodes node0 node1, rendezvous at node0:" in text
        assert sorted(l.split(" | ")[2] for l in ids) == [
            "node node0 10.77.0.1 (veth0)",
            "node node1 10.77.0.2 (veth0)",
        ]
        assert all("LOCAL_RANK 0 |" in l and "store node0:" in l for l in ids)
    else:  # both ranks on the one node: LOCAL_RANK 0 and 1
        assert sorted(l.split(" | ")[1] for l in ids) == ["LOCAL_RANK 0", "LOCAL_RANK 1"]
    ckpt = torch.load(out / "model.pt", map_location="cpu", weights_only=True)
    assert ckpt["state_dict"] and ckpt["label_names"]
    metrics = json.loads((out / "metrics.json").read_text())
    assert len(metrics["epochs"]) == 2 and metrics["ddp"]["world_size"] == 2
    assert "parameters identical on all" in text


def test_a_requeued_job_resumes_from_its_snapshot_and_ends_bit_identical(cluster, first_job, tmp_path):
    out, log = tmp_path / "run", tmp_path / "job.out"
    t = time.time()
    job_id = cluster.submit(out, log)
    deadline = time.time() + JOB_TIMEOUT
    while not list((out / "snapshots").glob("snap_*.pt")):  # let it train a few steps
        assert time.time() < deadline and cluster.job(job_id)["JobState"] in ("PENDING", "RUNNING", "CONFIGURING"), (
            _tail(log)
        )
        time.sleep(0.3)
    # What Slurm does to a job with --requeue when one of its nodes fails: stop it and queue it again (same id).
    cluster.sh("run", "scontrol", "requeue", job_id)
    # A requeued batch job only becomes eligible ~2 minutes later (Slurm leaves time for epilogs); start it now.
    # Wait for the requeue to land (seconds on a busy machine) before moving its start time, or the update is lost.
    deadline = time.time() + 120
    while cluster.job(job_id)["JobState"] != "PENDING":
        assert time.time() < deadline, f"job {job_id} not PENDING 120 s after its requeue; log:\n{_tail(log)}"
        time.sleep(0.2)
    # ...and for its nodes to let the old run go: started before they are idle again, the job is killed at once
    # ("Killing non-startable batch JobId=2: Job credential revoked" in slurmctld's log, 1 CI run in 5 here).
    while set(cluster.sh("run", "sinfo", "-h", "-N", "-o", "%T").split()) != {"idle"}:
        assert time.time() < deadline, f"job {job_id}'s nodes not idle 120 s after its requeue; log:\n{_tail(log)}"
        time.sleep(0.2)
    cluster.sh("run", "scontrol", "update", f"JobId={job_id}", "StartTime=now")
    info = cluster.wait(job_id, log)
    TIMINGS["requeued job, submit -> COMPLETED (s)"] = round(time.time() - t, 1)
    text = log.read_text()
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", _tail(log)
    assert "DUE TO JOB REQUEUE" in text and f"job {job_id} (restart 1)" in text
    assert "resumed from" in text and "resumed mid-epoch" in text, _tail(log)
    a = torch.load(first_job[0] / "model.pt", map_location="cpu", weights_only=True)["state_dict"]
    b = torch.load(out / "model.pt", map_location="cpu", weights_only=True)["state_dict"]
    assert all(torch.equal(a[k], b[k]) for k in a), "the requeued job must end bit-identical to the uninterrupted one"
