"""Chapter 01's machinery: the claims about train_single.py's run (read from a real metrics.json the chapter
recorded, tests/data/baseline_metrics.json) hold on it, and a wrong figure makes each fail; the save-and-resume
exercise passes the reference answer and names each mistake (one mutant per mistake); the figures draw. Fast: no
launch."""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path

import matplotlib
import pytest
import torch

from distrinews_course import baseline_figures as F
from distrinews_course import baseline_run as R
from distrinews_course.attempt import try_exercise
from distrinews_course.claims import written_by_launch
from distrinews_course.save_resume_exercise import resume_test

matplotlib.use("Agg")
ROOT = Path(__file__).resolve().parent.parent
METRICS = json.loads((ROOT / "tests/data/baseline_metrics.json").read_text())


@pytest.fixture
def m():
    return copy.deepcopy(METRICS)


def _failing(claims) -> list[str]:
    return [c.text for c in claims if not c.holds]


def test_the_recorded_run_supports_every_claim(m):
    assert _failing(R.run_claims(m)) == []
    assert _failing(R.run_claims(m, epochs_asked=2)) == []
    assert "85.80%" in R.run_table(m) and "class-balanced sample of the test split's 7,600" in R.run_table(m)
    assert "50.0 tokens on average (spread 9.9, cut at 64); 0.77% of the tokens in the batches of 32" in R.run_table(m)


def test_the_epochs_are_counted_against_the_preset_not_the_record(m):
    """A run that trained 1 epoch and recorded epochs=1 in its own config still fails: the preset asks for 2."""
    m["epochs"].pop()
    m["config"]["epochs"] = 1
    failing = _failing(R.run_claims(m, preset="cpu_smoke"))
    assert failing and "all 2 epochs the cpu_smoke preset asks for" in failing[0], failing
    assert not any("epochs" in f for f in _failing(R.run_claims(m, epochs_asked=1)))  # EPOCHS=1 asked for it


def test_the_held_out_count_is_held_against_the_preset_not_the_record(m):
    """A run that ignored the preset's eval_samples (2,000) and evaluated on 1,000 texts, recording 1,000 in its own
    config, still fails: the record agrees with itself, the preset file does not."""
    m["config"]["eval_samples"] = m["data"]["test_size"] = 1000
    for e in m["epochs"]:
        e["val_examples"] = 1000
    failing = _failing(R.run_claims(m))
    assert failing == [
        "every epoch was evaluated on the 1,000 held-out texts the cpu_smoke preset asks for (of the "
        "test split's 7,600)"
    ], failing


@pytest.mark.parametrize(
    "wrong, fails",
    [
        (lambda m: m["epochs"].pop(), "holds all 2 epochs"),
        (lambda m: m["data"].update(is_synthetic=True), "real AG News"),
        (lambda m: m["epochs"][0].update(val_examples=1999), "held-out texts the cpu_smoke preset asks for"),
        (lambda m: m["aggregates"].update(final_val_accuracy=0.79), "at least 80%"),
        (lambda m: m["epochs"][1].update(train_loss=0.95), "loss went down"),
    ],
)
def test_a_wrong_figure_fails_its_claim(m, wrong, fails):
    wrong(m)
    failing = _failing(R.run_claims(m))
    assert failing and fails in failing[0], failing


def test_a_pretrained_model_is_held_to_ninety_percent(m):
    m["model"]["pretrained"] = True
    assert _failing(R.run_claims(m)) == ["accuracy 85.8% on those texts, at least 90% (chance is 25%)"]


def test_the_throughput_note_says_what_the_epochs_did(m):
    note = R.throughput_note(m)
    assert "901 -> 963 samples/s" in note and "the first epoch was the slowest" in note
    m["epochs"][0]["samples_per_s"] = 960.0  # within 5% of the later epochs: not "slower"
    assert "within 5% of the later ones" in R.throughput_note(m)
    m["model"]["pretrained"] = True
    assert "random weights" not in R.throughput_note(m)


LABELS = ["World", "Sports", "Business", "Sci/Tech"]
HEADLINES = {"a": "World", "b": "Sports", "c": "Business", "d": "Sci/Tech"}


def test_the_headline_claim_holds_and_fails():
    probs = torch.eye(4) * 0.9 + 0.025
    table, right = R.headline_table(HEADLINES, probs, LABELS)
    assert right == 4 and table.count("expected") == 4
    assert _failing(R.checkpoint_claims(probs, right)) == []
    wrong = probs[[1, 0, 3, 2]]  # every headline in another class
    _, right = R.headline_table(HEADLINES, wrong, LABELS)
    assert right == 0 and "at least 3 of these 4" in _failing(R.checkpoint_claims(wrong, right))[0]


