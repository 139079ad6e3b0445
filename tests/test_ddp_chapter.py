"""Chapter 02's machinery, on the metrics of real runs the chapter made (tests/data/baseline_metrics.json: 01's one
process; ddp_metrics.json: train_ddp.py on 2 gloo ranks; ddp_control_*.json: the same-order control): every claim
holds on them, and a wrong figure makes it fail. Fast: no launch."""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass
from pathlib import Path

import matplotlib
import pytest

from distrinews_course import ddp_comparison as C
from distrinews_course import same_order_control as S
from distrinews_course.notebook import script_diff

matplotlib.use("Agg")
ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
LOAD = lambda name: json.loads((DATA / name).read_text())
OUTPUT = (
    "+ python -m torch.distributed.run --standalone --max-restarts=0 --nproc_per_node=2 scripts/train_ddp.py ...\n"
    "parameters identical on all 2 ranks: True (max difference 0)\n"
)


@dataclass
class Env:
    nproc: int = 2
    n_gpus: int = 0
    preset: str = "cpu_smoke"
    backend: str = "gloo"

    @property
    def smoke(self):
        return self.preset == "cpu_smoke"


class Load:
    def __init__(self, cores):
        self.cores = cores

    quiet = property(lambda self: self.cores is not None and self.cores < 0.3)


@pytest.fixture
def base():
    return LOAD("baseline_metrics.json")


@pytest.fixture
def d():
    return LOAD("ddp_metrics.json")


def _failing(claims):
    return [c.text for c in claims if c.checked and not c.holds]


def test_the_recorded_runs_keep_every_promise(base, d):
    assert _failing(C.promise_claims(d, base, OUTPUT, 2, "gloo")) == []


@pytest.mark.parametrize(
    "wrong, fails",
    [
        (lambda d, b: d["aggregates"].update(params_max_difference=1e-7), "weights identical"),
        (lambda d, b: d["epochs"][1].update(train_samples=16000), "examples per epoch together"),
        (lambda d, b: d["ddp"].update(backend="nccl"), "the 2 with gloo the launch asked for"),
        (lambda d, b: d["ddp"].update(world_size=1), "a world of 1 processes"),
        (lambda d, b: b["data"].update(fingerprint="0" * 16), "the same texts"),
    ],
)
def test_a_broken_promise_fails(base, d, wrong, fails):
    wrong(d, base)
    failing = _failing(C.promise_claims(d, base, OUTPUT, 2, "gloo"))
    assert len(failing) == 1 and fails in failing[0], failing


def test_the_printed_report_must_say_identical(base, d):
    failing = _failing(C.promise_claims(d, base, OUTPUT.replace("True", "False"), 2, "gloo"))
    assert failing and "weights identical" in failing[0]


def test_the_saved_model_claims(d):
    """The world size the checkpoint records is held against the NPROC the notebook launched, not against the
    metrics.json the same tracker wrote."""
    payload = {"state_dict": {"distilbert.x": 0}, "metadata": {"world_size": 2}}
    assert _failing(C.saved_model_claims(payload, 2)) == []
    assert "'module.'" in _failing(C.saved_model_claims({**payload, "state_dict": {"module.x": 0}}, 2))[0]
    assert "the 4 this notebook launched" in _failing(C.saved_model_claims(payload, 4))[0]
    stale = {**payload, "metadata": {"world_size": 4}}  # a checkpoint from another launch
    assert "says 4 processes trained it: the 2" in _failing(C.saved_model_claims(stale, 2))[0]


def test_one_speed_metric_steady_samples_per_s(base, d):
    rows = C.comparison_rows(base, d)
    assert C.speedup(rows) == pytest.approx(897.998 / 962.663)
    table = C.comparison_table(rows)
    assert "samples/s" in table and "train s" not in table and "s/step" not in table and "0.93x" in table


