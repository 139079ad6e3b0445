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


def test_a_call_the_script_no_longer_makes_fails(tmp_path):
    (tmp_path / "train.py").write_text("model = DDP(model)\n")
    assert shown_code.lines_of([("train.py", "DDP(model")], root=tmp_path) == "# train.py\nmodel = DDP(model)"
    with pytest.raises(ValueError, match="no line with 'fully_shard\\('"):
        shown_code.lines_of([("train.py", "fully_shard(")], root=tmp_path)
