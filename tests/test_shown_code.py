"""shown_code: the lines a chapter shows are read from the scripts, and a call a script no longer makes fails."""

import pytest

from distrinews_course import shown_code


def test_chapter_06_shows_the_four_wrappers_from_the_script_its_runs_run():
    text = shown_code.lines_of(shown_code.SHARDING_WRAPPERS)
    for call in (
        "gradient_as_bucket_view=",
        "ZeroRedundancyOptimizer(",
        "fully_shard(",
        "gradient_checkpointing_enable(",
    ):
        assert call in text, text
    assert "    fully_shard(layer, mesh=mesh, reshard_after_forward=reshard)" in text  # the loop's body, indented
    assert text.splitlines()[0] == "# scripts/memory_footprint.py"


def test_chapter_03_shows_zero2_as_the_bucketed_rungs_all_reduce_and_what_replaces_it():
    text = shown_code.lines_of(shown_code.ZERO2_CHANGES)
    before, after = text.split("# scripts/by_hand/zero2.py\n")
    assert before == "# scripts/by_hand/bucketed.py\nwork = dist.all_reduce(flat, async_op=True)\n", text
    for call in (
        "torch.optim.AdamW(self.shards",
        "dist.reduce_scatter_tensor(mine, flat",
        "dist.all_gather_into_tensor(",
    ):
        assert call in after, text
    assert "for p in self.buckets[i]:\n    p.grad = None" in after  # the loop that frees the full gradients
    assert "all_reduce" not in after  # ZeRO-2 sends no all-reduce


def test_a_call_the_script_no_longer_makes_fails(tmp_path):
    (tmp_path / "train.py").write_text("model = DDP(model)\n")
    assert shown_code.lines_of([("train.py", "DDP(model")], root=tmp_path) == "# train.py\nmodel = DDP(model)"
    with pytest.raises(ValueError, match="no line with 'fully_shard\\('"):
        shown_code.lines_of([("train.py", "fully_shard(")], root=tmp_path)