def test_the_comparison_claims_hold_and_fail(base, d):
    rows = C.comparison_rows(base, d)
    claims = C.comparison_claims(rows, d, 0.03)
    assert _failing(claims) == [] and all(c.checked for c in claims)
    assert "within 1 points" in _failing(C.comparison_claims(rows, d, 0.01))[0]
    other = copy.deepcopy(rows)
    other[1]["steps"] = 125
    assert "same 125 optimizer" in _failing(C.comparison_claims(other, d, 0.03))[0]
    weak = copy.deepcopy(rows)
    weak[1]["acc"] = 0.5
    assert "the DDP model learned" in _failing(C.comparison_claims(weak, d, 0.5))[0]
    assert not any("samples/s" in c.text or "far from" in c.text for c in claims)  # speed is stated, not claimed


def test_the_speed_note_uses_the_runs_numbers(base, d):
    rows = C.comparison_rows(base, d)
    note = C.speed_note(rows, d, Env(), Load(0.1))
    assert "**slower than** one process (0.93x the samples/s)" in note and "16 examples" in note and "8.0 MiB" in note
    assert "(0.1 of a core)" in note and "is not timed apart here" in note
    assert "2 processes sharing one machine" in note and "already includes its optimizer steps" not in note
    assert "a whole optimizer step, with its fixed costs, per 16 examples where one process took one per 32" in note
    # epoch by epoch: 854.228 / 900.928 and 897.998 / 962.663; both runs' first epoch was the slower one
    assert "the ratio was 0.95x, 0.93x; epoch 1, left out in case of a warm-up, ran slower (901 against 963" in note
    assert "slower (854 against 898 samples/s later) for DDP x2" in note and "warming up" not in note
    warm = copy.deepcopy(rows)
    warm[1]["per_epoch"] = [910.0, 891.0]  # DDP's first epoch the faster one, as on a CI run
    assert "not slower (910 against 891 samples/s later) for DDP x2" in C.speed_note(warm, d, Env(), Load(0.1))
    assert "Epoch by epoch" not in C.speed_note(
        [{**r, "per_epoch": r["per_epoch"][-1:]} for r in rows], d, Env(), Load(0.1)
    )
    # 8,000 examples in 250 steps: a DDP step is 8000 / 897.998 / 250 s; its 16 examples at 962.663/s, the rest other
    step, compute = 1000 * 8000 / 897.998 / 250, 1000 * 4000 / 962.663 / 250
    assert f"step took {step:.1f} ms, of which 16 examples at one process's rate take {compute:.1f} ms" in note, note
    assert f"the other {step - compute:.1f} ms ({100 * (1 - compute / step):.0f}%) is not timed apart" in note
    perfect = copy.deepcopy(rows)
    perfect[1]["sps"] = 2 * rows[0]["sps"]  # twice one process's rate: nothing but the examples' own time
    assert C.step_split(perfect, d)["other_ms"] == pytest.approx(0, abs=1e-9)
    faster = copy.deepcopy(rows)
    faster[1]["sps"] = 2.2 * rows[0]["sps"]
    assert "added nothing visible" in C.speed_note(faster, d, Env(), Load(0.1))
    assert "salt" in C.speed_note(rows, d, Env(), Load(0.9)) and "(0.9 of a core)" in C.speed_note(
        rows, d, Env(), Load(0.9)
    )
    assert "one process" in C.speed_note(rows, d, Env(nproc=1), Load(0.1))


def test_the_baseline_is_reused_only_when_it_ran_like_this_chapter(tmp_path, base, monkeypatch):
    monkeypatch.delenv("DISTRINEWS_DATA_DIR", raising=False)  # the baseline read the embedded sample: so does this
    (tmp_path / "metrics.json").write_text(json.dumps(base))
    assert C.baseline_fits(tmp_path, Env()) is not None
    assert C.baseline_fits(tmp_path, Env(), epochs=3) is None
    assert C.baseline_fits(tmp_path, Env(n_gpus=2, preset="cpu_smoke")) is None  # threads differ
    assert C.baseline_fits(tmp_path / "nowhere", Env()) is None
    (tmp_path / "metrics.json").write_text("{not json")
    assert C.baseline_fits(tmp_path, Env()) is None
    assert "1 process" in C.baseline_table(base) and "250" in C.baseline_table(base)


