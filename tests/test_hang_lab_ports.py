"""The debug server's page binds its port seconds after the lab chose it: when something took the port meanwhile, the
scenario runs again on another one instead of failing the chapter (CI saw `Address already in use` under load)."""

from __future__ import annotations

import socket

import pytest

from distrinews_course import hang_lab, leftovers
from distrinews_course.hang_lab import HangLab, Scenario, debug_port, left_behind


def test_the_debug_port_is_free_and_below_the_ephemeral_range():
    port = debug_port()
    assert 20000 <= port <= 32000
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # nothing holds it


@pytest.mark.slow
def test_a_taken_debug_port_runs_the_scenario_again_on_another(tmp_path, monkeypatch):
    leftovers.mark_this_process_as_launcher()
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    asked = []

    def port():
        asked.append(taken.getsockname()[1] if not asked else debug_port())
        return asked[-1]

    monkeypatch.setattr(hang_lab, "debug_port", port)
    try:
        lab = HangLab(nproc=2, hang_s=3, out=tmp_path, timeout_s=120)
        lab.add(Scenario("quick", "scripts/hangs/straggler.py", ["--mode", "fixed", "--steps", 12, "--read_ms", 0],
                         debug_server=True, doctor=False, probe=("collectives", 4)))  # fmt: skip
        run = lab.get("quick")
    finally:
        taken.close()
    assert len(asked) == 2 and asked[0] != asked[1], asked
    assert run.result.ok and run.fr and not run.probe_error, run.output[-2000:]
    assert left_behind() == []
