"""What the ranks' states say about a hang: which rank is the culprit, at which collective, in one paragraph.

Pure functions over what each rank reported about itself (its Flight Recorder entries and its main thread's stack):
no process group, no network, so every rule is tested on states written by hand (tests/test_hang_doctor.py).

The rules, in the order they are tried:
1. dead: a rank that does not answer at all (its process is gone) is the culprit.
2. mismatch: the first collective (by sequence number, in one process group) where two ranks called different
   things. Three ranks or more: the ranks outside the majority are the culprits. Two ranks, same line of code: the
   rank whose tensor shape differs from what that line passed before. Two ranks, different lines: the rank that is
   further along in the code it shares with the other skipped the collective the other waits in.
3. behind: a rank that has not called the collective the others wait in (it is slow, or stuck in its own code).
4. stuck together: every rank is in the same collective and nobody is missing.
A straggler (slow, but never stuck) is another question: straggler_verdict() answers it from arrival times.
"""

from __future__ import annotations

import os
import statistics
import sysconfig
from collections import Counter
from dataclasses import dataclass, field

Frame = tuple  # (file, line, function)


@dataclass
class Call:
    """One collective as a rank's Flight Recorder saw it."""

    pg: str  # the process group's id ("0": the default group)
    seq: int  # its sequence number in that group: the n-th collective the group ran
    op: str  # all_reduce, barrier, broadcast...
    sizes: tuple  # the input tensors' shapes, e.g. ((9,),); () for a barrier
    dtypes: tuple = ()
    done: bool = True  # completed (the Flight Recorder's "retired")
    t_ns: int = 0  # when this rank called it (wall clock, ns)
    where: tuple = ()  # the Python frames that called it, innermost first (empty when unknown)
    timeout_s: float = 0.0  # its process group's timeout


@dataclass
class RankState:
    """What one rank reported about itself."""

    rank: int
    calls: list  # [Call], oldest first
    stack: list  # its main thread's frames, innermost first
    pid: int = 0
    host: str = ""
    now_ns: int = 0
    failed: str | None = None  # the error its last collective raised, if it raised


@dataclass
class Verdict:
    kind: str  # dead | mismatch | skipped | behind | stuck | straggler
    culprits: list  # ranks
    text: str  # the paragraph the doctor prints
    op: str = ""
    seq: int | None = None
    sizes: tuple = ()
    site: str = ""  # the line of code: file:line (function)
    details: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {
            "kind": self.kind,
            "culprits": self.culprits,
            "op": self.op,
            "seq": self.seq,
            "sizes": [list(s) for s in self.sizes],
            "site": self.site,
            "text": self.text,
            "details": self.details,
        }


# ----------------------------------------------------------------------------------------------- frames and calls

