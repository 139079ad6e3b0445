"""distrinews_lib/quick_imports.py: modules load with the garbage collector paused and are then frozen out of its way;
what a program allocates afterwards is still collected; every rank a course launch starts gets it (course/harden.py).
Each check runs in a fresh interpreter: the collector's state is process-wide, and this one's is pytest's."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# What a process reports: whether the collector runs, how many objects are frozen, how many full passes it made.
REPORT = """
import gc, json, importlib._bootstrap as bootstrap
print(json.dumps({"enabled": gc.isenabled(), "frozen": gc.get_freeze_count(),
                  "full_passes": gc.get_stats()[2]["collections"], "wrapped": hasattr(bootstrap._find_and_load,
                  "distrinews_paused")}))
"""


def _run(*argv) -> dict:
    """`python ARGV...`; its last line, as JSON."""
    r = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_paused_turns_the_collector_off_and_freezes_only_a_big_load():
    got = _run(
        "-c",
        textwrap.dedent("""
        import gc, json
        from distrinews_lib import quick_imports as q
        r = {}
        with q.paused():
            r["inside"] = gc.isenabled()
            small = [[] for _ in range(100)]
        r["after_small"] = [gc.isenabled(), gc.get_freeze_count()]
        with q.paused():
            big = [[] for _ in range(q.FREEZE_AFTER + 1000)]  # lists: always tracked
        r["after_big"] = [gc.isenabled(), gc.get_freeze_count()]
        gc.disable()  # a caller that turned the collector off itself: a pause leaves it off
        with q.paused():
            pass
        r["callers_own_off"] = gc.isenabled()
        gc.enable()
        r["threshold"] = q.FREEZE_AFTER
        print(json.dumps(r))
        """),
    )
    assert got["inside"] is False
    assert got["after_small"] == [True, 0], "a small block is not frozen"
    assert got["after_big"][0] is True and got["after_big"][1] >= got["threshold"], got
    assert got["callers_own_off"] is False


def test_garbage_made_after_a_frozen_load_is_still_collected():
    got = _run(
        "-c",
        textwrap.dedent("""
        import gc, json
        from distrinews_lib import quick_imports as q
        q.install()
        import torch  # a big load: frozen
        frozen = gc.get_freeze_count()

        import weakref

        class Node:
            pass

        refs = []
        for _ in range(1000):  # 1,000 unreachable pairs that point at each other: only the collector frees them
            a, b = Node(), Node()
            a.other, b.other = b, a
            refs += [weakref.ref(a), weakref.ref(b)]
        del a, b
        gc.collect()
        print(json.dumps({"frozen": frozen, "alive": sum(r() is not None for r in refs), "enabled": gc.isenabled()}))
        """),
    )
    assert got["frozen"] > 100_000 and got["enabled"]
    assert got["alive"] == 0, got


def test_install_loads_torch_without_a_full_pass_and_is_idempotent():
    plain = _run("-c", "import torch\n" + REPORT)
    quick = _run(
        "-c",
        "import importlib._bootstrap as b\nfrom distrinews_lib import quick_imports as q\nassert q.install()\n"
        "once = b._find_and_load\nassert q.install() and b._find_and_load is once, 'wrapped twice'\n"
        "import torch\n" + REPORT,
    )
    assert plain["full_passes"] > 0 and plain["frozen"] == 0 and not plain["wrapped"], plain
    assert quick["full_passes"] == 0 and quick["frozen"] > 100_000 and quick["enabled"] and quick["wrapped"], quick


def test_a_rank_started_through_harden_loads_with_the_collector_paused(tmp_path):
    script = tmp_path / "rank.py"
    script.write_text("import torch\n" + REPORT)
    got = _run("-m", "distrinews_course.harden", str(script))
    assert got["wrapped"] and got["enabled"] and got["full_passes"] == 0 and got["frozen"] > 100_000, got
