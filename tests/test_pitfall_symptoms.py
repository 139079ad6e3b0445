"""Chapter 04's checks (distrinews_course.pitfall_symptoms) on what a real run of the pitfall scripts measured
(tests/data/pitfall_runs.json: every JSON and output of a 2-rank gloo run, as the chapter launches them): each
pitfall's claims hold on the real figures, and each fails when one figure is made wrong."""

import copy
import json

import pytest

from distrinews_course import pitfall_failures as failures
from distrinews_course import pitfall_figures as figures
from distrinews_course import pitfall_symptoms as symptoms
from distrinews_course.demo import results
from distrinews_course.launch import LaunchResult

from .helpers import ROOT

RUN = json.loads((ROOT / "tests" / "data" / "pitfall_runs.json").read_text())
HANG, LIMIT = RUN["hang_timeout_s"], RUN["limit_s"]


def data(name):
    return copy.deepcopy(RUN["finishing"][name]["json"])


def output(name):
    return RUN["finishing"][name]["output"]


def failed(name, **change):
    f = {**RUN["failing"][name], **change}
    return LaunchResult([], f["returncode"], f["output"], f["seconds"], f["timed_out"], f["output"].splitlines())


def holds(symptom):
    return [c.holds for c in symptom.claims]


def test_every_pitfall_shows_its_symptom_on_the_recorded_run():
    found = symptoms.Found()
    found.add(symptoms.set_epoch(data("01_set_epoch.py")))
    found.add(symptoms.no_sampler(data("02_no_sampler.py")))
    found.add(symptoms.print_every_rank(output("03_print_every_rank.py"), RUN["nproc"]))
    found.add(symptoms.save_wrapper(data("04_save_wrapper.py")))
    found.add(symptoms.shared_file(data("05_shared_file.py")))
    found.add(symptoms.eval_padding(data("06_eval_padding.py")))
    found.add(failures.uneven_inputs(failed("07_uneven_inputs.py"), data("07_uneven_inputs.py"), HANG, LIMIT))
    found.add(symptoms.no_sync(data("08_no_sync.py")))
    found.add(
        failures.one_rank_collective(
            failed("09_one_rank_collective.py"), data("09_one_rank_collective.py"), HANG, LIMIT
        )
    )
    refusals = {"choose_backend('nccl')": "--backend nccl needs NVIDIA GPUs ... Use --backend gloo (or auto)"}
    found.add(failures.nccl_backend(failed("10_nccl_backend.py"), data("10_nccl_backend.py"), refusals, 0, LIMIT))
    found.add(
        failures.unused_parameters(
            failed("11_unused_parameters.py"), data("11_unused_parameters.py"), output("11_unused_parameters.py"), LIMIT
        )
    )
    found.add(symptoms.batchnorm(data("12_batchnorm.py")))
    found.add(symptoms.lr_scaling(data("13_lr_scaling.py")))
    assert len(found) == 13
    for s in found:
        assert s.holds, (s.pitfall, [c.text for c in s.claims if not c.holds])
    table = found.markdown().splitlines()
    assert len(table) == 15 and table[2].startswith("| 1. no set_epoch | 1 distinct order in 3 epochs |")


def test_set_epoch_fails_when_an_epoch_repeats_or_a_sample_is_lost():
    r = data("01_set_epoch.py")
    r["fixed"]["distinct_orders_per_rank"][1] = 2
    assert holds(symptoms.set_epoch(r)) == [True, False, True]
    r = data("01_set_epoch.py")
    r["broken"]["distinct_orders_per_rank"][0] = 3
    r["fixed"]["each_epoch_covers_all"] = False
    assert holds(symptoms.set_epoch(r)) == [False, True, False]


def test_no_sampler_fails_when_the_work_is_not_duplicated():
    r = data("02_no_sampler.py")
    r["broken"]["duplication"] = 1.0
    assert holds(symptoms.no_sampler(r)) == [False, True, True]
    r = data("02_no_sampler.py")
    r["fixed"]["duplication"] = 2.0
    assert holds(symptoms.no_sampler(r))[2] is False


def test_printing_fails_when_the_printed_loss_is_not_the_ranks_mean():
    out = output("03_print_every_rank.py")
    line = next(x for x in out.splitlines() if x.startswith("[fixed] epoch 0 loss"))
    wrong = out.replace(line, "[fixed] epoch 0 loss 1.0000")
    assert holds(symptoms.print_every_rank(wrong, RUN["nproc"])) == [True, False]
    one_rank = "\n".join(x for x in out.splitlines() if not x.startswith("[broken]") or "epoch 1" not in x)
    assert holds(symptoms.print_every_rank(one_rank, RUN["nproc"]))[0] is False


