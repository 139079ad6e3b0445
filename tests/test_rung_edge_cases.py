"""Every rung of chapter 03's ladder (scripts/by_hand/) as a learner's own script uses it, after a bare
dist.init_process_group("gloo", ...) and nothing of the course's: on 2 gloo processes (chapter 08's two-level rungs
on 4: 2 nodes x 2 ranks), in each family of cases where a hand-built DDP goes wrong, it trains as torch's
DistributedDataParallel does from the same start on the same batches (weights bit-identical where the summation order
is the same, within 1e-6 where it is not: the two-level rungs add a node's ranks first), or it refuses with the same
clear UserError on every rank. None hangs. One worker runs every case, each in a fresh group of processes
(tests/workers/rung_cases.py)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from distrinews_course.by_hand import RUNGS, TWO_LEVEL

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    out = tmp_path_factory.mktemp("rung_cases") / "cases.json"
    proc = subprocess.run(
        [sys.executable, "-W", "ignore", str(ROOT / "tests" / "workers" / "rung_cases.py"), "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())["cases"]
    return {(c["family"], c["case"], c["rung"]): c["ranks"] for c in res}


def family(cases, name, rungs=RUNGS + TWO_LEVEL):
    found = {k: v for k, v in cases.items() if k[0] == name}
    assert {k[2] for k in found} == set(rungs), f"{name}: not every rung ran"
    return found


def assert_as_ddp(key, ranks, bitwise=True):
    ends = [r["end"] for r in ranks]
    assert ends == ["equal"] * (4 if key[2] in TWO_LEVEL else 2), (key, ranks)
    worst = max(r["max_diff"] for r in ranks)
    if key[2] in TWO_LEVEL:  # at 4 ranks they add in another order than gloo's ring: within 1e-6, as they say;
        # bfloat16 keeps 8 bits, so another order rounds a weight to a neighbouring bfloat16 (measured: 2^-6, an ulp
        # of a weight between 2 and 4)
        assert worst <= (2**-5 if key[1] == "bfloat16" else 1e-6), (key, worst)
    else:
        assert worst == 0.0 if bitwise else worst <= 1e-6, (key, worst)


def assert_refused_alike(key, ranks, words):
    assert [r["end"] for r in ranks] == ["refused"] * len(ranks), (key, ranks)
    assert {r["type"] for r in ranks} == {"UserError"}, (key, ranks)
    assert len({r["message"] for r in ranks}) == 1, (key, ranks)  # the same message on every rank
    assert words in ranks[0]["message"], (key, ranks[0]["message"])


def test_every_rung_wraps_a_model_after_a_bare_init_process_group(cases):
    """The worker's processes call init_process_group themselves and nothing of the course's set-up: every rung builds,
    and in every case ends as torch's DDP does or refuses on every rank; none crashed or hung."""
    assert {k[2] for k in cases} == set(RUNGS + TWO_LEVEL)
    ends = {key: [r["end"] for r in ranks] for key, ranks in cases.items()}
    bad = {key: e for key, e in ends.items() if set(e) - {"equal", "refused"} or len(set(e)) != 1}
    assert not bad, bad
    plain = [ranks for key, ranks in cases.items() if key[0] == "uneven"]
    assert len(plain) == len(RUNGS + TWO_LEVEL) and all(r[0]["end"] == "equal" for r in plain)


def test_frozen_parameters(cases):
    for key, ranks in family(cases, "frozen").items():
        assert_as_ddp(key, ranks)


def test_bucket_sizes_of_zero_below_one_parameter_and_mixing_sizes(cases):
    found = family(cases, "buckets", RUNGS)  # the two-level rungs have no buckets
    assert len({k[1] for k in found}) == 3
    for key, ranks in found.items():
        assert_as_ddp(key, ranks)
        if "buckets" in ranks[0]:  # bucketed and zero2: the buckets are torch's DDP's rule at that cap
            assert ranks[0]["buckets"] == ranks[0]["ddp_rule"], key
    per_param = [r[0]["buckets"] for k, r in found.items() if k[1] == "bucket 0 MiB" and "buckets" in r[0]]
    assert per_param and all(len(b) == 1 for buckets in per_param for b in buckets)  # 0: a bucket per gradient
    mixed = [r[0]["buckets"] for k, r in found.items() if k[1] == "buckets mixing sizes" and "buckets" in r[0]]
    assert mixed and all(any(len(b) > 1 for b in buckets) for buckets in mixed)


def test_a_parameter_count_that_does_not_split_evenly(cases):
    """ZeRO's flat buffers, buckets and blocks all hold an odd number of elements here: padded, then trimmed."""
    for key, ranks in family(cases, "uneven").items():
        assert_as_ddp(key, ranks)


def test_a_parameter_unused_on_every_step_from_step_2_or_on_one_rank(cases):
    found = family(cases, "unused")
    assert len({k[1] for k in found}) == 3
    for key, ranks in found.items():
        assert_refused_alike(key, ranks, "an unused parameter: head_b.weight")


def test_float64_and_bfloat16_parameters(cases):
    found = family(cases, "dtype")
    for key, ranks in found.items():
        assert_as_ddp(key, ranks)
        assert ranks[0]["dtypes"] == [f"torch.{key[1]}"], (key, ranks[0]["dtypes"])


def test_two_backward_passes_before_a_step(cases):
    """Accumulation: the rungs that average after backward (and ZeRO-2/3, whose shards add up) match torch's DDP to
    rounding (DDP averages each pass, they average the sum); the two that launch inside backward refuse it."""
    for key, ranks in family(cases, "accumulation").items():
        if key[2] in ("overlapped", "bucketed"):
            assert_refused_alike(key, ranks, "a second backward() before step()")
        else:
            assert_as_ddp(key, ranks, bitwise=False)


def test_gradients_ready_in_a_different_order_on_each_rank(cases):
    for key, ranks in family(cases, "order").items():
        assert_as_ddp(key, ranks)


def test_a_two_level_rung_refuses_a_world_that_does_not_split_into_nodes(cases):
    found = family(cases, "layout", TWO_LEVEL)
    for key, ranks in found.items():
        if "nodes of 3" in key[1]:
            assert_refused_alike(key, ranks, "4 ranks do not split into nodes of 3")
        else:
            assert_refused_alike(key, ranks, "the ranks disagree on the ranks per node (2 to 4)")
