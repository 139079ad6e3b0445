"""Chapter 00's machinery: the claims about its runs hold on the JSON the concept scripts wrote in a real launch
(tests/data/concepts/, recorded by the chapter on 2 gloo ranks), and a wrong figure makes each fail; the sampler and
DataParallel claims run on the real torch classes in this process; the figures draw. Fast: no launch."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import matplotlib
import pytest
import torch
from torch.utils.data import DistributedSampler, RandomSampler

from distrinews_course import concept_figures as F
from distrinews_course import concept_runs as R
from distrinews_course import sampler_shards as S

matplotlib.use("Agg")
DATA = Path(__file__).resolve().parent / "data" / "concepts"


def _load(name):
    return json.loads((DATA / f"{name}.json").read_text())


@pytest.fixture
def hello():
    return _load("01_hello_allreduce")


@pytest.fixture
def bwd():
    return _load("02_ddp_backward")


@pytest.fixture
def strag():
    return _load("03_straggler")


@pytest.fixture
def ck():
    return _load("04_checkpoint")


CK_OUTPUT = "[rank 0] saved outputs/concepts/04_checkpoint.pt\n"


def _failing(claims):
    return [c.text for c in claims if not c.holds]


# Section 1
def test_the_hello_launch_supports_every_claim(hello):
    assert _failing(R.hello_claims(hello)) == []
    assert "all-reduce SUM" in R.hello_table(hello) and len(R.hello_table(hello).splitlines()) == 3
    assert "world_size" in R.hello_table(hello)  # who each process is: printed as a fact, not claimed
    assert not any("WORLD_SIZE" in c.text or "ranks [" in c.text for c in R.hello_claims(hello))


@pytest.mark.parametrize(
    "wrong, fails",
    [
        (lambda h: h["ranks"][1].update(sum=2.0), "the same total, 3"),
        (lambda h: h["ranks"][1].update(local_grad=h["ranks"][0]["local_grad"]), "local gradient differs"),
        (lambda h: h["ranks"][0]["averaged_grad"].__setitem__(0, 9.0), "gradient of the whole batch"),
    ],
)
def test_a_wrong_hello_figure_fails(hello, wrong, fails):
    wrong(hello)
    failing = _failing(R.hello_claims(hello))
    assert failing and fails in failing[0], failing


# Section 2
def _samplers(n, shuffle=True):
    return [DistributedSampler(range(n), num_replicas=2, rank=r, shuffle=shuffle, seed=0) for r in range(2)]


def _runs():
    return {
        "no shuffle": S.epochs_of(_samplers(10, shuffle=False), epochs=1),
        "shuffled": S.epochs_of(_samplers(10), epochs=2),
        "padded": S.epochs_of(_samplers(11, shuffle=False), epochs=1),
    }


def test_distributed_sampler_supports_section_2():
    runs = _runs()
    assert _failing(S.sampler_claims(runs)) == []
    assert runs["padded"][0] == [[0, 2, 4, 6, 8, 10], [1, 3, 5, 7, 9, 0]]
    assert "shuffled, epoch 1" in S.shards_table(runs)


def test_a_sampler_that_does_not_shard_fails():
    runs = _runs()
    runs["shuffled"][1][1] = list(runs["shuffled"][1][0])  # both ranks on the same samples
    assert "disjoint, together all 10" in _failing(S.sampler_claims(runs))[0]
    runs = _runs()
    runs["shuffled"][1] = runs["shuffled"][0]  # epoch 1 replays epoch 0
    assert "another split and order" in _failing(S.sampler_claims(runs))[0]
    runs = _runs()
    runs["shuffled"][1] = [list(reversed(r)) for r in runs["shuffled"][0]]  # another order, the same split
    assert "another split and order" in _failing(S.sampler_claims(runs))[0]
    runs = _runs()
    runs["padded"][0][1][-1] = 10  # padded with the last sample, not the first
    assert "repeats 1 from the start" in _failing(S.sampler_claims(runs))[0]
    runs = _runs()
    runs["no shuffle"][0] = [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]  # blocks, not every 2nd index
    assert "takes indices r, r + 2" in _failing(S.sampler_claims(runs))[0]


def test_forgetting_set_epoch_replays_epoch_0():
    """Exercise 2's claims on torch's real sampler; a sampler that reshuffles by itself (RandomSampler) fails the
    'replays' claim, so the check is not a comparison of one value with itself."""
    forgot = S.epochs_of(_samplers(10), epochs=2, set_epoch=False)
    assert _failing(S.forgotten_set_epoch_claims(_runs()["shuffled"], forgot)) == []
    g = torch.Generator().manual_seed(0)
    reshuffles = S.epochs_of([RandomSampler(range(10), generator=g)], epochs=2, set_epoch=False)
    reshuffles = [[order[0::2], order[1::2]] for (order,) in reshuffles]
    failing = _failing(S.forgotten_set_epoch_claims(_runs()["shuffled"], reshuffles))
    assert failing and "replays epoch 0's split and order" in failing[0]


# Section 3
def test_dataparallel_on_this_machine_supports_section_3():
    net = torch.nn.Linear(8, 2)
    dp = torch.nn.DataParallel(net)
    x = torch.randn(16, 8)
    with R.watch_replicas(net) as calls:
        y = dp(x)
    assert len(calls) == 1 and calls[0].rows == 16
    claims = R.dataparallel_claims(calls, y, 16, 0)
    assert _failing(claims) == []
    assert [c.text for c in claims if not c.checked] == [
        "DP called the model once, on all 16 rows, in this cell's own thread"
    ]
    assert "this cell" in R.replica_table(calls, 16)
    two = R.dataparallel_claims(calls, y, 16, 2)  # a 2-GPU claim on a 1-call record
    assert "one forward per GPU (2)" in _failing(two)[0]


# Section 4
def test_the_backward_launch_supports_every_bucket_claim(bwd):
    assert _failing(R.bucket_claims(bwd)) == []
    assert _failing(R.overlap_claims(bwd)) == []
    assert R.predicted_buckets(bwd, 0.25) == 6 and R.predicted_buckets(bwd, 1) == 2
    assert "launched at" in R.bucket_table(bwd)


@pytest.mark.parametrize(
    "wrong, fails",
    [
        (
            lambda b: b["ranks"][0]["steps"][1].update(buckets=b["ranks"][0]["steps"][1]["buckets"][:1]),
            "not one per tensor",
        ),
        (lambda b: b["ranks"][0].update(bucket_cap_mb=1.0), "the rule above predicts"),
        (lambda b: b["ranks"][0]["steps"][1]["buckets"][0].update(not_ready=0), "not computed yet"),
        (lambda b: b["ranks"][1].update(ddp_vs_mean_of_local=1e-3), "mean over the ranks"),
        (lambda b: b["ranks"][1].update(ddp_vs_local=0.0), "the sync did something"),
        (lambda b: b["ranks"][1].update(same_as_rank0=False), "bit-identical"),
    ],
)
def test_a_wrong_bucket_figure_fails(bwd, wrong, fails):
    wrong(bwd)
    failing = _failing(R.bucket_claims(bwd))
    assert failing and fails in failing[0], failing


def test_a_timeline_without_overlap_fails(bwd):
    """All-reduce after backward: every bucket launched after the last gradient, on one rank, must fail."""
    late = copy.deepcopy(bwd)
    step = late["ranks"][1]["steps"][1]
    last = step["grad_ready"][-1][0]
    for b in step["buckets"]:
        b["launched"], b["done"] = last + 1e-4, max(b["done"], last + 2e-4)
    assert "overlap: the first all-reduce began" in _failing(R.overlap_claims(late))[0]
    claim = R.overlap_claims(bwd)[0]
    assert claim.holds and len(claim.text) < 90, claim.text


def test_the_exposed_tail_is_said_in_the_runs_numbers(bwd):
    o = R.overlaps(bwd)[0]
    text = R.exposed_tail_text(bwd, "gloo")
    assert f"{o.in_flight} of the {o.buckets} all-reduces" in text and f"{o.exposed_ms:.1f} ms later" in text
    beside = 1000 * (o.last_grad_s - o.first_launch_s)
    hid = "most" if beside > o.exposed_ms else "the smaller part"
    share = f"hid {100 * beside / (beside + o.exposed_ms):.0f}% of rank 0's communication"
    assert text.startswith("**On this run") and share in text, text  # the outcome first
    assert f"beside backward's computation for {beside:.1f} ms" in text, text
    assert "launch order" not in text  # gloo's two threads: methodology, in the chapter's fold
    assert ("NOTE:" in text) == (hid == "the smaller part")
    hidden = copy.deepcopy(bwd)  # backward returns right after its last gradient: the overlap hid most of it
    hidden["ranks"][0]["steps"][1]["backward_s"] = hidden["ranks"][0]["steps"][1]["grad_ready"][-1][0] + 1e-4
    assert "NOTE" not in (t := R.exposed_tail_text(hidden, "gloo")) and "hid 99% of" in t, t
    exposed = copy.deepcopy(bwd)  # a long tail after the last gradient: the smaller part, with the NOTE
    exposed["ranks"][0]["steps"][1]["backward_s"] = exposed["ranks"][0]["steps"][1]["grad_ready"][-1][0] + 1.0
    assert "NOTE: a" in (t := R.exposed_tail_text(exposed, "gloo")) and "over TCP" in t
    step = bwd["ranks"][0]["steps"][1]
    last = step["grad_ready"][-1][0]
    assert o.in_flight == sum(b["launched"] <= last < b["done"] for b in step["buckets"])
    assert o.not_launched == sum(b["launched"] > last for b in step["buckets"])
    assert (f"{o.not_launched} not launched yet" in text) == (o.not_launched > 0)
    unlaunched = copy.deepcopy(bwd)  # every bucket launched after the last gradient: none was in flight at it
    for b in unlaunched["ranks"][0]["steps"][1]["buckets"]:
        b["launched"], b["done"] = last + 1e-4, max(b["done"], last + 2e-4)
    text = R.exposed_tail_text(unlaunched, "gloo")
    assert "0 of the 6 all-reduces were still in flight and 6 not launched yet" in text, text
    ordered = copy.deepcopy(bwd)
    buckets = ordered["ranks"][0]["steps"][1]["buckets"]
    for i, b in enumerate(buckets):
        b["done"] = ordered["ranks"][0]["steps"][1]["grad_ready"][-1][0] - 1e-4 * (len(buckets) - i)
    buckets[-1]["done"] = ordered["ranks"][0]["steps"][1]["backward_s"]
    buckets[-1]["launched"] = ordered["ranks"][0]["steps"][1]["grad_ready"][-1][0] - 1e-5  # in flight at the last
    text = R.exposed_tail_text(ordered, "gloo")
    assert "1 of the 6 all-reduces were still in flight," in text


def test_bigger_buckets(bwd):
    big = copy.deepcopy(bwd)
    for r in big["ranks"]:
        r["bucket_cap_mb"] = 1.0
        buckets = r["steps"][1]["buckets"]
        r["steps"][1]["buckets"] = [dict(buckets[0], not_ready=buckets[3]["not_ready"]), buckets[4]]
    assert _failing(R.bigger_bucket_claims(bwd, big)) == []
    big["ranks"][1]["steps"][1]["buckets"].append(dict(big["ranks"][1]["steps"][1]["buckets"][-1]))
    assert "2 bucket all-reduces per backward on every rank" in _failing(R.bigger_bucket_claims(bwd, big))[0]


# Section 5
def test_the_straggler_launch_supports_every_claim(strag):
    assert _failing(R.straggler_claims(strag)) == []
    assert "(slow)" in R.straggler_table(strag)


@pytest.mark.parametrize(
    "rank, key, value, fails",
    [
        (0, "compute_s", 0.3, "own work took under"),
        (0, "backward_s", 0.1, "waited at the all-reduce"),
        (1, "backward_s", 0.3, "did not wait"),
        (0, "step_s", 0.2, "as long as the slowest"),
        (1, "step_s", 0.3, "as long as the slowest"),  # the straggler's own step shorter than its delay
        (1, "step_s", 0.6, "as long as the slowest"),  # the fast ranks ended their step before the straggler's
    ],
)
def test_a_wrong_straggler_figure_fails(strag, rank, key, value, fails):
    strag["ranks"][rank][key] = value
    failing = _failing(R.straggler_claims(strag))
    assert failing and fails in failing[0], failing


def test_a_slower_straggler(strag):
    slower = copy.deepcopy(strag)
    slower["delay"] = 0.8
    for r in slower["ranks"]:
        r["step_s"] += 0.4
    step, claims = R.slower_straggler_claims(strag, slower)
    assert step == pytest.approx(min(r["step_s"] for r in slower["ranks"] if not r["slow"]))
    assert _failing(claims) == []
    same = copy.deepcopy(slower)
    for r in same["ranks"]:
        r["step_s"] -= 0.4  # the step did not grow
    assert "grew by the straggler's extra 0.4 s" in _failing(R.slower_straggler_claims(strag, same)[1])[0]


# Section 6
def test_the_checkpoint_launch_supports_every_claim(ck):
    assert _failing(R.checkpoint_claims(CK_OUTPUT, ck, 2)) == []


@pytest.mark.parametrize(
    "wrong, output, fails",
    [
        (lambda c: None, CK_OUTPUT + "[rank 1] saved x\n", "exactly one rank"),  # every rank saved
        (lambda c: c.update(writer=c["ranks"][1] | {"rank": 1}), CK_OUTPUT.replace("rank 0", "rank 1"), "exactly one"),
        (lambda c: c["writer"].update(pid=c["ranks"][1]["pid"]), CK_OUTPUT, "exactly one rank"),  # another process
        (lambda c: None, CK_OUTPUT.replace("rank 0", "rank 1"), "exactly one rank"),  # the line names another rank
        (lambda c: c.pop("writer"), CK_OUTPUT, "exactly one rank"),  # a file that does not say who wrote it
        (lambda c: c.update(keys=c["ddp_keys"]), CK_OUTPUT, "unwrapped model"),  # saved ddp.state_dict()
        (lambda c: c["keys"].pop(), CK_OUTPUT, "unwrapped model"),  # a key missing from the file
        (lambda c: c["ranks"][1].update(identical=False), CK_OUTPUT, "exactly the trained weights"),
        (lambda c: c["ranks"][1].update(device="cuda:1", loaded_on="cuda:0"), CK_OUTPUT, "own device"),
        (lambda c: c["ranks"][1].update(at_wrap=0.5), CK_OUTPUT, "broadcast rank 0's weights"),
        (lambda c: [r.update(before_wrap=0.0) for r in c["ranks"]], CK_OUTPUT, "its own seed"),
        (lambda c: c["ranks"][1].update(loaded_apart=1e-6), CK_OUTPUT, "the same on every rank before any wrap"),
        (lambda c: c["ranks"][1].update(opt_same=False, opt_restored_steps=0), CK_OUTPUT, "resumed optimizer"),
        (lambda c: c["ranks"][0].update(opt_restored_steps=2), CK_OUTPUT, "resumed optimizer"),
    ],
)
def test_a_wrong_checkpoint_figure_fails(ck, wrong, output, fails):
    wrong(ck)
    failing = _failing(R.checkpoint_claims(output, ck, 2))
    assert failing and fails in failing[0], failing


def test_map_location_is_a_note_on_the_cpu(ck):
    notes = [c for c in R.checkpoint_claims(CK_OUTPUT, ck, 2) if not c.checked]
    assert [c.text for c in notes] == ["map_location put the tensors on each rank's own device"]
    for r in ck["ranks"]:
        r["device"] = r["loaded_on"] = f"cuda:{r['rank']}"
    assert all(c.checked for c in R.checkpoint_claims(CK_OUTPUT, ck, 2)) and not _failing(
        R.checkpoint_claims(CK_OUTPUT, ck, 2)
    )


def test_the_interview_evidence_has_a_line_per_question(hello, bwd, strag, ck):
    text = R.interview_evidence(hello, [object()], bwd, strag, ck, CK_OUTPUT, _runs()["shuffled"], 0)
    assert len(text.splitlines()) == 5 and "6 bucket all-reduces" in text and "1 writer (rank 0)" in text
    assert "DP: not shown on this run" in text and "5 + 5, disjoint" in text  # one call without 2 GPUs is no evidence
    assert "DP: 2 forwards" in R.interview_evidence(
        hello, [object()] * 2, bwd, strag, ck, CK_OUTPUT, _runs()["shuffled"], 2
    )
    both_rank_0 = S.epochs_of([_samplers(10)[0]] * 2, epochs=2)  # a sampler built with rank 0 on both ranks
    assert "5 + 5, OVERLAPPING" in R.interview_evidence(hello, [object()], bwd, strag, ck, CK_OUTPUT, both_rank_0, 0)


def test_the_figures_draw(bwd, strag):
    assert "2 ranks" in F.ddp_step_figure(2).axes[0].get_title()
    fig = F.shards_figure(_runs()["shuffled"], n=10)
    assert len(fig.axes[0].patches) == 20
    fig = F.bucket_timeline(bwd, "t")
    assert fig.axes[0].get_xlabel().startswith("ms since")
    fig = F.straggler_figure(strag)
    assert len(fig.axes[0].patches) == 2 * len(strag["ranks"])


def test_the_overlap_schematic_hides_all_but_the_last_buckets_all_reduce():
    s = F.overlap_schedule()  # 6 layers, 2 per bucket, 1 unit each; 1.5 per all-reduce
    assert s["overlapped"] == [(2.0, 3.5), (4.0, 5.5), (6.0, 7.5)]  # each starts when its bucket is full
    assert s["after"][0][0] == 6.0 and s["exposed_after"] == 4.5 and s["exposed_overlapped"] == 1.5
    slow = F.overlap_schedule(comm=3.0)  # all-reduces longer than a bucket's compute queue behind each other
    assert [a for a, _ in slow["overlapped"]] == [2.0, 5.0, 8.0] and slow["exposed_overlapped"] == 5.0
    ax = F.overlap_schematic().axes[0]
    assert len(ax.collections) == 4 and ax.get_xlabel().startswith("time")  # 2 rows x (backward, all-reduces)


def test_the_hello_report_writes_every_ranks_facts_as_plain_numbers(tmp_path):
    import torch.distributed as dist

    from distrinews_course.demo import report

    if dist.is_initialized():
        pytest.skip("a process group is already up in this process")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        report(tmp_path / "hello.json", "no GPU", rank=0, device=torch.device("cpu"), grad=torch.tensor([1.5, 2.0]))
    finally:
        dist.destroy_process_group()
    data = json.loads((tmp_path / "hello.json").read_text())
    assert data["backend_reason"] == "no GPU" and len(data["ranks"]) == 1
    assert {k: v for k, v in data["ranks"][0].items() if k != "pid"} == {"rank": 0, "device": "cpu", "grad": [1.5, 2.0]}