def test_printing_reads_glued_messages_apart_and_fails_when_a_broken_line_is_not_in_the_mean():
    out = output("03_print_every_rank.py")
    first, second = [x for x in out.splitlines() if x.startswith("[broken] epoch 0")]
    glued = out.replace(first + "\n", first, 1)  # two ranks' messages on one line, as print() can leave them
    s = symptoms.print_every_rank(glued, RUN["nproc"])
    assert holds(s) == [True, True] and "6 messages on 5 lines" in s.table
    assert first in s.table.splitlines() and second in s.table.splitlines()
    other = out.replace(first, "[broken] epoch 0 loss 99.0000")  # a fixed line that is not its epoch's mean
    assert holds(symptoms.print_every_rank(other, RUN["nproc"])) == [True, False]


def test_save_wrapper_fails_on_unprefixed_keys_or_a_loadable_file():
    r = data("04_save_wrapper.py")
    r["broken"]["module_prefixed"] = 0
    r["broken"]["loads_into_bare_model"] = True
    assert holds(symptoms.save_wrapper(r)) == [False, False, True, True]
    r = data("04_save_wrapper.py")
    r["fixed"]["weights_match"] = False
    assert holds(symptoms.save_wrapper(r))[3] is False
    for key in ("loads_after_stripping_prefix", "rescued_weights_match"):  # the rescue failed, or loaded other weights
        r = data("04_save_wrapper.py")
        r["broken"][key] = False
        assert holds(symptoms.save_wrapper(r)) == [True, True, False, True], key


def test_shared_file_fails_on_a_readable_summary_or_extra_rows():
    r = data("05_shared_file.py")
    r["broken"]["summary_readable"] = True
    r["fixed"]["csv_rows"] += 1
    assert holds(symptoms.shared_file(r)) == [True, False, False]


def test_eval_padding_fails_when_the_counts_or_accuracies_do_not_differ():
    r = data("06_eval_padding.py")
    r["broken"]["accuracy"] = r["truth_accuracy"]
    assert holds(symptoms.eval_padding(r)) == [False, True, True]
    r = data("06_eval_padding.py")
    r["library_evaluate_accuracy"] += 0.01
    assert holds(symptoms.eval_padding(r)) == [True, True, False]


def test_a_hang_must_end_by_its_own_timeout():
    r = data("07_uneven_inputs.py")
    assert all(holds(failures.uneven_inputs(failed("07_uneven_inputs.py"), r, HANG, LIMIT)))
    stopped = failed("07_uneven_inputs.py", timed_out=True)  # the launcher had to stop it: no check may pass
    assert not holds(failures.uneven_inputs(stopped, r, HANG, LIMIT))[0]
    quick = failures.uneven_inputs(failed("07_uneven_inputs.py"), r, 100, LIMIT)  # gave up before the timeout
    assert [c.holds for c in quick.claims if "gave up after" in c.text] == [False]
    no_timeout = failed(
        "07_uneven_inputs.py",
        output=RUN["failing"]["07_uneven_inputs.py"]["output"]
        .replace("Timed out", "Broken pipe")
        .replace("timed out", "broken"),
    )
    assert [
        c.holds for c in failures.uneven_inputs(no_timeout, r, HANG, LIMIT).claims if "each rank's error" in c.text
    ] == [False]
    assert "batches per rank [4, 3]" in failures.uneven_inputs(failed("07_uneven_inputs.py"), r, HANG, LIMIT).broken
    r["join"]["max_param_diff"] = 1e-3
    assert holds(failures.uneven_inputs(failed("07_uneven_inputs.py"), r, HANG, LIMIT))[-1] is False


