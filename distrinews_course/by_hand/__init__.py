"""Chapter 03 (DDP by hand): what the rungs of scripts/by_hand/ build on, and the course's tooling around them.

What a rung imports: rung.py, the base every rung extends (its parameters, the broadcast of rank 0's weights, the
agreement that every rank has every gradient). Its script's main block runs it through harness.py (the data, the loop,
the closing check); the race and the checker time it with timeline.py. The data-parallel code itself (hooks,
buckets, the sharded optimizer, the sharded weights) stays in the scripts, in sight.

The course's side: models.py (the models and real texts the ladder trains on), measure.py (peak memory, bytes
written), watch.py and check.py (the checker and its cases), exercises.py (the learner's side of it), race.py and
race_memory.py (every rung against torch's DDP in one launch), report.py (the notebook's launcher and plots),
ddp_facts.py (torch's DDP's facts and the interview questions, checked on the race's figures).

Chapter 08's two levels of network (N nodes x g ranks): nodes.py (the layout and the two groups a two-level rung talks
in), race_two_level.py (its race in the box, against torch's DDP and FSDP2, with the cost model's predictions) and
report_two_level.py (the notebook's side).
"""

from .. import ROOT

SCRIPTS = ROOT / "scripts" / "by_hand"
RUNGS = ("naive", "flat", "overlapped", "bucketed", "zero1", "zero2", "zero3")
TWO_LEVEL = ("hierarchical", "hsdp")  # chapter 08's rungs: N nodes x g ranks (by_hand/nodes.py)
# Each rung's class, named by its idea: a traceback, a race table or a cell that names one says which idea ran.
CLASSES = {
    "naive": "NaiveDP",
    "flat": "FlatDP",
    "overlapped": "OverlappedDP",
    "bucketed": "BucketedDP",
    "zero1": "Zero1DP",
    "zero2": "Zero2DP",
    "zero3": "Zero3DP",
    "hierarchical": "HierarchicalDP",
    "hsdp": "HSDP",
}


def rung_class(module, rung: str):
    """The data-parallel class a rung's module (or a learner's file standing in for it) defines."""
    return getattr(module, CLASSES[rung])
