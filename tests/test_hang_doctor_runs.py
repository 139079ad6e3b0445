"""The hang doctor on real hanging runs (2 gloo processes each, torchrun): it names the planted rank in every scenario
of chapter 12, also when rank 0 is the culprit or dead (raising, or killed like the OOM killer does: then rank 0's
store is gone too), and prints nothing on healthy runs; no run waits past its timeout and no process is left."""

from __future__ import annotations

import pytest

from distrinews_course import leftovers
from distrinews_course.hang_lab import HangLab, Scenario, left_behind

pytestmark = pytest.mark.slow

HANG_S = 3.0
H = "scripts/hangs"


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    leftovers.mark_this_process_as_launcher()  # what this module launches can be found afterwards
    lab = HangLab(nproc=2, hang_s=HANG_S, out=tmp_path_factory.mktemp("hangs"), timeout_s=120)
    group = ["--ddp_timeout", f"{lab.group_timeout_s:g}"]
    save = ["--save_s", f"{lab.group_timeout_s + 1.5:g}", "--path", str(lab.out / "saved" / "slow_save.pt")]
    for s in [
        Scenario("skip", "scripts/pitfalls/07_uneven_inputs.py", ["--mode", "broken", *group], planted=1),
        Scenario("skip_09", "scripts/pitfalls/09_one_rank_collective.py", ["--mode", "broken", *group], planted=1),
        Scenario("rank0_slow", f"{H}/slow_save.py", ["--mode", "broken", *group, *save], planted=0),
        Scenario("mismatch", f"{H}/class_counts.py", ["--mode", "broken", *group], planted=1),
        Scenario("dies", f"{H}/dies_mid_step.py", ["--mode", "broken", *group], planted=1),
        Scenario("rank0_dies", f"{H}/dies_mid_step.py", ["--mode", "broken", "--dead_rank", 0, *group], planted=0),
        Scenario("rank0_killed", f"{H}/dies_mid_step.py", ["--mode", "broken", "--dead_rank", 0, "--killed", *group],
                 planted=0),
        Scenario("rank1_killed", f"{H}/dies_mid_step.py", ["--mode", "broken", "--killed", *group], planted=1),
        Scenario("straggler", f"{H}/straggler.py", ["--mode", "broken", "--steps", 60, *group], planted=1),  # ~6 s
        Scenario("healthy_save_fixed", f"{H}/slow_save.py", ["--mode", "fixed", *group, *save]),
        Scenario("healthy_counts_fixed", f"{H}/class_counts.py", ["--mode", "fixed", *group]),
    ]:  # fmt: skip
        lab.add(s)
    return lab


BROKEN = ["skip", "skip_09", "rank0_slow", "mismatch", "dies", "rank0_dies", "rank0_killed", "rank1_killed"]


@pytest.mark.parametrize("name", BROKEN)
def test_the_doctor_names_the_planted_rank_in_one_paragraph(lab, name):
    run = lab.get(name)
    assert not run.result.ok and not run.result.timed_out, run.output[-3000:]  # it failed by itself, in time
    assert run.doctor is not None, run.output[-3000:]
    assert run.doctor["culprits"] == [lab.scenarios[name].planted], run.doctor["text"]
    assert len(run.doctor_lines) == 1, run.doctor_lines  # one rank reports, once
    assert f"rank {lab.scenarios[name].planted}" in run.doctor_lines[0]


def test_what_it_says_of_each_kind(lab):
    assert (
        lab.get("rank0_slow").doctor["kind"] == "behind" and "save_checkpoint" in lab.get("rank0_slow").doctor_lines[0]
    )
    assert lab.get("skip").doctor["kind"] == "skipped" and lab.get("skip").doctor["op"] == "all_reduce"
    assert lab.get("mismatch").doctor["kind"] == "mismatch" and lab.get("mismatch").doctor["sizes"] == [[3]]
    assert "read_batch" in lab.get("dies").doctor_lines[0]  # the dying rank names the line that raised
    assert "no answer from its process" in lab.get("rank0_killed").doctor_lines[0]


def test_the_straggler_is_named_with_the_time_it_adds(lab):
    run = lab.get("straggler")
    assert run.result.ok and run.doctor is None
    assert run.straggler is not None and run.straggler["culprits"] == [1], run.output[-2000:]
    assert 40 <= run.straggler["details"]["added_ms_per_step"] <= 160  # its reads take 80 ms longer


# The straggler script's fix is judged alone, in tests/test_hang_doctor_quiet.py: beside other runs a rank starved of
# the shared cores is a true straggler.
@pytest.mark.parametrize("name", ["healthy_save_fixed", "healthy_counts_fixed"])
def test_a_healthy_run_hears_nothing_from_the_doctor(lab, name):
    run = lab.get(name)
    assert run.result.ok, run.output[-3000:]
    assert not run.doctor_lines and run.doctor is None and run.straggler is None


def test_no_run_waits_past_its_timeout_and_none_leaves_a_process(lab):
    for name in lab.scenarios:
        assert not lab.get(name).result.timed_out, name
    assert left_behind() == []
