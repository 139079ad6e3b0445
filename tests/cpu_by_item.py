"""Where the suite's time goes, in CPU-seconds: a pytest plugin, off unless asked for.

    .venv/bin/python -m pytest -n 2 -p tests.cpu_by_item --cpu-out=outputs/suite_cpu

--durations gives each test's wall time; on two shared cores that says little about what a test costs the other
worker. This plugin adds, for every test, the CPU-seconds of the worker's whole process tree while it ran: the
worker, a notebook's kernel, every torchrun launcher and rank it started (a child's time counts once it has been
waited for, or while it is still alive). Each worker appends a line per test to DIR/items_<worker>.tsv (start, wall
s, CPU s, nodeid); at the end the run prints the CPU-seconds of the shared part and of the quiet files
(tests/quiet_last.py), how busy the machine's cores were during each (from /proc/stat), and the files that cost the
most. A process that leaves its parent (a daemon, a Slurm job) is not counted.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

SAMPLE_S = 2.0  # how often the controller reads /proc/stat


def pytest_addoption(parser):
    parser.addoption("--cpu-out", default="outputs/suite_cpu", help="tests/cpu_by_item.py: where its files go")


def tree_cpu_seconds() -> float:
    """CPU-seconds (user + system) of this process and all its descendants, the reaped ones included."""
    import psutil

    me = psutil.Process()
    total = 0.0
    for p in [me, *me.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except psutil.Error:  # it ended meanwhile: its parent has its time now, or will once it waits for it
            pass
    return total


def _worker(config) -> str:
    return getattr(config, "workerinput", {}).get("workerid", "main")


def _out(config) -> Path:
    return Path(config.getoption("--cpu-out"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    c0, t0 = tree_cpu_seconds(), time.time()
    yield
    wall, cpu = time.time() - t0, tree_cpu_seconds() - c0
    path = _out(item.config) / f"items_{_worker(item.config)}.tsv"
    with open(path, "a") as f:
        f.write(f"{t0:.2f}\t{wall:.2f}\t{cpu:.2f}\t{item.nodeid}\n")


class _Sampler(threading.Thread):
    def __init__(self):
        super().__init__(daemon=True)
        self.samples: list[tuple[float, float]] = []  # (time, the machine's busy CPU-seconds since boot)
        self.halt = threading.Event()
        # Imported (it imports torch: seconds) and sampled here, before the first test: a suite shorter than that
        # import would otherwise have no sample before its first test, and no busy share.
        from distrinews_course.bench.timing import cpu_busy_seconds

        self.read = cpu_busy_seconds
        self.sample()

    def sample(self):
        busy = self.read()  # None without /proc/stat
        if busy is not None:
            self.samples.append((time.time(), busy))

    def run(self):
        while not self.halt.wait(SAMPLE_S):
            self.sample()

    def busy(self, start: float, end: float) -> float | None:
        """The share of the cores' time that was busy from the last sample before start to the first after end
        (None: no two samples around it)."""
        before = [s for s in self.samples if s[0] <= start] or self.samples[:1]
        after = [s for s in self.samples if s[0] >= end] or self.samples[-1:]
        if not before or not after or after[0][0] <= before[-1][0]:
            return None
        return (after[0][1] - before[-1][1]) / ((after[0][0] - before[-1][0]) * (os.cpu_count() or 1))

    def stop(self):
        self.halt.set()
        self.join()
        self.sample()


def _moved_root(config) -> str | None:
    """pytest takes an argument that names an existing path for a test path while it picks its root, before this
    plugin's option is known: `--cpu-out DIR` with DIR outside the directory pytest runs in moves the root above it,
    and pyproject.toml's settings (nbval, the markers, testpaths) with it. `--cpu-out=DIR` is one argument, not a
    path."""
    value = config.getoption("--cpu-out")
    args, here = list(config.invocation_params.args), config.invocation_params.dir
    if value not in args or config.getoption("rootdir", None) or not Path(value).is_dir():
        return None
    if Path(value).resolve().is_relative_to(here):
        return None
    return (
        f"--cpu-out {value}: pytest read that existing folder as a test path and made {config.rootpath} the root, "
        f"without this checkout's pyproject.toml (no notebooks, no markers); write --cpu-out={value}, with '='"
    )


def pytest_configure(config):
    if _worker(config) != "main":
        return
    moved = _moved_root(config)
    if moved:
        raise pytest.UsageError(moved)
    out = _out(config)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("items_*.tsv"):  # this run's lines only
        old.unlink()
    config._cpu_sampler = _Sampler()
    config._cpu_sampler.start()


def read_items(out: Path) -> list[tuple[float, float, float, str]]:
    rows = []
    for path in sorted(out.glob("items_*.tsv")):
        for line in path.read_text().splitlines():
            start, wall, cpu, nodeid = line.split("\t", 3)
            rows.append((float(start), float(wall), float(cpu), nodeid))
    return sorted(rows)


def summary(rows, quiet_files, busy=lambda start, end: None, top: int = 12) -> list[str]:
    """The report's lines: the shared part and the quiet files, then the files that cost the most CPU-seconds."""
    if not rows:
        return ["cpu_by_item: no test ran"]
    lines = []
    quiet = [r for r in rows if r[3].split("::", 1)[0] in quiet_files]
    shared = [r for r in rows if r[3].split("::", 1)[0] not in quiet_files]
    for label, part in (("shared part", shared), ("quiet files", quiet)):
        if not part:
            continue
        start, end = part[0][0], max(r[0] + r[1] for r in part)
        share = busy(start, end)
        lines.append(
            f"{label}: {sum(r[2] for r in part):,.0f} CPU-s in {end - start:,.0f} s"
            + ("" if share is None else f", the cores {100 * share:.0f}% busy")
        )
    files: dict[str, list[float]] = {}
    for _, wall, cpu, nodeid in rows:
        f = files.setdefault(nodeid.split("::", 1)[0], [0.0, 0.0])
        f[0], f[1] = f[0] + cpu, f[1] + wall
    lines.append(f"{'CPU-s':>8} {'wall-s':>8}  file (the {min(top, len(files))} that cost the most)")
    for name, (cpu, wall) in sorted(files.items(), key=lambda kv: -kv[1][0])[:top]:
        lines.append(f"{cpu:>8.1f} {wall:>8.1f}  {name}")
    return lines


def pytest_terminal_summary(terminalreporter, config):
    sampler = getattr(config, "_cpu_sampler", None)
    if sampler is None:
        return
    sampler.stop()
    from tests.quiet_last import QUIET

    out = _out(config)
    terminalreporter.section(f"CPU-seconds by test ({out}/items_*.tsv)")
    for line in summary(read_items(out), QUIET, sampler.busy):
        terminalreporter.write_line(line)
