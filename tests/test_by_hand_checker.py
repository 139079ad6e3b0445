"""Chapter 03's checker (distrinews_course/by_hand/: check.py, probes.py, exercises.py): every mistake it claims to
catch, caught on a deliberately wrong answer (a mutant of the reference answer) with its one-line message; the
reference answers pass every case; a blank or unfinished exercise is told so without a launch; the hints come one at
a time."""

import importlib.util
import re
from pathlib import Path

import nbformat
import pytest

from distrinews_course.by_hand import check, exercises, probes, timeline

ROOT = Path(__file__).resolve().parent.parent
EXERCISES = ("overlapped", "bucketed", "zero1", "zero3")


def answers():
    spec = importlib.util.spec_from_file_location("answers_03", ROOT / "notebooks" / "answers" / "03_ddp_by_hand.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# One deliberately wrong answer per mistake: (label, exercise, text of the reference answer, its replacement, the
# mistake's key, what the one-line message must say).
MUTANTS = [
    (
        "missing_divide",
        "overlapped",
        "        p.grad.div_(dp.world)  # divide first, as torch's DDP does (by 2: exact in fp32)\n",
        "",
        "missing_divide",
        r"^missing divide: the gradients your optimizer stepped with are 2\.00x torch DDP's average",
    ),
    (
        "missing_divide_sharded",
        "zero1",
        "grads = dp.flatten([p.grad for p in dp.params]).div_(dp.world)",
        "grads = dp.flatten([p.grad for p in dp.params])",
        "missing_divide",
        r"^missing divide: .* 2\.00x",
    ),
    (
        "wait_at_launch",
        "bucketed",
        "        work = dist.all_reduce(flat, async_op=True)\n",
        "        work = dist.all_reduce(flat, async_op=True)\n        work.wait()  # waits where it launches\n",
        "no_overlap",
        r"^no overlap: with a link that takes 100 ms per collective, your code waited for \d+ of them inside "
        r"backward",
    ),
    (
        "readiness_order",
        "overlapped",
        "    while len(dp.pending) < len(dp.order) and dp.order[len(dp.pending)] in dp.ready:\n"
        "        p = dp.order[len(dp.pending)]  # the next one in the fixed order, and it is ready\n",
        "    for p in [param]:  # each one as it becomes ready\n",
        "readiness_order",
        r"^launched in readiness order, not a fixed one: .* the ranks [0-9.e-]+ apart",
    ),
    (
        "second_backward",
        "bucketed",
        "    if dp.ready[i] > len(dp.buckets[i]):  # more gradients than the bucket holds: "
        "a second backward before the "
        'step\n        raise UserError(f"a second backward() before step(): bucket {i} had already been averaged. This '
        'rung averages "\n                        "one backward per step: call step() after each backward().")\n',
        "",
        "second_backward",
        r"^a second backward before the step: the weights end [0-9.e-]+ off torch DDP's, which "
        r"accumulates both passes, silently",
    ),
    (
        "dtype",
        "zero1",
        "flat = torch.zeros(self.shard_size * self.world, dtype=self.dtype)",
        "flat = torch.zeros(self.shard_size * self.world)",
        "dtype",
        r"^dtype not preserved: float64 parameters, but a reduce_scatter ran in float32",
    ),
    (
        "unused_parameter",
        "zero1",
        "        stop_unless_every_rank_has(self, self.missing())  # on every rank, not one\n",
        "",
        "unused_parameter",
        r"^an unused parameter \(a head unused on rank 1\): rank 0: \w+: .*; rank 1: AttributeError",
    ),
    (
        "bucket_rule",
        "bucketed",
        "        buckets[-1].append(p)\n        size += p.numel() * p.element_size()\n        if size >= cap:\n"
        "            buckets.append([])\n            size = 0\n",
        "        if buckets[-1] and size + p.numel() * p.element_size() > cap:  # closed before it would overflow\n"
        "            buckets.append([])\n            size = 0\n        buckets[-1].append(p)\n"
        "        size += p.numel() * p.element_size()\n",
        "bucket_rule",
        r"^the bucket rule is not the one stated: tiny model at 1 MiB: your 2 buckets .* the rule's 1 ",
    ),
    (
        "not_freed",
        "zero3",
        "    block.full.untyped_storage().resize_(0)\n",
        "    pass\n",
        "stopped",
        r"^your code stopped: free\(\) left the rest's full weights in memory \(\d+\.\d\d MiB\): free "
        r"after use gives that memory back$",
    ),
    (
        "not_gathered",
        "zero3",
        "    block.full.untyped_storage().resize_(block.nbytes)\n",
        "",
        "stopped",
        r"^your code stopped: a collective \(all_gather\) was given a tensor whose memory is freed",
    ),
    (  # exercise 4, mixed precision: the master shard sent as it is, float32, into float16 weights
        "gather_low",
        "zero3",
        "    low = block.shard.detach().to(dp.param_dtype)  # a copy only if the dtypes differ",
        "    low = block.shard.detach()  #",
        "gather_low",
        r"^a gather left in float32: with param_dtype float16, your all-gather sent the float32 master shard",
    ),
    (  # ... the gradients summed in the dtype they arrive in (the compute dtype), not reduce_dtype
        "reduce_low",
        "zero3",
        "    flat = torch.zeros(block.full.numel(), dtype=dp.reduce_dtype)\n",
        "    flat = torch.zeros(block.full.numel(), dtype=dp.param_dtype)\n",
        "reduce_low",
        r"^gradients reduced in float16: with param_dtype float16, your reduce-scatter summed the gradients in "
        r"float16, where dp\.reduce_dtype is float32",
    ),
    (  # ... and the optimizer given the weights forward computes with, not the master shards
        "steps_compute_copy",
        "zero3",
        "    return [b.shard for b in dp.blocks]\n",
        "    return [p for b in dp.blocks for p in b.params]\n",
        "steps_compute_copy",
        r"^the optimizer steps the compute copy, not the master: it holds 40 tensors in float32, the weights forward "
        r"computes with",
    ),
    (  # rank 1 skips a collective: rank 0 fails after the collective timeout, with a message, never a hang
        "skipped_collective",
        "zero1",
        "        dist.all_gather_into_tensor(weights, dp.shard.detach())",
        "        if dist.get_rank() == 0:  # rank 1 skips the all-gather\n"
        "            dist.all_gather_into_tensor(weights, dp.shard.detach())",
        "crashed",
        r"(?i)timed out|timeout|connection",
    ),
]


def mutant_files(tmp_path):
    solutions = answers()
    items = []
    for label, rung, old, new, key, message in MUTANTS:
        text = solutions.solution_source(rung, functions_only=rung == "zero3")
        assert text.count(old) == 1, f"mutant {label}: the text to replace is not in the reference answer once"
        path = tmp_path / f"mutant_{label}.py"
        path.write_text(text.replace(old, new))
        items.append((rung, path, label))
    return items


@pytest.fixture(scope="module")
def mutants_launch(tmp_path_factory):
    """Every mutant in ONE launch, and ZeRO-2 (the one rung no exercise covers) on every case beside them: its own
    launch would start two more ranks and run torch DDP's references again."""
    tmp = tmp_path_factory.mktemp("mutants")
    # A mutant that leaves a collective (a rank that crashed) costs its peer the whole collective timeout: 5 s, not
    # the notebook's 20; both ranks run the same steps, so a healthy collective never waits that long for its peer.
    return exercises.check_exercises(
        mutant_files(tmp), tmp, timeout=1200, models="tiny", check_steps=2, collective_timeout_s=5, rungs="zero2"
    )


@pytest.mark.slow
def test_every_mutant_is_caught_with_its_message(mutants_launch):
    for label, rung, old, new, key, message in MUTANTS:
        v = mutants_launch[label]
        assert v["ok"] is False and v["mistake"] == key, (label, v)
        assert "\n" not in v["message"] and re.search(message, v["message"]), (label, v["message"])


# case -> how ZeRO-2 must end: "as DDP" (weights equal to torch DDP's on the same case) or "clear error on every rank"
ZERO2_EXPECTED = {
    "accumulate": "as DDP",
    "dtype": "as DDP",
    "order": "as DDP",
    "unused_rank1": "clear error on every rank",
    "unused_all": "clear error on every rank",
}


@pytest.mark.slow
def test_zero2_meets_every_case_of_the_checker(mutants_launch):
    """The checker's cases on ZeRO-2: each ends as torch's DDP does, or in a clear error on every rank; its buckets
    follow DDP's rule and none of its collectives waits inside backward."""
    race = mutants_launch["_race"]
    assert race["check"]["tiny"]["zero2"]["verdict"]["ok"], race["check"]["tiny"]["zero2"]
    got = race["probes"]["zero2"]
    assert list(got) == probes.probes_for("zero2"), got
    for case, want in ZERO2_EXPECTED.items():
        v = got[case]
        assert v["ok"], (case, v)
        if want == "clear error on every rank":
            assert "clear error on every rank" in v["summary"] or "refused on every rank" in v["summary"], v
        else:
            assert "max difference" in v["summary"] and "refused" not in v["summary"], v
    assert got["overlap"]["ok"] and "none waited for there" in got["overlap"]["summary"], got["overlap"]
    assert got["bucket_rule"]["ok"], got["bucket_rule"]


def test_every_mistake_of_the_table_has_a_mutant():
    claimed = {
        "missing_divide",
        "no_overlap",
        "readiness_order",
        "second_backward",
        "dtype",
        "unused_parameter",
        "bucket_rule",
        "gather_low",
        "reduce_low",
        "steps_compute_copy",
    }
    assert claimed <= {key for *_, key, _ in MUTANTS}
    assert claimed <= set(check.MISTAKES)


def test_a_blank_exercise_is_not_attempted_and_launches_nothing(tmp_path, capsys):
    for rung in EXERCISES:
        path = tmp_path / f"{rung}.py"
        path.write_text(exercises.skeleton(rung))
        v = exercises.check_exercise(rung, path, out_dir=tmp_path)
        assert v["ok"] is None and v["passed"] == []
    out = capsys.readouterr().out
    assert out.count("not attempted yet") == len(EXERCISES)
    assert "✗" not in out and "Traceback" not in out


def test_an_unfinished_exercise_names_what_is_left(tmp_path, capsys):
    text = answers().solution_source("bucketed")
    text = text.replace(
        text[text.index("def make_buckets") : text.index("def on_grad_ready")],
        'def make_buckets(params, cap):\n    """The rule."""\n    raise NotImplementedError\n\n\n',
    )
    path = tmp_path / "partial.py"
    path.write_text(text)
    v = exercises.check_exercise("bucketed", path, out_dir=tmp_path)
    assert v["ok"] is False and v["mistake"] == "not_written"
    assert capsys.readouterr().out.strip() == "✗ still to write: make_buckets raises NotImplementedError"


def test_a_file_that_does_not_parse_is_one_line(tmp_path, capsys):
    path = tmp_path / "broken.py"
    path.write_text(exercises.skeleton("zero1").replace("    def make_shard(self):", "    def make_shard(self)"))
    v = exercises.check_exercise("zero1", path, out_dir=tmp_path)
    assert v["ok"] is False and v["message"].startswith("your code raised SyntaxError: ")
    assert capsys.readouterr().out.count("\n") == 1


def test_the_reference_answers_have_no_blank_left():
    solutions = answers()
    for rung in EXERCISES:
        text = solutions.solution_source(rung, functions_only=rung == "zero3")
        path = Path(exercises.SKELETONS).parent / f"{rung}.py"
        assert exercises.stubs(path) == []  # the rung itself (the reference) is complete
        compile(text, f"answer_{rung}", "exec")
        assert "raise NotImplementedError" not in text


def test_the_notebook_exercise_cells_are_the_skeletons():
    nb = nbformat.read(ROOT / "notebooks" / "03_ddp_by_hand.ipynb", as_version=4)
    cells = {
        c.source.splitlines()[0].split("/")[-1]: c.source
        for c in nb.cells
        if "exercise" in c.metadata.get("tags", []) and c.source.startswith("%%writefile")
    }
    for rung in ("overlapped", "bucketed", "zero1"):
        assert cells[f"ex_{rung}.py"].split("\n", 1)[1].rstrip() == exercises.skeleton(rung).rstrip()
    # exercise 4: the skeleton's five functions, after its imports
    zero3 = exercises.skeleton("zero3")
    assert exercises.stubs_of_skeleton("zero3") == ["gather", "free", "reduce_scatter", "land", "master_weights"]
    for fn in ("\ndef gather(", "\ndef free(", "\ndef reduce_scatter(", "\ndef land(", "\ndef master_weights("):
        start = zero3.index(fn)
        end = zero3.index("raise NotImplementedError", start)
        assert zero3[start:end] in cells["ex_zero3.py"]
    solutions = [c for c in nb.cells if "solution" in c.metadata.get("tags", [])]
    assert solutions and all(c.metadata.get("jupyter", {}).get("source_hidden") for c in solutions)
    assert not any(c.get("outputs") for c in nb.cells if c.cell_type == "code")  # committed without outputs


def test_hints_come_one_at_a_time(capsys):
    for rung, hints in exercises.HINTS.items():
        assert len(hints) >= 3
        exercises.hint(rung, 2)
        out = capsys.readouterr().out
        assert out.startswith(f"hint 2 of {len(hints)} ({rung}): ") and hints[1] in out
        assert hints[0] not in out and hints[2] not in out


def test_no_hint_spells_the_answer_out():
    solutions = answers()
    for rung, hints in exercises.HINTS.items():
        code = solutions.solution_source(rung, functions_only=rung == "zero3")
        answer_lines = {
            line.strip()
            for line in code.splitlines()
            if len(line.strip()) > 25 and not line.strip().startswith(("#", '"', "def ", "class ", "import ", "from "))
        }
        for hint in hints:
            assert not any(line in hint for line in answer_lines), (rung, hint)


def test_wire_bytes_has_the_ring_factor_at_two_and_four_ranks():
    mib = 2**20
    assert timeline.wire_bytes("all_reduce", mib, 2) == mib  # 2(N-1)/N = 1 at N = 2: a missing factor hides here
    assert timeline.wire_bytes("all_reduce", mib, 4) == 1.5 * mib
    assert timeline.wire_bytes("reduce_scatter", mib, 4) == timeline.wire_bytes("all_gather", mib, 4) == 0.75 * mib
    assert timeline.wire_bytes("all_reduce", mib, 1) == 0.0


def test_a_failed_launch_is_one_line():
    class Err(Exception):
        pass

    text = (
        "W1126 warning\nerror: an unused parameter: head_b.weight got no gradient\n"
        "       on rank 1 of 2\n[rank 1] stopped: x\nTraceback (most recent call last):\n"
    )
    assert exercises.launch_error_line(Err(text)) == (
        "an unused parameter: head_b.weight got no gradient on rank 1 of 2"
    )


# Chapter 08's exercise: the cross-node half of the hierarchical all-reduce, checked on 2 nodes x 2 ranks. One wrong
# answer per mistake its checker names: (label, text of the reference answer, its replacement, key, message).
TWO_LEVEL_MUTANTS = [
    (
        "wrong_group",
        "dist.all_reduce(shard, group=dp.nodes.cross)",
        "dist.all_reduce(shard, group=dp.nodes.intra)",
        "wrong_group",
        r"^the wrong group: your all-reduce of the shard ran among ranks 0, 1 \(this rank's node: dp\.nodes\.intra\); "
        r".* \(ranks 0, 2 for rank 0: dp\.nodes\.cross\)$",
    ),
    (
        "default_group",
        "dist.all_reduce(shard, group=dp.nodes.cross)",
        "dist.all_reduce(shard)",
        "wrong_group",
        r"^the wrong group: your all-reduce of the shard ran among ranks 0, 1, 2, 3 \(every rank: the default group\)",
    ),
    (
        "missing_divide",
        "    shard.div_(dp.world)  # divide, as torch's DDP does (by a power of 2 here: exact, before or after the "
        "sums)\n",
        "",
        "missing_divide",
        r"^missing divide: the gradients your optimizer stepped with are 4\.00x torch DDP's average: they are summed "
        r"over the 4 ranks",
    ),
    (
        "gather_first",
        '    with dp.timeline.span("comm_sync", "all-reduce across the nodes"):\n'
        "        dist.all_reduce(shard, group=dp.nodes.cross)  # the only bytes on the slow link: 1/g of the buffer "
        "per rank\n"
        '    with dp.timeline.span("comm_sync", "all-gather inside the node"):\n'
        "        dist.all_gather_into_tensor(flat, shard, group=dp.nodes.intra)\n",
        "    dist.all_gather_into_tensor(flat, shard, group=dp.nodes.intra)\n"
        "    dist.all_reduce(shard, group=dp.nodes.cross)\n",
        "gather_first",
        r"^all-gather before all-reduce: your all-gather inside the node ran before the all-reduce across the nodes",
    ),
]


def two_level_mutant_files(tmp_path):
    text = answers().solution_source("hierarchical", functions_only=True)
    items = []
    for label, old, new, *_ in TWO_LEVEL_MUTANTS:
        assert text.count(old) == 1, f"mutant {label}: the text to replace is not in the reference answer once"
        path = tmp_path / f"mutant_{label}.py"
        path.write_text(text.replace(old, new))
        items.append(("hierarchical", path, label))
    return items


@pytest.mark.slow
def test_the_cross_node_half_mutants_are_caught_with_their_messages(tmp_path):
    items = [*two_level_mutant_files(tmp_path), ("hierarchical", tmp_path / "reference.py", "reference")]
    items[-1][1].write_text(answers().solution_source("hierarchical", functions_only=True))
    verdicts = exercises.check_exercises(items, tmp_path, timeout=1200, models="tiny", check_steps=2)
    for label, _, _, key, message in TWO_LEVEL_MUTANTS:
        v = verdicts[label]
        assert v["ok"] is False and v["mistake"] == key, (label, v)
        assert "\n" not in v["message"] and re.search(message, v["message"]), (label, v["message"])
    assert verdicts["reference"]["ok"] is True, verdicts["reference"]  # within 1e-6 of DDP: the rung's tolerance


def test_the_two_level_mistakes_have_mutants_and_messages():
    assert {"wrong_group", "gather_first", "missing_divide"} <= {m[3] for m in TWO_LEVEL_MUTANTS}
    assert {"wrong_group", "gather_first"} <= set(check.MISTAKES)


def test_the_two_level_mistakes_are_read_from_the_calls():
    rs, ag = {"kind": "reduce_scatter", "group": (0, 1)}, {"kind": "all_gather", "group": (0, 1)}
    ar = lambda group: {"kind": "all_reduce", "group": group}  # noqa: E731
    assert check.two_level_mistake([rs, ar((0, 2)), ag] * 2, rank=0, per_node=2, world=4) is None
    assert check.two_level_mistake([rs, ar((1, 3)), ag], rank=1, per_node=2, world=4) is None
    assert check.two_level_mistake([rs, ag, ar((0, 2))], 0, 2, 4)["mistake"] == "gather_first"
    assert check.two_level_mistake([rs, ar(None), ag], 0, 2, 4)["mistake"] == "wrong_group"
    assert "rank 1" in check.two_level_mistake([rs, ar((0, 1)), ag], 1, 2, 4)["message"]


def test_chapter_08s_exercise_cell_is_the_skeletons_function():
    nb = nbformat.read(ROOT / "notebooks" / "08_several_nodes.ipynb", as_version=4)
    cell = next(c.source for c in nb.cells if c.source.startswith("%%writefile outputs/two_level/ex_hierarchical.py"))
    skeleton = exercises.skeleton("hierarchical")
    start = skeleton.index("def across_nodes(dp, shard, flat):")
    assert skeleton[start:].strip() in cell
    assert "across_nodes" not in answers().solution_source("hierarchical", functions_only=True).split("def ")[0]


def answers_08():
    spec = importlib.util.spec_from_file_location("answers_08", ROOT / "notebooks" / "answers" / "08_several_nodes.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Chapter 08's HSDP exercise: node_group() and replicate() of scripts/by_hand/hsdp.py, checked on 2 nodes x 2 ranks
# against torch's DDP and torch's FSDP2 on a 2-D mesh. One wrong answer per mistake its checker names.
HSDP_MUTANTS = [
    (
        "shard_across",
        "    return dp.nodes.intra\n",
        "    return dp.nodes.cross\n",
        "shard_group",
        r"^the wrong shard group: your blocks were gathered and reduce-scattered among ranks 0, 2 \(the ranks across "
        r"the nodes: dp\.nodes\.cross\); HSDP shards each block inside the node, ranks 0, 1 for rank 0",
    ),
    (
        "shard_everywhere",
        "    return dp.nodes.intra\n",
        "    return None  # the default group\n",
        "shard_group",
        r"^the wrong shard group: .* among ranks 0, 1, 2, 3 \(every rank: the default group\)",
    ),
    (
        "replicate_in_the_node",
        "group=dp.nodes.cross, async_op=True",
        "group=dp.nodes.intra, async_op=True",
        "wrong_group",
        r"^the wrong group: your all-reduce of the shard ran among ranks 0, 1 \(this rank's node: dp\.nodes\.intra\)",
    ),
    (
        "no_replicate",
        "        if b.shard.grad is not None:  # a block whose parameters are all frozen has none\n",
        "        if False:  # never across the nodes\n",
        "no_replicate",
        r"^no replicate: each node's gradient shards were summed over its own ranks only",
    ),
]


@pytest.mark.slow
def test_the_hsdp_mutants_are_caught_and_the_answer_equals_fsdp2s_2d_mesh(tmp_path):
    reference = answers_08().write_hsdp(tmp_path / "reference.py")
    text = reference.read_text()
    items = [("hsdp", reference, "reference")]
    for label, old, new, *_ in HSDP_MUTANTS:
        assert text.count(old) == 1, f"mutant {label}: the text to replace is not in the reference answer once"
        path = tmp_path / f"mutant_{label}.py"
        path.write_text(text.replace(old, new))
        items.append(("hsdp", path, label))
    verdicts = exercises.check_exercises(items, tmp_path, timeout=1200, models="tiny", check_steps=2)
    for label, _, _, key, message in HSDP_MUTANTS:
        v = verdicts[label]
        assert v["ok"] is False and v["mistake"] == key, (label, v)
        assert "\n" not in v["message"] and re.search(message, v["message"]), (label, v["message"])
    assert verdicts["reference"]["ok"] is True, verdicts["reference"]
    got = verdicts["_race"]["check"]["tiny"]["reference"]
    assert got["max_weight_diff_vs_fsdp2"] <= 1e-6 and got["max_weight_diff"] <= 1e-6, got  # HSDP's tolerance


def test_the_hsdp_skeleton_leaves_the_two_functions_blank():
    assert exercises.stubs_of_skeleton("hsdp") == ["node_group", "replicate"]
    assert exercises.EXERCISES["hsdp"] == "node_group"
    assert exercises.stubs(Path(exercises.SKELETONS).parent / "hsdp.py") == []  # the rung, the answer, is complete


def test_the_hsdp_mistakes_are_read_from_the_calls():
    gather = lambda group: {"kind": "all_gather", "group": group}  # noqa: E731
    rs = lambda group: {"kind": "reduce_scatter", "group": group}  # noqa: E731
    ar = lambda group: {"kind": "all_reduce", "group": group}  # noqa: E731
    step = [gather((0, 1)), gather((0, 1)), rs((0, 1)), ar((0, 2))]
    assert check.hsdp_mistake(step * 2, rank=0, per_node=2, world=4) is None
    assert check.hsdp_mistake([gather((2, 3)), rs((2, 3)), ar((1, 3))], rank=3, per_node=2, world=4) is None
    assert check.hsdp_mistake([gather(None), rs(None), ar((0, 2))], 0, 2, 4)["mistake"] == "shard_group"
    assert check.hsdp_mistake([gather((0, 1)), rs((0, 1)), ar((0, 1))], 0, 2, 4)["mistake"] == "wrong_group"
    assert check.hsdp_mistake([gather((0, 1)), rs((0, 1))], 0, 2, 4)["mistake"] == "no_replicate"
    assert "ranks 2, 3 for rank 2" in check.hsdp_mistake([gather((0, 2))], 2, 2, 4)["message"]
