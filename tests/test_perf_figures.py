"""Chapter 05's picture of the idea and section 5's figure (perf_figures.py, perf_model.ring_schedule):
the ring's schedule really all-reduces (simulated chunk by chunk), the picture draws one box per chunk sent, and the
efficiency figure plots the ESTIMATE rows' own figures."""

import pytest

from distrinews_course import cluster_model as cm
from distrinews_course import perf_figures
from distrinews_course import perf_model as pm


def run_schedule(n, steps):
    """Each rank's chunks as the set of ranks whose data they hold the sum of, after `steps`."""
    held = [[{r} for _ in range(n)] for r in range(n)]
    for step in steps:
        sent = [(src, dst, chunk, phase, set(held[src][chunk])) for src, dst, chunk, phase in step]
        for src, dst, chunk, phase, data in sent:  # every rank sends at once: what it held before the step
            held[dst][chunk] = held[dst][chunk] | data if phase == "reduce-scatter" else data
    return held


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_the_ring_schedule_all_reduces_in_2_n_minus_1_steps_of_one_chunk(n):
    steps = pm.ring_schedule(n)
    assert len(steps) == 2 * (n - 1) and all(len(s) == n for s in steps)  # every rank sends one chunk per step
    everyone = set(range(n))
    after_rs = run_schedule(n, steps[: n - 1])
    assert all(after_rs[r][(r + 1) % n] == everyone for r in range(n))  # each rank owns one summed chunk
    assert all(chunk == everyone for rank in run_schedule(n, steps) for chunk in rank)  # then everyone has all
    sent = sum(1 for s in steps for src, *_ in s if src == 0)
    assert sent / n == pytest.approx(pm.ring_bytes_per_rank(1, n))  # 2(N-1) chunks of S/N: the ring's bytes


def test_a_broken_schedule_fails_the_simulation():
    steps = pm.ring_schedule(4)
    steps[0] = [(src, dst, (chunk + 1) % 4, phase) for src, dst, chunk, phase in steps[0]]  # a wrong first chunk
    assert not all(chunk == {0, 1, 2, 3} for rank in run_schedule(4, steps) for chunk in rank)
    with pytest.raises(ValueError, match="at least 2 ranks"):
        pm.ring_schedule(1)


@pytest.mark.parametrize("n", [2, 4])
def test_the_ring_picture_draws_one_box_per_chunk_sent(n):
    fig = perf_figures.ring_allreduce(n)
    (ax,) = fig.axes
    boxes = [p for p in ax.patches if p.get_gid() == "chunk"]
    assert len(boxes) == n * 2 * (n - 1) and len(ax.get_xticks()) == 2 * (n - 1)
    assert f"{2 * (n - 1)} steps" in ax.get_title()


def test_the_efficiency_figure_plots_each_estimate_row():
    paper = cm.on_paper(cm.distilbert_tensors())
    fig = perf_figures.paper_efficiency(paper)
    points = [(float(line.get_xdata()[0]), float(line.get_ydata()[0])) for line in fig.axes[0].lines[: len(paper)]]
    assert points == [(r["n"], pytest.approx(100 * r["estimate"].efficiency)) for r in paper]