_LIBRARY_DIRS = tuple(
    os.path.realpath(p) for p in {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"]} if p
)
_HIDDEN = ("/torch/", "/site-packages/", os.sep + "hang_doctor" + os.sep)


def user_frame(frame: Frame) -> bool:
    """A frame of the job's own code: not torch, not an installed package, not Python's library, not this doctor."""
    path = str(frame[0])
    if path.startswith("<"):  # <frozen runpy>, <string>
        return False
    real = os.path.realpath(path)
    return not any(h in path for h in _HIDDEN) and not real.startswith(_LIBRARY_DIRS)


def site(frames) -> str:
    """The innermost frame of the job's own code, as 'file.py:LINE (function)'; '' when there is none."""
    for f in frames:
        if user_frame(f):
            return f"{os.path.basename(f[0])}:{f[1]} ({f[2]})"
    return ""


def shown_stack(frames, limit: int = 4) -> str:
    """A stack for a paragraph: the job's own frames, innermost first, 'f (file:line) < g (file:line)', up to the
    script's module (what launched it, a wrapper or a launcher, is left out)."""
    own = []
    for f in frames:
        if user_frame(f):
            own.append(f)
        if f[2] == "<module>" and own:
            break
    own = own[:limit]
    return " < ".join(f"{f[2]} ({os.path.basename(f[0])}:{f[1]})" for f in own) or "(no frame of its own code)"


def shapes(sizes) -> str:
    """((9,),) -> '[9]'; () -> 'no tensor'."""
    return ", ".join("[" + ", ".join(map(str, s)) + "]" for s in sizes) or "no tensor"


def describe(call: Call) -> str:
    dtype = f"{call.dtypes[0].lower()} " if call.dtypes else ""
    return f"{call.op} #{call.seq} ({dtype}{shapes(call.sizes)})"


def _signature(call: Call) -> tuple:
    return call.op, tuple(map(tuple, call.sizes)), tuple(call.dtypes)


def _ranks(ranks) -> str:
    ranks = sorted(ranks)
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


# ------------------------------------------------------------------------------------------------ the hang itself


def _by_seq(state: RankState, pg: str) -> dict:
    return {c.seq: c for c in state.calls if c.pg == pg}


def _stuck_point(live: dict) -> Call | None:
    """The oldest collective still waiting on any rank (by when it was called)."""
    waiting = [c for s in live.values() for c in s.calls if not c.done]
    return min(waiting, key=lambda c: (c.t_ns, c.seq)) if waiting else None


def further_along(a: list, b: list) -> int:
    """Which of two stacks (innermost first) is further along in the code they share: 1 if `a`, -1 if `b`, 0 if it
    cannot tell. Walks from the outermost frame while both run the same function; at the first frame where they stand
    on different lines of the same function, the larger line number is further along."""
    for fa, fb in zip(reversed(a), reversed(b)):
        if (fa[0], fa[2]) != (fb[0], fb[2]):
            return 0
        if fa[1] != fb[1]:
            return 1 if fa[1] > fb[1] else -1
    return 0


def _usual(state: RankState, call: Call) -> tuple | None:
    """The signature most of this rank's earlier calls of `call`'s operation and dtype had (None: no such call)."""
    same = (call.op, call.dtypes)
    before = [c for c in state.calls if c.seq < call.seq and c.pg == call.pg and (c.op, c.dtypes) == same]
    return Counter(_signature(c) for c in before).most_common(1)[0][0] if before else None


def _deviates(state: RankState, call: Call) -> bool | None:
    """Did this rank pass `call` shapes that its earlier calls of the same operation and dtype never had? None when
    it made no such call before."""
    usual = _usual(state, call)
    return None if usual is None else _signature(call) != usual


def _mismatch(live: dict, seq: int, pg: str, world: int) -> Verdict | None:
    calls = {r: _by_seq(s, pg).get(seq) for r, s in live.items()}
    calls = {r: c for r, c in calls.items() if c is not None}
    groups: dict = {}
    for r, c in calls.items():
        groups.setdefault(_signature(c), []).append(r)
    if len(groups) < 2:
        return None
    ranked = sorted(groups.values(), key=len, reverse=True)
    lines = "; ".join(
        f"{_ranks(g)} called {describe(calls[g[0]])}"
        + (f" at {site(calls[g[0]].where)}" if site(calls[g[0]].where) else "")
        for g in ranked
    )
    if len(ranked[0]) > len(ranked[1]):  # a majority: the others are the odd ones out
        culprits = sorted(r for g in ranked[1:] for r in g)
        why = f"the other {len(ranked[0])} ranks agree"
        kind = "mismatch"
    else:
        a, b = ranked[0][0], ranked[1][0]
        if (calls[a].op, calls[a].dtypes) == (calls[b].op, calls[b].dtypes):  # the same operation, other shapes
            odd = [r for r in (a, b) if _deviates(live[r], calls[r])]
            culprits = odd if len(odd) == 1 else sorted((a, b))
            why = (
                f"rank {odd[0]}'s earlier {calls[odd[0]].op} calls of such tensors had "
                f"{shapes(_usual(live[odd[0]], calls[odd[0]])[1])}"
                if len(odd) == 1
                else "neither rank's earlier calls tell which shape is wrong"
            )
            kind = "mismatch"
        else:  # different operations: one rank skipped a collective (or called them in another order)
            order = further_along(live[a].stack, live[b].stack)
            skipper = {1: a, -1: b}.get(order)
            culprits = [skipper] if skipper is not None else sorted((a, b))
            other = b if skipper == a else a
            why = (
                f"rank {skipper} is further along in the same code: it skipped {calls[other].op} "
                f"at {site(calls[other].where) or '?'}"
                if skipper is not None
                else "the stacks do not tell which one went wrong"
            )
            kind = "skipped" if skipper is not None else "mismatch"
    # the collective to name: the one the culprit skipped (the other rank's), or the culprit's own mismatched call
    c = calls[next(r for r in calls if r not in culprits)] if kind == "skipped" else calls[culprits[0]]
    stacks = " ".join(f"Rank {r} is at {shown_stack(live[r].stack)}." for r in culprits)
    text = (
        f"{_ranks(culprits)} {'skipped a collective' if kind == 'skipped' else 'called a mismatched collective'}: "
        f"at collective #{seq} {lines} ({why}). {stacks}"
    )
    return Verdict(
        kind, culprits, text, c.op, seq, c.sizes, site(c.where), {"calls": {r: describe(x) for r, x in calls.items()}}
    )


def hang_verdict(states: dict, world: int, waited_s: float | None = None) -> Verdict:
    """The culprit of a hang from every rank's state ({rank: RankState, or None for a rank that did not answer})."""
    live = {r: s for r, s in states.items() if s is not None}
    dead = sorted(r for r in range(world) if states.get(r) is None)
    point = _stuck_point(live)
    if point is None:  # nobody is waiting: the error path, after the failed collective was retired
        last = [s.calls[-1] for s in live.values() if s.calls and s.failed]
        point = max(last, key=lambda c: c.t_ns) if last else None
    waiting = f" for {waited_s:.1f} s" if waited_s is not None else ""
    if dead:
        gone = f"{_ranks(dead)} {'is' if len(dead) == 1 else 'are'} dead: no answer from its process"
        if point is None:
            return Verdict("dead", dead, gone + ".")
        waiters = sorted(r for r, s in live.items() if _by_seq(s, point.pg).get(point.seq))
        where = f" at {site(point.where)}" if site(point.where) else ""
        text = f"{gone}. {_ranks(waiters).capitalize()} waited{waiting} for it in {describe(point)}{where}."
        return Verdict("dead", dead, text, point.op, point.seq, point.sizes, site(point.where))
    if point is None:
        return Verdict("stuck", [], "no rank is waiting in a collective: nothing to diagnose.")
    pg = point.pg
    first = min((c.seq for s in live.values() for c in s.calls if c.pg == pg), default=point.seq)
    for seq in range(max(first, point.seq - 256), point.seq + 1):  # the earliest divergence first
        found = _mismatch(live, seq, pg, world)
        if found is not None:
            return found
    behind = sorted(r for r, s in live.items() if point.seq not in _by_seq(s, pg))
    waiters = sorted(set(live) - set(behind))
    if behind:
        stacks = " ".join(f"Rank {r} is at {shown_stack(live[r].stack)}." for r in behind)
        text = (
            f"{_ranks(behind)} {'is' if len(behind) == 1 else 'are'} behind: {_ranks(waiters)} waited{waiting} in "
            f"{describe(point)} at {site(point.where) or '?'}, which {_ranks(behind)} "
            f"{'has' if len(behind) == 1 else 'have'} not called. {stacks}"
        )
        return Verdict("behind", behind, text, point.op, point.seq, point.sizes, site(point.where))
    text = (
        f"every rank waited{waiting} in {describe(point)} at {site(point.where) or '?'} and none is missing: "
        "the transport or a device is stuck, not the code."
    )
    return Verdict("stuck", [], text, point.op, point.seq, point.sizes, site(point.where))


def death_verdict(rank: int, error: str, frames: list, states: dict) -> Verdict:
    """This rank ends with its own `error` (raised at `frames`, innermost first) while the others may wait for it."""
    live = {r: s for r, s in states.items() if s is not None and r != rank}
    waits = {r: next((c for c in s.calls if not c.done), None) for r, s in live.items()}
    waits = {r: c for r, c in waits.items() if c is not None}
    at = f" at {site(frames)}" if site(frames) else ""
    text = f"rank {rank} is dying: {error}{at}."
    if not waits:
        return Verdict("dead", [rank], text, site=site(frames))
    c = min(waits.values(), key=lambda c: c.seq)
    where = f" at {site(c.where)}" if site(c.where) else ""
    text += f" {_ranks(waits).capitalize()} wait{'s' if len(waits) == 1 else ''} for it in {describe(c)}{where}."
    return Verdict("dead", [rank], text, c.op, c.seq, c.sizes, site(frames), {"error": error})


# ------------------------------------------------------------------------------------------------------ straggler

STRAGGLER_SHARE = 0.10  # the others wait for one rank at least this share of a typical step...
STRAGGLER_MAJORITY = 0.75  # ...in at least this share of the steps (noise takes turns; a straggler does not)
STRAGGLER_MIN_STEPS = 20  # steps every rank completed, at least: a rank slowed over its first few (its read-ahead
# filling on a busy machine: 21 ms of 53 over the first 11 steps, in CI) stays a minority of what the medians see
STRAGGLER_FLOOR_S = 0.005  # and a wait that matters: 5 ms a step or more


def _period(signatures: list) -> int:
    """Collectives per step: the shortest period (up to 32) the sequence of collectives repeats with (1 if none)."""
    n = len(signatures)
    for p in range(1, min(32, n // 2) + 1):
        same = sum(signatures[i] == signatures[i + p] for i in range(n - p))
        if same >= 0.9 * (n - p):
            return p
    return 1


def straggler_verdict(arrivals: dict, offsets_ns: dict | None = None) -> Verdict | None:
    """A rank the others keep waiting for, from when each rank called each completed collective.

    arrivals: {rank: [Call]} (t_ns: when the rank called it); offsets_ns: {rank: its clock minus the reference clock}
    (0 on one machine). The collectives are cut into steps (the period their sequence repeats with). In each step, the
    rank that arrived last at a collective kept the others waiting for (its arrival - the next latest). A straggler is
    the rank they waited for in STRAGGLER_MAJORITY of the steps, for a median of STRAGGLER_SHARE of a step or more:
    medians, so that one late start (a rank that imported torch slower) is not a straggler."""
    offsets_ns = offsets_ns or {}
    by_key: dict = {}
    for rank, calls in arrivals.items():
        for c in calls:
            if c.done:
                by_key.setdefault((c.pg, c.seq), {})[rank] = c
    ranks = sorted(arrivals)
    if len(ranks) < 2:
        return None
    matched = sorted(
        (k for k, v in by_key.items() if len(v) == len(ranks) and len({_signature(c) for c in v.values()}) == 1),
        key=lambda k: min(c.t_ns for c in by_key[k].values()),
    )
    per = _period([_signature(next(iter(by_key[k].values()))) for k in matched])
    steps = [matched[i : i + per] for i in range(0, len(matched) - per + 1, per)]
    if len(steps) < STRAGGLER_MIN_STEPS:
        return None
    arrive = {k: {r: (c.t_ns - offsets_ns.get(r, 0)) / 1e9 for r, c in by_key[k].items()} for k in matched}
    waits = {r: [] for r in ranks}  # per step: how long the others waited for rank r
    for step in steps:
        cost = dict.fromkeys(ranks, 0.0)
        for k in step:
            t = sorted((v, r) for r, v in arrive[k].items())
            cost[t[-1][1]] += t[-1][0] - t[-2][0]
        for r in ranks:
            waits[r].append(cost[r])
    starts = [min(arrive[step[0]].values()) for step in steps]
    step_s = statistics.median(b - a for a, b in zip(starts, starts[1:]))
    worst = max(ranks, key=lambda r: statistics.median(waits[r]))
    typical = statistics.median(waits[worst])
    led = sum(w > max(waits[r][i] for r in ranks if r != worst) for i, w in enumerate(waits[worst])) / len(steps)
    if step_s <= 0 or typical < max(STRAGGLER_FLOOR_S, STRAGGLER_SHARE * step_s) or led < STRAGGLER_MAJORITY:
        return None
    text = (
        f"rank {worst} is a straggler: the other ranks waited for it {1000 * typical:.0f} ms in a typical step of "
        f"{1000 * step_s:.0f} ms ({100 * typical / step_s:.0f}%; in {100 * led:.0f}% of {len(steps)} steps of "
        f"{per} collective{'s' if per > 1 else ''}). It is slow, not stuck: no collective times out."
    )
    details = {
        "added_ms_per_step": round(1000 * typical, 1),
        "step_ms": round(1000 * step_s, 1),
        "steps": len(steps),
        "per_step": per,
        "share_of_steps": round(led, 2),
    }
    return Verdict("straggler", [worst], text, details=details)