def test_a_stale_or_foreign_checkpoint_is_not_this_launchs(tmp_path):
    """The file's date against the notebook's launch, and its recorded settings against the notebook's."""
    ckpt = tmp_path / "m.pt"
    ckpt.write_bytes(b"x")
    written = ckpt.stat().st_mtime
    meta, want = {"preset": "cpu_smoke", "world_size": 1}, {"preset": "cpu_smoke", "world_size": 1}
    claim = written_by_launch(ckpt, meta, written - 10, 20, want)
    assert claim.holds and "10 s in" in claim.text, claim.text
    stale = written_by_launch(ckpt, meta, written + 600, 20, want)  # the file predates this launch
    assert not stale.holds and "-600 s in" in stale.text
    late = written_by_launch(ckpt, meta, written - 100, 20, want)  # dated after the launch had ended
    assert not late.holds
    foreign = written_by_launch(ckpt, {**meta, "world_size": 2}, written - 10, 20, want)
    assert not foreign.holds and "it records {'world_size': 2}" in foreign.text


def test_the_reload_and_confusion_claims(m):
    acc = m["aggregates"]["final_val_accuracy"]
    assert _failing(R.reload_claims(m["data"]["fingerprint"], acc, m)) == []
    with pytest.raises(ValueError, match="are not the run's"):
        R.reload_claims("0" * 16, acc, m)  # other texts: the comparison means nothing
    assert "reproduces the run's accuracy" in _failing(R.reload_claims(m["data"]["fingerprint"], acc - 0.006, m))[0]
    labels = [0] * 10 + [1] * 10 + [2] * 10 + [3] * 10
    pred = labels[:]
    pred[0] = 1  # one World text called Sports
    counts = R.confusion(pred, labels, 4)
    assert counts[0][:2] == [9, 1] and sum(map(sum, counts)) == 40
    assert _failing(R.confusion_claims(counts)) == []
    pred = labels[:10] + [0] * 10 + labels[20:]  # Sports never recognised
    assert "more than half of its texts" in _failing(R.confusion_claims(R.confusion(pred, labels, 4)))[0]


def test_the_figures_draw():
    fig = F.script_map()
    assert "train_single.py" in fig.axes[0].get_title()
    assert not any("DDP(model)" in t.get_text() for t in fig.axes[0].texts)
    fig = F.script_map(ddp=True)
    assert any("DDP(model)" in t.get_text() for t in fig.axes[0].texts) and fig.axes[0].get_legend() is not None
    fig = F.confusion_figure([[9, 1], [0, 10]], ["a", "b"])
    assert fig.axes[0].get_xlabel() == "predicted class"


# Exercise 1: save and resume by hand
def _answers():
    spec = importlib.util.spec_from_file_location("answers01", ROOT / "notebooks/answers/01_single_gpu_baseline.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_reference_answer_resumes_bit_for_bit(tmp_path):
    ref = _answers()
    resume_test(ref.save_state, tmp_path)(ref.load_state)  # raises on a mistake


def _save_all(path, model, optimizer, epoch):
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}, path)


def _save_model_only(path, model, optimizer, epoch):
    torch.save({"model": model.state_dict(), "epoch": epoch}, path)


def _save_half_precision(path, model, optimizer, epoch):
    state = optimizer.state_dict()
    for moments in state["state"].values():
        for k in ("exp_avg", "exp_avg_sq"):
            moments[k] = moments[k].half()  # "to save space"
    torch.save({"model": model.state_dict(), "optimizer": state, "epoch": epoch}, path)


def _save_nothing(path, model, optimizer, epoch):
    return {"model": model.state_dict()}


def _load(path, model, optimizer, *, weights=True, opt=True, into_new=False, ahead=1, constant=None):
    state = torch.load(path, weights_only=True)
    if weights:
        model.load_state_dict(state["model"])
    if opt:
        target = torch.optim.AdamW(model.parameters(), lr=0.05) if into_new else optimizer
        target.load_state_dict(state["optimizer"])
    return state["epoch"] + ahead if constant is None else constant  # constant: right only for one save epoch


MUTANTS = {
    "optimizer_not_saved": (_save_model_only, dict(opt=False), "the optimizer came back empty"),
    "optimizer_loaded_into_a_new_one": (_save_all, dict(into_new=True), "the optimizer came back empty"),
    "weights_not_loaded": (_save_all, dict(weights=False), "the model's weights are not the saved ones"),
    "returns_the_finished_epoch": (_save_all, dict(ahead=0), "load_state returned 1: epoch 1 was finished"),
    "returns_two_ahead": (_save_all, dict(ahead=2), "load_state returned 3"),
    "returns_a_constant": (_save_all, dict(constant=2), "load_state returned 2: epoch 2 was finished"),
    "moments_saved_in_half_precision": (_save_half_precision, {}, "away from the uninterrupted one"),
    "nothing_written": (_save_nothing, {}, "save_state wrote nothing"),
}


