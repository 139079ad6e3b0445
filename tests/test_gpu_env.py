"""The first cell's checks (distrinews_course.gpu_env) with CUDA mocked, the leftover-rank finder
(distrinews_course.leftovers) against real processes, and the install rule that keeps Kaggle's CUDA torch."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from distrinews_course import gpu_env, leftovers

ROOT = Path(__file__).resolve().parent.parent
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def fake_cuda(monkeypatch, names, capability=(7, 5), peer=True):
    """torch.cuda as on a machine with these GPUs (no CUDA call reaches a driver)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(names))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: names[i])
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: capability)
    monkeypatch.setattr(torch.cuda, "can_device_access_peer", lambda i, j: peer(i, j) if callable(peer) else peer)

    class Props:
        total_memory = 15 * 2**30

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: Props())


def test_kaggle_t4x2_without_p2p_sets_nccl_p2p_disable(monkeypatch):
    fake_cuda(monkeypatch, ["Tesla T4", "Tesla T4"], (7, 5), peer=False)
    report = gpu_env.inspect(check_copy=True)
    assert report.n_gpus == 2 and report.p2p == {"0-1": False} and report.p2p_copy == {}  # nothing to copy-check
    environ = {}
    actions = gpu_env.apply(report, environ)
    assert environ["NCCL_P2P_DISABLE"] == "1"
    assert "cannot access each other peer-to-peer" in actions[0]  # says why
    text = "\n".join(report.lines())
    assert "Tesla T4 (compute 7.5" in text and "fp16 + GradScaler" in text and "0<->1 NO" in text
    assert "--amp bf16 is refused" in text


def test_p2p_present_and_working_changes_nothing(monkeypatch):
    fake_cuda(monkeypatch, ["NVIDIA H100 80GB HBM3"] * 2, (9, 0), peer=True)
    monkeypatch.setattr(gpu_env, "p2p_copy_check", lambda i, j: "ok")
    report = gpu_env.inspect()
    environ = {}
    assert gpu_env.apply(report, environ) == [] and environ == {}
    assert "native bf16" in "\n".join(report.lines())


@pytest.mark.parametrize("state", ["hung", "failed"])
def test_advertised_but_broken_p2p_is_disabled_too(monkeypatch, state):
    fake_cuda(monkeypatch, ["Tesla T4"] * 2, peer=True)
    monkeypatch.setattr(gpu_env, "p2p_copy_check", lambda i, j: state)
    report = gpu_env.inspect()
    environ = {}
    gpu_env.apply(report, environ)
    assert environ["NCCL_P2P_DISABLE"] == "1" and state in report.actions[0]


def test_a_users_own_setting_is_kept_and_reported(monkeypatch):
    fake_cuda(monkeypatch, ["Tesla T4"] * 2, peer=False)
    report = gpu_env.inspect()
    environ = {"NCCL_P2P_DISABLE": "0"}
    assert gpu_env.apply(report, environ) == []
    assert environ == {"NCCL_P2P_DISABLE": "0"} and any("kept" in n for n in report.notes)