def test_a_baseline_on_other_data_is_trained_again(tmp_path, base, monkeypatch):
    folder, other = tmp_path / "ag_news", tmp_path / "other"
    folder.mkdir(), other.mkdir()
    (tmp_path / "metrics.json").write_text(json.dumps(base))  # 01 ran on the embedded sample
    monkeypatch.setenv("DISTRINEWS_DATA_DIR", str(folder))  # then the learner set a folder
    assert C.baseline_fits(tmp_path, Env()) is None
    on_folder = {**base, "data": {**base["data"], "source": "folder", "detail": f"{folder}/train.csv + test.csv"}}
    (tmp_path / "metrics.json").write_text(json.dumps(on_folder))
    assert C.baseline_fits(tmp_path, Env()) is not None
    monkeypatch.setenv("DISTRINEWS_DATA_DIR", str(other))
    assert C.baseline_fits(tmp_path, Env()) is None  # another folder
    monkeypatch.delenv("DISTRINEWS_DATA_DIR")
    assert C.baseline_fits(tmp_path, Env()) is None  # the folder unset: this chapter reads the sample


def test_other_programs_measures_a_block():
    with C.OtherPrograms() as load:
        sum(range(100_000))
    assert load.cores is None or load.cores >= 0.0


def test_the_diff_is_cut_in_three_at_the_wrap():
    diff = script_diff(ROOT / "scripts/train_single.py", ROOT / "scripts/train_ddp.py")
    first, wrap, end = C.diff_sections(diff.text)
    assert "init_process_group" in first and "DDP(model" in wrap and "max_param_difference" in end
    assert "DDP(model" not in first + end
    assert all(len(part.splitlines()) <= 40 for part in (first, wrap, end)), "each part a screen: not folded"
    assert "DistributedDataParallel: one process" not in first and "@@ -5,5 +5,12 @@" in first  # docstring left out
    assert diff.added <= 40, "the DDP diff stays small"


def test_the_speed_figure_draws(base, d):
    fig = C.speed_figure(C.comparison_rows(base, d))
    assert fig.axes[0].get_ylabel() == "training samples/s" and len(fig.axes[0].patches) == 4


# the same-order control
def test_steps_without_grouping_have_exactly_one_process_examples():
    lengths = [(7 * i) % 50 for i in range(64)]
    steps = S.StepComposition.count(lengths, global_batch=8, world=2, seed=0)
    assert steps.rows[False][1] == steps.rows[False][0] == 8
    assert steps.other_steps > 0 and steps.rows[True][2] < 1.0
    assert [c.holds for c in steps.claims(grouped_run=True)] == [True, True]
    assert "this run's setting" in steps.claims(grouped_run=True)[0].text
    assert "length-grouped" in steps.table()


def test_the_step_claims_fail_on_a_wrong_count():
    steps = S.StepComposition(2, 8, {True: (8, 8, 1.0), False: (8, 7, 0.9)})
    assert [c.holds for c in steps.claims(grouped_run=True)] == [False, False]


def test_a_ddp_step_is_one_process_step_dealt_out():
    """The count itself: without grouping, rank 0's batch t and rank 1's are one process's batch t, split."""
    one = S.steps_of([0] * 20, 1, 4, False, seed=3)
    two = S.steps_of([0] * 20, 2, 2, False, seed=3)
    assert one == two and len(one) == 5 and set().union(*one) == set(range(20))


def _control(gap=6.5e-5, moved=0.093, loss=None):
    single, ddp = LOAD("ddp_control_single.json"), LOAD("ddp_control_ddp.json")
    if loss is not None:
        ddp["epochs"][-1]["train_loss"] = loss
    return S.Control(single, ddp, gap, moved)


def test_the_control_table_says_when_the_model_is_still_near_an_even_guess():
    c = _control()
    near = c.single["epochs"][-1]["train_loss"] > S.NEAR_EVEN_GUESS * math.log(4)
    assert ("still near ln 4" in c.table()) == near
    for m in (c.single, c.ddp):
        m["epochs"][-1]["train_loss"] = 0.4  # a control that learned: no such line
    assert "still near ln 4" not in c.table()
    c.ddp["epochs"][-1]["train_loss"] = 1.38  # one run near an even guess: said
    assert "training loss 1.3800 is still near ln 4" in c.table()