def test_each_ranks_error_is_named_a_timeout_or_a_lost_peer_from_its_own_line():
    out = RUN["failing"]["09_one_rank_collective.py"]["output"]
    at = out.index("[rank 1] RuntimeError")
    gone = out[:at] + "[rank 1] RuntimeError: Connection closed by peer [127.0.0.1]:49549." + out[out.index("\n", at) :]
    assert failures.rank_outcomes(failed("09_one_rank_collective.py", output=gone)) == {
        0: "timed out",
        1: "lost its peer",
    }
    claim = failures._each_rank_saw(failed("09_one_rank_collective.py", output=gone), 2)
    assert claim.holds and "rank 0 timed out in its collective; rank 1 lost its peer when a timed-out rank exited" in (
        claim.text
    )
    both_gone = gone.replace("Timed out waiting 3000ms for recv", "Connection reset by peer in recv")
    assert not failures._each_rank_saw(failed("09_one_rank_collective.py", output=both_gone), 2).holds  # no timeout
    other = gone.replace("Connection closed by peer", "CUDA error: out of memory")
    assert failures.rank_outcomes(failed("09_one_rank_collective.py", output=other))[1].startswith("other: ")
    assert not failures._each_rank_saw(failed("09_one_rank_collective.py", output=other), 2).holds
    assert not failures._each_rank_saw(failed("09_one_rank_collective.py"), 3).holds  # rank 2 never reported


def test_a_hang_names_its_backends_default_timeout():
    res = failed("07_uneven_inputs.py")
    for backend, minutes in (("nccl", 10), ("gloo", 30)):
        text = " ".join(c.text for c in failures._hang_ended(res, HANG, LIMIT, 2, backend))
        assert f"nowhere near {backend}'s default {minutes} minutes" in text
    assert failures.default_timeout_min("nccl") == 10 and failures.default_timeout_min("gloo") == 30


def test_a_hang_row_says_the_timeout_and_the_time_from_the_start_apart():
    row = failures.hang_ended_row([5.8, 5.7], 3)
    assert row.startswith("error at the 3 s timeout") and "(the ranks waited 5.8 s)" in row
    r = data("07_uneven_inputs.py")
    assert f"the {HANG:g} s timeout" in failures.uneven_inputs(failed("07_uneven_inputs.py"), r, HANG, LIMIT).broken


def test_no_sync_fails_on_equal_counts_a_sync_before_the_last_or_a_faster_broken_run():
    r = data("08_no_sync.py")
    assert r["fixed"]["allreduce_per_micro_batch"][:-1] == [0] * (r["accum"] - 1)
    r["broken"]["allreduce_per_step"] = r["fixed"]["allreduce_per_step"]
    assert holds(symptoms.no_sync(r))[0] is False
    r = data("08_no_sync.py")
    r["fixed"]["allreduce_per_micro_batch"] = list(reversed(r["fixed"]["allreduce_per_micro_batch"]))
    assert holds(symptoms.no_sync(r))[1] is False
    r = data("08_no_sync.py")
    r["broken"]["ms_per_step"] = r["fixed"]["ms_per_step"] / 2
    r["max_param_diff_broken_vs_fixed"] = 1e-3
    assert holds(symptoms.no_sync(r))[2:] == [False, False]


def test_one_rank_collective_fails_when_the_fix_waits_or_averages_wrong():
    r = data("09_one_rank_collective.py")
    r["seconds"] = HANG
    r["global_val_loss"] = 1.0
    assert holds(failures.one_rank_collective(failed("09_one_rank_collective.py"), r, HANG, LIMIT))[-2:] == [
        False,
        False,
    ]


def test_nccl_fails_without_a_refusal_or_with_the_wrong_backend():
    r, res = data("10_nccl_backend.py"), failed("10_nccl_backend.py")
    assert not all(holds(failures.nccl_backend(res, r, {"choose_backend('nccl')": None}, 0, LIMIT)))
    assert not all(holds(failures.nccl_backend(res, r, {"choose_backend('nccl')": "refused"}, 0, LIMIT)))
    assert not all(holds(failures.nccl_backend(res, r, {"x": "use gloo"}, 2, LIMIT)))  # 2 GPUs: nccl was expected
    passed = failed("10_nccl_backend.py", returncode=0)
    assert holds(failures.nccl_backend(passed, r, {"x": "use gloo"}, 0, LIMIT))[0] is False
    # a rank that died of something else (its error line names no NCCL/CUDA/GPU) while the launcher's text mentions GPUs
    other = res.output.replace("Distributed package doesn't have NCCL built in", "name 'x' is not defined")
    other = failed("10_nccl_backend.py", output=other.replace("[rank 0] RuntimeError", "[rank 0] NameError") + "\nGPU")
    assert holds(failures.nccl_backend(other, r, {"x": "use gloo"}, 0, LIMIT))[1] is False