def test_small_shm_with_p2p_off_turns_nccl_shm_off(monkeypatch):
    fake_cuda(monkeypatch, ["Tesla T4"] * 2, peer=False)
    monkeypatch.setattr(gpu_env, "shm_space", lambda path=gpu_env.SHM: (32 << 20, 64 << 20))
    report = gpu_env.inspect()
    environ = {}
    gpu_env.apply(report, environ)
    assert environ == {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"}
    assert any("num_workers=0" in n for n in report.notes)
    assert "/dev/shm     :" in "\n".join(report.lines())


def test_one_gpu_and_no_gpu(monkeypatch):
    fake_cuda(monkeypatch, ["Tesla T4"], peer=lambda i, j: pytest.fail("no pair to check"))
    report = gpu_env.inspect()
    assert report.n_gpus == 1 and report.p2p == {} and gpu_env.apply(report, {}) == []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    report = gpu_env.inspect()
    assert report.gpus == [] and "none visible" in "\n".join(report.lines())
    assert report.versions["torch"] == torch.__version__ and report.versions["transformers"]


def test_p2p_copy_check_runs_apart_and_reports_a_hang():
    def hangs(*a, **k):
        raise subprocess.TimeoutExpired("python", 1)

    assert gpu_env.p2p_copy_check(0, 1, runner=hangs) == "hung"
    assert gpu_env.p2p_copy_check(0, 1, runner=lambda *a, **k: subprocess.CompletedProcess(a, 1)) == "failed"
    assert gpu_env.p2p_copy_check(0, 1, runner=lambda *a, **k: subprocess.CompletedProcess(a, 0)) == "ok"


def test_course_setup_prints_the_report(monkeypatch, capsys):
    from distrinews_course import notebook as course

    monkeypatch.setenv(leftovers.MARKER, "")  # restored after the test (setup marks this process)
    cwd = os.getcwd()
    try:
        course.setup("cpu_smoke", 2)
    finally:
        os.chdir(cwd)
    out = capsys.readouterr().out
    assert "versions     : torch" in out and "leftovers    :" in out
    assert out.count(torch.__version__) == 1 and out.count("GPUs ") <= 1, "each fact printed once"
    if sys.platform.startswith("linux"):
        assert os.environ[leftovers.MARKER].startswith(f"{os.getpid()}:")


def test_a_chapter_that_compares_1_process_with_2_runs_on_2_cpu_processes_when_given_1(monkeypatch, capsys):
    # One GPU (Colab's T4) gives NPROC auto = 1: chapter 05 failed there (a DDP-only flag sent to train_single.py)
    from distrinews_course import notebook as course

    monkeypatch.setenv(leftovers.MARKER, "")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # restored after the test; setup hides the GPUs from launches
    cwd = os.getcwd()
    try:
        as_given = course.setup("cpu_smoke", 2, quiet=True, min_nproc=2)
        assert "this chapter compares" not in capsys.readouterr().out
        env = course.setup("single_gpu", 1, quiet=True, min_nproc=2)
    finally:
        os.chdir(cwd)
    assert as_given.nproc == 2 and as_given.preset == "cpu_smoke"
    assert (env.nproc, env.preset, env.n_gpus, env.backend) == (2, "cpu_smoke", 0, "gloo")
    assert os.environ["CUDA_VISIBLE_DEVICES"] == ""
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("this chapter compares 1 process with 2, and this machine gives NPROC=1: it runs on 2 CPU")


# --------------------------------------------------------------------------- leftover ranks

SLEEPER = "import time; time.sleep(120)"


def _spawn(marker_value):
    env = {**os.environ, leftovers.MARKER: marker_value}
    return subprocess.Popen([sys.executable, "-c", SLEEPER], env=env, start_new_session=True)


def _dead_launcher_marker() -> str:
    """The marker of a launcher that has exited (a real process, so its PID is real and then gone)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    pid = proc.pid
    start = leftovers.start_time(pid)
    proc.wait()
    return f"{pid}:{start}:deadbeef0000"


@linux_only
def test_survivors_of_a_dead_launcher_are_stopped_and_live_launches_are_not():
    orphan = _spawn(_dead_launcher_marker())
    ours = _spawn(leftovers.marker())  # this test process is its launcher, and alive
    try:
        deadline = time.time() + 10
        while time.time() < deadline and leftovers.start_time(orphan.pid) is None:
            time.sleep(0.05)
        found = {p.pid for p in leftovers.find_leftovers()}
        assert orphan.pid in found and ours.pid not in found
        lines = []
        stopped = leftovers.stop_leftovers(log=lines.append)
        assert orphan.pid in {p.pid for p in stopped}
        assert orphan.wait(timeout=10) == -signal.SIGTERM
        assert ours.poll() is None  # a running launch is left alone
        assert "left over from an interrupted launch" in lines[0]
    finally:
        for p in (orphan, ours):
            if p.poll() is None:
                p.kill()
                p.wait()


@linux_only
def test_before_launch_marks_the_env_of_the_launch():
    env = leftovers.before_launch({"A": "1"}, log=None)
    pid, start, _ = env[leftovers.MARKER].split(":")
    assert env["A"] == "1" and int(pid) == os.getpid() and start == leftovers.start_time(os.getpid())


@linux_only
def test_a_recycled_pid_is_never_signalled(monkeypatch):
    orphan = _spawn(_dead_launcher_marker())
    try:
        time.sleep(0.3)
        found = [p for p in leftovers.find_leftovers() if p.pid == orphan.pid]
        assert found
        monkeypatch.setattr(leftovers, "find_leftovers", lambda: [leftovers.Leftover(orphan.pid, "1", 1, "x")])
        leftovers.stop_leftovers(grace_s=0.2, log=None)  # the start time does not match: not that process
        assert orphan.poll() is None
    finally:
        orphan.kill()
        orphan.wait()


# --------------------------------------------------------------------------- installing on Kaggle / Colab


def _requirements(path: Path) -> dict:
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        m = re.match(r"^([A-Za-z0-9_.\-]+)(\[[^\]]*\])?\s*(.*)$", line)
        if line and not line.startswith("-") and m:
            out[m.group(1).lower()] = m.group(3).replace(" ", "")
    return out


def test_requirements_keep_a_preinstalled_cuda_torch_and_transformers_5():
    """pip's default strategy (only-if-needed) keeps an installed package that satisfies its specifier. So a
    Kaggle/Colab image's CUDA torch (e.g. 2.6.0+cu124) and transformers 5.x survive `pip install -r
    requirements.txt` as long as nothing asks for an upper bound, a pin, or another torch index."""
    from packaging.specifiers import SpecifierSet

    text = (ROOT / "requirements.txt").read_text()
    assert "--index-url" not in text and "--extra-index-url" not in text and "download.pytorch.org" not in text
    reqs = _requirements(ROOT / "requirements.txt")
    try:
        import tomllib
    except ImportError:  # Python < 3.11
        tomllib = pytest.importorskip("tomli")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pyproject = {
        re.split(r"[\[<>=!~ ]", d, 1)[0].lower(): re.sub(r"^[A-Za-z0-9_.\-]+(\[[^\]]*\])?", "", d).replace(" ", "")
        for d in project
    }
    for name, installed in (
        ("torch", "2.6.0+cu124"),
        ("torch", "2.13.0+cu130"),
        ("transformers", "5.0.0"),
        ("transformers", "5.23.0"),
    ):
        for source, spec in (("requirements.txt", reqs.get(name)), ("pyproject.toml", pyproject.get(name))):
            assert spec is not None, f"{name} missing from {source}"
            assert "<" not in spec and "==" not in spec, f"{source} bounds {name} from above: {spec}"
            assert SpecifierSet(spec).contains(installed, prereleases=True), (
                f"{source}: {name}{spec} rejects {installed}"
            )
