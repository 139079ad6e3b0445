"""Chapter 12's claims (distrinews_course.hang_claims) hold on figures like the run's and fail on a wrong one."""

from __future__ import annotations

from distrinews_course import hang_claims as H


def entry(op: str, retired: bool) -> dict:
    return {"profiling_name": f"gloo:{op}", "retired": retired}


def test_slow_save_waits_names_the_barrier_and_fails_when_the_saver_waits_too():
    fr = {0: [entry("all_reduce", True)], 1: [entry("all_reduce", True), entry("barrier", False)]}
    assert H.slow_save_waits(fr).holds
    assert not H.slow_save_waits({**fr, 0: [entry("barrier", False)]}).holds  # the saver is in the barrier too
    assert not H.slow_save_waits({**fr, 1: [entry("all_reduce", False)]}).holds  # rank 1 waits elsewhere


def test_mismatch_claims_need_every_fixed_rank_alike_and_a_real_wait():
    right, wrong = {0: [6, 4, 4, 2], 1: [6, 4, 4, 2]}, {1: [6, 5, 5]}
    assert all(c.holds for c in H.mismatch_claims(wrong, right, 3.2, 3, False))
    unlike = {0: [6, 4, 4, 2], 1: [6, 4, 4, 3]}
    assert not H.mismatch_claims(wrong, unlike, 3.2, 3, False)[0].holds  # "every rank" is checked
    assert not H.mismatch_claims({1: [6, 4, 4, 2]}, right, 3.2, 3, False)[1].holds  # rank 1's counts were right
    assert not H.mismatch_claims({**wrong, 0: [1]}, right, 3.2, 3, False)[1].holds  # rank 0 logged some
    assert not H.mismatch_claims(wrong, right, 0.4, 3, False)[1].holds  # reported before the wait: an early failure
    assert not H.mismatch_claims(wrong, right, 3.2, 3, True)[1].holds  # the launch succeeded


def test_detail_claims_check_both_shapes_and_the_numbering():
    found = {0: ("all_reduce", 11, (4,)), 1: ("all_reduce", 11, (3,))}
    assert all(c.holds for c in H.detail_claims(found, "DETAIL error", 12))
    assert not H.detail_claims({**found, 1: ("all_reduce", 11, (4,))}, "", 12)[0].holds
    assert not H.detail_claims(found, "Timed out after 6 s", 12)[0].holds
    assert not H.detail_claims(found, "RESULT rank=1 step=3 counts=[1,2,3]", 12)[0].holds  # a rank logged step 3
    assert not H.detail_claims(found, "", 11)[1].holds  # numbered alike: not DETAIL from 0, recorder from 1
    assert not H.detail_claims({0: ("all_reduce", 8, (4,)), 1: ("all_reduce", 8, (3,))}, "", 9)[1].holds  # step 2


def test_cause_from_error_files_names_the_rank_whose_error_is_not_a_collectives():
    died = ("ValueError: not enough values to unpack", [("dies_mid_step.py", 30, "read_batch")])
    gone = ("RuntimeError: Connection closed by peer", [("dies_mid_step.py", 40, "train")])
    assert H.cause_from_error_files({0: gone, 1: died}, planted=1).holds
    assert "torchrun stopped it" in H.cause_from_error_files({1: died}, planted=1).text
    assert not H.cause_from_error_files({0: died, 1: gone}, planted=1).holds  # names rank 0
    assert not H.cause_from_error_files({0: died, 1: died}, planted=1).holds  # two causes
    elsewhere = ("ValueError: bad", [("dies_mid_step.py", 50, "train")])
    assert not H.cause_from_error_files({0: gone, 1: elsewhere}, planted=1).holds  # not where it was planted


def test_root_cause_from_stamps_is_the_earliest_whole_second():
    for named in ([0], [1]):  # a tie: whichever rank torchrun names, this run cannot tell, so it is not a pass
        tie = H.root_cause_from_stamps(named, {0: 100, 1: 100}, died=1)
        assert not tie.checked and "tie" in tie.text and tie.text.startswith("rank 1 died")
    assert H.root_cause_from_stamps([1], {0: 101, 1: 100}, died=1).holds
    assert H.root_cause_from_stamps([1], {0: 101, 1: 100}, died=1).checked
    assert not H.root_cause_from_stamps([0], {0: 101, 1: 100}, died=1).holds  # a later stamp named
    assert not H.root_cause_from_stamps([], {0: 100}, died=0).holds
    assert not H.root_cause_from_stamps([0], {1: 100}, died=1).checked  # rank 0 wrote no file: its stamp is torchrun's


def test_straggler_named_fails_on_an_even_pair_a_small_lateness_or_a_fix_that_hides_little():
    assert all(c.holds for c in H.straggler_named(0.95, 110, 5, 120))
    assert not H.straggler_named(0.5, 110, 5, 120)[0].holds  # arrives last only half the time
    assert not H.straggler_named(0.95, 30, 5, 120)[0].holds  # a quarter of the planted delay
    assert not H.straggler_named(0.95, 110, 40, 120)[1].holds  # the fix hid under three quarters


def test_fixes_clean_needs_every_run_clean_and_a_wait_past_the_timeout():
    assert all(c.holds for c in H.fixes_clean(True, ["a", "b", "c"], True, {0: 7.5, 1: 7.5}, 6))
    assert not H.fixes_clean(False, ["a", "b", "c"], True, {0: 7.5, 1: 7.5}, 6)[0].holds
    assert not H.fixes_clean(True, ["a", "b"], True, {0: 7.5, 1: 7.5}, 6)[0].holds
    assert not H.fixes_clean(True, ["a", "b", "c"], True, {0: 7.5, 1: 5.0}, 6)[1].holds  # did not outlast it
    assert not H.fixes_clean(True, ["a", "b", "c"], True, {1: 7.5}, 6)[1].holds  # rank 0 did not report