def _recorded(path, value):
    """_control() with one field of the DDP run's record set to `value` (path: keys down to it)."""
    c = _control()
    *keys, last = path
    node = c.ddp
    for k in keys:
        node = node[k]
    node[last] = value
    return c


def test_the_control_claims_hold_and_fail():
    assert _failing(_control().claims()) == []
    assert "under 1% of how far" in _failing(_control(gap=2e-3).claims())[0]
    assert "same training loss" in _failing(_control(loss=1.38).claims())[0]
    assert "moved the weights" in _failing(_control(moved=0.001, gap=0.0).claims())[0]
    for path, value in [
        (("config", "group_by_length"), True),  # one run grouped its examples by length
        (("config", "seed"), 7),  # another shuffle
        (("data", "fingerprint"), "0123456789abcdef"),  # other texts
        (("ddp", "global_batch_size"), 64),  # another global batch
        (("epochs", -1, "optimizer_steps"), 25),
    ]:
        failing = _failing(_recorded(path, value).claims())
        assert failing and "both control runs recorded the same texts" in failing[0], path
    assert "6.5e-05" in _control().table()


def test_the_difference_note_says_what_separates_the_runs():
    steps = S.StepComposition(2, 32, {True: (250, 4, 0.675), False: (250, 250, 1.0)})
    note = S.difference_note(0.877, 0.858, _control(), steps, 2)
    assert "246 of 250 steps" in note and "1.9 points apart" in note and "6e-05 apart" in note
    assert "first two reasons away together, so it cannot say" in note  # what the control shows, no more
    assert "chapter 00's section 4 checks that DDP's .grad is the mean" in note  # where the mean is checked
    assert "would train" in S.difference_note(0.858, 0.858, _control(), steps, 1)


def test_the_no_dropout_copy_loads_without_dropout(tmp_path):
    from transformers import AutoConfig

    folder = S.no_dropout_copy(tmp_path / "tiny", seed=0)
    config = AutoConfig.from_pretrained(folder)
    assert config.dropout == config.attention_dropout == config.seq_classif_dropout == 0.0
    assert (folder / "model.safetensors").is_file() and any(folder.glob("*token*"))


def _plain_python_run(backend):
    out = f"preset cpu_smoke | world size 1 | {backend}: ... | device cpu | fp32\n"
    return out, {"ddp": {"world_size": 1, "backend": backend}, "epochs": [{}]}


def test_no_torchrun_expects_gloo_without_a_gpu(monkeypatch):
    monkeypatch.setattr("distrinews_lib.process_group.setup.gpu_count", lambda: 0)
    assert _failing(C.no_torchrun_claims(*_plain_python_run("gloo"))) == []
    assert "with gloo" in _failing(C.no_torchrun_claims(*_plain_python_run("nccl")))[0]


def test_no_torchrun_expects_nccl_on_two_gpus(monkeypatch):
    """Kaggle's T4 x2: one process without LOCAL_WORLD_SIZE has a GPU of its own, so --backend auto gives nccl,
    and a checker that still expects gloo there fails the right answer."""
    monkeypatch.setattr("distrinews_lib.process_group.setup.gpu_count", lambda: 2)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert _failing(C.no_torchrun_claims(*_plain_python_run("nccl"))) == []
    assert "with nccl" in _failing(C.no_torchrun_claims(*_plain_python_run("gloo")))[0]


def test_no_torchrun_fails_a_world_of_two_or_no_epoch(monkeypatch):
    monkeypatch.setattr("distrinews_lib.process_group.setup.gpu_count", lambda: 0)
    out, m = _plain_python_run("gloo")
    m["ddp"]["world_size"] = 2
    assert "a world of one" in _failing(C.no_torchrun_claims(out.replace("size 1", "size 2"), m))[0]
    out, m = _plain_python_run("gloo")
    m["epochs"] = []
    assert "trained an epoch" in _failing(C.no_torchrun_claims(out, m))[0]
