"""The suite on two workers (`pytest -n 2`), with the chapters that time things run alone at the end.

Whole files go to whichever worker is free, as pytest-xdist's --dist loadfile does: a notebook's cells run in order in
one kernel, and a module's shared launches (its module-scoped fixtures) run once. The chapters are one unit, run in
their order on one worker: a chapter reads what an earlier one made (10 serves the checkpoint 01 and 02 write), so
none may start before the chapters before it have ended. The files of QUIET assert figures
that hold only on a machine doing nothing else (a race's speed-up, a cost model's step times, checked where the
machine was quiet): they wait until every other file has finished, then run one at a time, every other worker idle,
so that the suite checks them exactly as a serial run would, and the rest shares the two cores.
"""

from __future__ import annotations

from collections import OrderedDict

from xdist.scheduler import LoadScopeScheduling

# Files whose checks measure speed on a quiet machine (each gates them on the other programs' CPU share, and a
# busy run prints a NOTE instead of checking): they run last, alone. 06 is not one: its memory is the process's own,
# and recomputation's price is checked in FLOPs and CPU seconds, which other programs do not add to.
QUIET = (
    "notebooks/03_ddp_by_hand.ipynb",
    "notebooks/05_performance.ipynb",
    "notebooks/08_several_nodes.ipynb",
    "tests/test_hang_doctor_quiet.py",
)


class QuietLast(LoadScopeScheduling):
    """--dist loadfile, but the QUIET files last and alone. A worker runs its last test only once it knows what comes
    next (pytest's teardown needs the next item) or that nothing does: so the workers that run dry are shut down, and
    the last one still working runs the quiet files, once every other worker has finished."""

    quiet_files = QUIET
    chain_dir = "notebooks/"  # the files under it (except the quiet ones) run as one unit, in their order
    CHAIN = "the chapters, in order"

    def __init__(self, config, log=None):
        super().__init__(config, log)
        self.quiet: OrderedDict[str, dict[str, bool]] = OrderedDict()
        self.quiet_node = None  # the worker that runs the quiet files

    def _split_scope(self, nodeid: str) -> str:
        path = nodeid.split("::", 1)[0]
        if path.startswith(self.chain_dir) and path not in self.quiet_files:
            return self.CHAIN
        return path

    @property
    def tests_finished(self) -> bool:
        return not self.quiet and super().tests_finished

    @property
    def has_pending(self) -> bool:
        return bool(self.quiet) or super().has_pending

    def _pending(self, node) -> int:
        return self._pending_of(self.assigned_work.get(node, {}))

    def mark_test_complete(self, node, item_index, duration=0) -> None:
        super().mark_test_complete(node, item_index, duration)
        if self.quiet_node is not None and node is not self.quiet_node:
            self._reschedule(self.quiet_node)  # another worker's test ended: the quiet files may start now

    def _reschedule(self, node) -> None:
        if node.shutting_down:
            return
        if self.workqueue:  # the shared part, as loadscope does: another file once this one is nearly done
            if self._pending(node) <= 2:
                self._assign_work_unit(node)
            return
        if self._pending(node) > 2:
            return  # still busy with its file
        if not self.quiet:
            node.shutdown()  # nothing left to give: it runs what it holds, then stops
            return
        if self.quiet_node is None:
            others = [n for n in self.nodes if n is not node and not n.shutting_down and self._pending(n)]
            if others:
                node.shutdown()  # another worker is still busy: that one will run the quiet files
                return
            self.quiet_node = node
        if node is not self.quiet_node:
            node.shutdown()
            return
        if self._pending(node) <= 1 and not any(self._pending(n) for n in self.nodes if n is not node):
            scope, unit = self.quiet.popitem(last=False)  # every other worker done: the next quiet file, alone
            self.workqueue[scope] = unit
            self._assign_work_unit(node)

    def schedule(self) -> None:
        assert self.collection_is_completed
        if self.collection is not None:
            for node in self.nodes:
                self._reschedule(node)
            return
        if not self._check_nodes_have_same_collection():
            self.log("**Different tests collected, aborting run**")
            return
        self.collection = list(next(iter(self.registered_collections.values())))
        units: OrderedDict[str, dict[str, bool]] = OrderedDict()
        for nodeid in self.collection:
            units.setdefault(self._split_scope(nodeid), {})[nodeid] = False
        for scope in self.quiet_files:  # in QUIET's order, at the end
            if scope in units:
                self.quiet[scope] = units.pop(scope)
        # the chapters first (the longest unit), then modules by their number of tests: less idle time at the end
        for scope, unit in sorted(units.items(), key=lambda kv: (kv[0] != self.CHAIN, -len(kv[1]))):
            self.workqueue[scope] = unit
        for _ in range(2):  # two files each to start with, as loadscope does, so that no worker waits
            for node in self.nodes:
                self._reschedule(node)