@pytest.mark.parametrize("name", list(MUTANTS))
def test_each_resume_mistake_is_named(tmp_path, capsys, name):
    save, changes, reason = MUTANTS[name]

    def load_state(path, model, optimizer):
        return _load(path, model, optimizer, **changes)

    with pytest.raises(AssertionError, match=reason):
        resume_test(save, tmp_path)(load_state)
    assert not try_exercise(resume_test(save, tmp_path), load_state)
    out = capsys.readouterr().out
    assert out.startswith("not yet: ") and reason in out and out.count("\n") == 1, out


def test_the_stubs_are_not_written_yet(tmp_path, capsys):
    cell = tmp_path / "cell.py"
    cell.write_text(
        'def save_state(path, model, optimizer, epoch):\n    """doc"""\n    ...  # your code here\n\n\n'
        'def load_state(path, model, optimizer):\n    """doc"""\n    ...  # your code here\n'
    )
    spec = importlib.util.spec_from_file_location("cell01", cell)
    stub = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stub)
    assert not try_exercise(resume_test(stub.save_state, tmp_path), stub.load_state)
    assert "not written yet" in capsys.readouterr().out
    assert not try_exercise(resume_test(_save_all, tmp_path), stub.load_state)  # half written: still not yet


@pytest.mark.parametrize(
    "predicted, right",
    [
        (100 * (64 - 50) / 64, True),  # the table's estimate: each random batch padded to the cut
        (20, True),
        (0.77, False),  # the grouped batches' figure from the table, not the random ones'
        (50, False),  # half the tokens
        (3, False),  # a ratio-sized guess
        (None, False),
    ],
)
def test_the_padding_guess_is_judged_against_the_measured_share(predicted, right):
    """A random-batch padding share of about 22% is what cpu_smoke's 960 texts (mean 50 tokens, cut at 64) give."""
    assert R.padding_guess_ok(predicted, 0.22) is right


# exercises 2 and 3's claims (distrinews_course.baseline_exercises): a wrong figure fails them
def test_padding_claim_holds_only_for_more_than_twice_the_grouped_padding():
    from distrinews_course.baseline_exercises import padding_claims

    def runs(random_pad, grouped_pad):
        return {"not grouped": {"aggregates": {"padding_fraction": random_pad}},
                "grouped": {"aggregates": {"padding_fraction": grouped_pad}}}  # fmt: skip

    assert [c.holds for c in padding_claims(runs(0.22, 0.008))] == [True]
    assert "27.5x" in padding_claims(runs(0.22, 0.008))[0].text
    assert [c.holds for c in padding_claims(runs(0.22, 0.11))] == [False]  # exactly twice is not more
    assert [c.holds for c in padding_claims(runs(0.008, 0.22))] == [False]  # the two runs swapped


def test_continue_claims_fail_on_a_fresh_start_a_retrained_epoch_or_a_lost_epoch():
    from distrinews_course.baseline_exercises import continue_claims

    resumed = "resumed from outputs/x/snapshots/snap_e002_b000000.pt\nepoch 2/2 | loss 0.5\nsaved m.pt"
    both = {"epochs": [{}, {}]}
    assert [c.holds for c in continue_claims(resumed, both)] == [True, True, True]
    fresh = "epoch 1/2 | loss 0.9\nepoch 2/2 | loss 0.5"  # --resume ignored: both epochs again
    assert [c.holds for c in continue_claims(fresh, both)] == [False, False, True]
    mid = resumed.replace("snap_e002_b000000", "snap_e001_b000020")  # resumed from a mid-epoch snapshot
    assert [c.holds for c in continue_claims(mid, both)] == [False, True, True]
    assert [c.holds for c in continue_claims(resumed, {"epochs": [{}]})] == [True, True, False]  # epoch 1 lost


def test_step_curve_places_each_step_in_its_epoch_and_skips_a_resumed_epochs_earlier_steps():
    from distrinews_course.plots import plot_metrics, step_curve

    m = {"epochs": [{"epoch": 1, "optimizer_steps": 4, "step_losses": [4.0, 3.0, 2.0, 1.0]},
                    {"epoch": 2, "optimizer_steps": 4, "step_losses": [0.5, 0.25]}]}  # fmt: skip
    xs, ys = step_curve(m, window=1)
    assert xs == [0.25, 0.5, 0.75, 1.0, 1.75, 2.0] and ys == [4.0, 3.0, 2.0, 1.0, 0.5, 0.25]
    assert step_curve(m, window=2)[1] == [4.0, 3.5, 2.5, 1.5, 0.75, 0.375]
    assert step_curve({"epochs": [{"epoch": 1, "optimizer_steps": 4}]}) == ([], [])  # an older record: per epoch
    epochs = [{**e, "train_loss": 1.0, "val_loss": 1.0, "val_accuracy": 0.5} for e in m["epochs"]]
    rec = {"data": {"title": "t", "source": "s"}, "epochs": epochs}
    assert len(plot_metrics({"run": rec}).axes[0].lines[0].get_xdata()) == 6