def test_unused_parameters_fail_without_the_error_or_the_warning():
    r, res, out = data("11_unused_parameters.py"), failed("11_unused_parameters.py"), output("11_unused_parameters.py")
    other = failed("11_unused_parameters.py", output=res.output.replace("Expected to have finished", "Something"))
    assert holds(failures.unused_parameters(other, r, out, LIMIT))[1] is False
    quiet = out.replace(failures.EXTRA_TRAVERSAL, "")
    assert holds(failures.unused_parameters(res, r, quiet, LIMIT))[4] is False
    assert "extra traversal of the autograd graph" in failures.pytorch_warning(out)
    r["static_graph"]["max_param_diff"] = 1e-6
    assert holds(failures.unused_parameters(res, r, out, LIMIT))[5] is False


def test_batchnorm_fails_when_broken_agrees_or_fixed_drifts():
    r = data("12_batchnorm.py")
    r["broken"]["mean_diff_to_global"] = 1e-5
    assert holds(symptoms.batchnorm(r)) == [False, True]
    r = data("12_batchnorm.py")
    r["fixed"]["var_diff_to_global"] = 1e-3
    assert holds(symptoms.batchnorm(r)) == [True, False]
    r = data("12_batchnorm.py")
    assert "became" not in symptoms.batchnorm(r).claims[1].text  # gloo: the script swaps the class itself
    r["backend"] = "nccl"  # torch's converter must have made every layer a SyncBatchNorm
    assert holds(symptoms.batchnorm(r))[1] is False and "became a SyncBatchNorm" in symptoms.batchnorm(r).claims[1].text


def test_lr_scaling_fails_when_the_gap_is_small_or_not_closed():
    r = data("13_lr_scaling.py")
    r["broken"]["curve"][-1][1] = r["one_process"][-1][1] + 0.01
    assert holds(symptoms.lr_scaling(r))[0] is False
    r = data("13_lr_scaling.py")
    r["fixed"]["curve"][-1][1] = r["broken"]["curve"][-1][1]
    assert holds(symptoms.lr_scaling(r))[1] is False
    # the gaps a sentence states are the table's own figures (losses to 3 decimals, accuracies to 1): a gap computed
    # from unrounded values (9.72 -> "9.7" beside 89.2 and 79.4), or a closed share rounded up to 100%, fails this
    s = symptoms.lr_scaling(data("13_lr_scaling.py"))
    rows = [line for line in s.table.splitlines() if "steps -> test loss" in line]
    (l1, a1), (lb, ab), (lf, _) = [
        (float(v.split("test loss ")[1].split(",")[0]), float(v.split("accuracy ")[1].rstrip("%"))) for v in rows
    ]
    assert f"ends {lb - l1:.3f} higher in test loss and {a1 - ab:.1f} points lower" in s.claims[0].text
    assert f"closes {100 * (1 - abs(lf - l1) / (lb - l1)):.1f}% of the loss gap" in s.claims[1].text
    # the samples each run saw are a fact of the script (one epoch of one dataset): printed, not claimed
    assert "one epoch of the same 4,096 samples" in symptoms.lr_scaling(data("13_lr_scaling.py")).table


@pytest.mark.parametrize(
    "draw, name",
    [
        (figures.epoch_orders, "01_set_epoch.py"),
        (figures.allreduces_per_micro, "08_no_sync.py"),
        (figures.running_means, "12_batchnorm.py"),
        (figures.lr_curves, "13_lr_scaling.py"),
    ],
)
def test_the_figures_draw_from_the_recorded_run(draw, name, tmp_path):
    fig = draw(data(name), save_to=tmp_path / "f.png")
    assert fig.axes and (tmp_path / "f.png").stat().st_size > 10_000


def test_who_waits_draws_each_ranks_measured_wait_and_its_own_ending(tmp_path):
    res = failed("09_one_rank_collective.py")
    fig = figures.who_waits(res, HANG, save_to=tmp_path / "f.png")
    waited = {int(x["rank"]): float(x["waited_s"]) for x in results(res.output) if "waited_s" in x}
    assert [b.get_width() for b in fig.axes[0].patches] == [waited[k] for k in sorted(waited)] and len(waited) == 2
    said = [t.get_text() for t in fig.axes[0].texts]
    assert f"  timed out after {waited[0]:.1f} s" in said and (tmp_path / "f.png").stat().st_size > 10_000
