"""Chapter 08's two-node run, read: the job scripts/multinode/two_nodes.py ran (node1 killed after a step, a
replacement joining, the resume from the shared snapshots), told in a few lines, and the claims its log and its record
(WORKDIR/cluster.json) support.

    run = TwoNodeRun.launch(out, train_args, kill_step=7, timeout=240)   # or TwoNodeRun.read(out) after the fact
    print(run.story())                  # rendezvous results, identities, the kill, node0's error and its cause, resume
    print(run.identity_table()); settle(run.identity_claims())
    print(run.rounds_table()); settle(run.rounds_claims())
    print(run.traffic_table(params, steps=40)); settle(run.traffic_claims(params, steps=40))
    plot_timeline(run); settle(run.timeline_claims())
    same = OneMachine.train(...)         # distrinews_course/one_machine.py: the same job on one machine

Each claims method returns distrinews_course.claims.Claim objects: the figures in its text are this run's, and a wrong
figure in the log or the record (a port reused, a count off, an error that came after the timeout) makes it fail.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from . import ROOT
from .claims import Claim
from .plots import finish

if TYPE_CHECKING:
    from .one_machine import OneMachine

TWO_NODES = ROOT / "scripts" / "multinode" / "two_nodes.py"
# torchrun's own log lines, prefixed with their node: "node0 | I1207 01:47:37.984000 15647 f.py:553] "
AGENT = re.compile(r"^(node\d) \| [IWE]\d{4} [\d:.]+ +\d+ \S+\] ")
RDZV_KEY = re.compile(r"^\s+(restart_count|master_addr|master_port|group_rank)=(\S+)$")
IDENTITY = re.compile(
    r"^(node\d) \| \[identity\] RANK (\d+) \| LOCAL_RANK (\d+) \| node (\S+) (\S+)(?: \((\S+)\))? \| "
    r"WORLD_SIZE (\d+) \| node rank (\S+) of (\S+) \| store (\S+) \| attempt (\d+)"
)
IDENTITY_FIELDS = ("node", "rank", "local_rank", "host", "addr", "ifname", "world", "node_rank", "nodes")
IDENTITY_FIELDS += ("store", "attempt")  # the groups of IDENTITY, in order
# The training script's lines a learner follows; its start-up lines (preset, plan, data, model) stay in the log
STORY = ("[launcher", "[node ", "resume auto", "resumed from", "epoch ", "parameters identical", "saved ")
# The cause a rank's error quotes from gloo, in the parenthesis that ends the library's paragraph
CAUSE = re.compile(r"\((?:\[[^\]()]+\] )?([^()]+?)\.? ?…?\)\s*$")
# A peer that vanished: what gloo says on the surviving rank when the connection drops
DROPPED = ("Connection reset by peer", "Connection closed by peer", "Broken pipe")


@dataclass
class TwoNodeRun:
    output: str  # every node's lines, prefixed with the node (two_nodes.py's output)
    record: dict  # WORKDIR/cluster.json: mode, events with their times, bytes per interface
    seconds: float
    returncode: int
    kill_step: int

    @classmethod
    def launch(cls, workdir, train_args, *, kill_step: int, timeout: float) -> "TwoNodeRun":
        """Run the job: two nodes, node1 killed after optimizer step `kill_step`, a replacement joining, one restart
        allowed (torchrun --max-restarts=1). Its full log goes to WORKDIR/all_nodes.log."""
        from .launch import run

        workdir = Path(workdir)
        cmd = [sys.executable, TWO_NODES, "--workdir", workdir, "--max-restarts", 1, "--kill-node", 1]
        cmd += ["--kill-at-step", kill_step, "--relaunch", "--", *train_args]
        res = run(cmd, timeout=timeout, echo=False, env={"LOGLEVEL": "INFO"})
        (workdir / "all_nodes.log").write_text(res.output)
        return cls.read(workdir, kill_step, seconds=res.seconds, returncode=res.returncode)

    @classmethod
    def read(cls, workdir, kill_step: int, *, seconds=None, returncode: int = 0) -> "TwoNodeRun":
        workdir = Path(workdir)
        record = json.loads((workdir / "cluster.json").read_text())
        output = (workdir / "all_nodes.log").read_text()
        return cls(output, record, record["seconds"] if seconds is None else seconds, returncode, kill_step)

    def train_arg(self, flag: str, default=None):
        """A training argument the job ran with (cluster.json's train_args), as a float where it is a number."""
        args = [str(a) for a in self.record.get("train_args", [])]
        if flag not in args:
            return default
        value = args[args.index(flag) + 1]
        try:
            return float(value)
        except ValueError:
            return value

    @property
    def every(self) -> int:
        """Optimizer steps between two snapshots (--snapshot_every)."""
        return int(self.train_arg("--snapshot_every"))

    @property
    def ddp_timeout(self) -> float:
        """The process group's timeout (--ddp_timeout), seconds."""
        return self.train_arg("--ddp_timeout", 1800.0)

    @property
    def lines(self) -> list[str]:
        return self.output.splitlines()

    @property
    def netns(self) -> bool:
        return self.record.get("mode") == "netns"

    def startup_s(self) -> float:
        """This machine's start-up, from the job's start to the first rank's identity line."""
        t = self.times()
        return t["round1"] - t["start"]

    def record_fields(self, same: "OneMachine") -> dict:
        """What chapter 08's record keeps of the run (records/08_several_nodes.json)."""
        t = self.times()
        return {
            "mode": self.record["mode"],
            "seconds_two_node_run": self.seconds,
            "kill_to_resume_s": t["resumed"] - t["kill"],
            "resumed_from": snapshot_name(self.kill_step, self.every),
            "bit_identical_to_one_machine": same.same == same.tensors,
            "traffic": self.record.get("traffic"),
            "val_accuracy": same.accuracy,
            "weights_l2_moved": same.moved_l2,
        }

    def headline(self, same: "OneMachine") -> str:
        t = self.times()
        return (
            f"2 nodes ({self.record['mode']}): node1 killed after step {self.kill_step}, a replacement joined, resumed "
            f"from {snapshot_name(self.kill_step, self.every)} {t['resumed'] - t['kill']:.0f} s after the kill; final "
            f"weights {'bit-identical to' if same.same == same.tensors else 'differ from'} one machine's, "
            f"{100 * same.accuracy:.0f}% accuracy"
        )

    # ------------------------------------------------------------------------------------------------ the story

    def error(self, node: str = "node0") -> dict | None:
        """A node's first error paragraph, joined into one text, and the cause it quotes (gloo's own words)."""
        lines = [l.split(" | ", 1)[1] for l in self.lines if l.startswith(f"{node} | ")]
        for i, line in enumerate(lines):
            if line.startswith("error:"):
                para = [line]
                for more in lines[i + 1 :]:
                    if not more.startswith("       "):
                        break
                    para.append(more.strip())
                text = " ".join(para)
                m = CAUSE.search(text)
                return {"text": text, "first": para[0], "cause": m.group(1) if m else None}
        return None

    def rendezvous(self) -> dict:
        """Per node, each completed rendezvous round, as its agent logged it: restart_count, master_addr,
        master_port, group_rank."""
        rounds, current = {}, {}
        for line in self.lines:
            m = AGENT.match(line)
            if not m:
                continue
            node, rest = m.group(1), AGENT.sub("", line)
            if "Rendezvous complete" in rest:
                current[node] = {}
                rounds.setdefault(node, []).append(current[node])
            elif node in current and (kv := RDZV_KEY.match(rest)):
                current[node][kv.group(1)] = kv.group(2)
        return rounds

    def story(self) -> str:
        """The run in the lines a learner follows: the cluster's, each node's launcher and the training script's, each
        rendezvous result in one line, node0's error in one line with the cause it quotes, torchrun's restart."""
        out, seen_rounds = [], {}
        rdzv = self.rendezvous()
        for line in self.lines:
            node, _, rest = line.partition(" | ")
            if line.startswith("[cluster]") and "bytes sent" not in line:
                out.append(line)
            elif (m := AGENT.match(line)) and "Rendezvous complete" in line:
                k = seen_rounds[m.group(1)] = seen_rounds.get(m.group(1), -1) + 1
                r = rdzv[m.group(1)][k]
                out.append(
                    f"{m.group(1)} | torchrun: rendezvous round complete: " + " ".join(f"{a}={b}" for a, b in r.items())
                )
            elif AGENT.match(line) and "will restart" in line:
                out.append(f"{node} | torchrun: " + AGENT.sub("", line).strip())
            elif rest.startswith("error:"):  # one line: the library's first clause, then the cause gloo quoted
                e = self.error(node)
                head = re.sub(r":\s*it waited.*$", "", e["first"])
                out.append(f"{node} | {head}: {e['cause'] or '(no cause quoted: see the log)'}")
            elif not AGENT.match(line) and rest.startswith(STORY) and "+ torchrun" not in rest:
                out.append(line)
        return "\n".join(l[:200] for l in out)

    # ------------------------------------------------------------------------------------------- who is who

    def identities(self) -> list[dict]:
        """Every rank's [identity] line, in the order printed (two per rendezvous round)."""
        return [dict(zip(IDENTITY_FIELDS, m.groups())) for m in map(IDENTITY.match, self.lines) if m]

    def identity_table(self) -> str:
        head = f"{'agent':<6} {'RANK':>4} {'LOCAL_RANK':>10} {'host':<6} {'address':<10} {'WORLD':>5} {'node rank':>9} "
        rows = [head + f"{'MASTER_ADDR:PORT':<17} {'attempt':>7}"]
        for d in self.identities():
            rows.append(
                f"{d['node']:<6} {d['rank']:>4} {d['local_rank']:>10} {d['host']:<6} {d['addr']:<10} {d['world']:>5} "
                f"{d['node_rank']:>9} {d['store']:<17} {d['attempt']:>7}"
            )
        return "\n".join(rows)

    def identity_claims(self) -> list[Claim]:
        """The first round's two ranks: RANK across nodes, LOCAL_RANK within one, node rank 0 on node0, one store; in
        namespaces, each on its own host and address on veth0, the store on node0's."""
        ids = self.identities()
        first = sorted(ids[:2], key=lambda d: d["rank"])
        if len(first) < 2:
            return [Claim("both ranks printed who they are", False)]
        store = first[0]["store"]
        claims = [
            Claim(
                "two ranks in one world of 2; RANK 1 has LOCAL_RANK 0: ranks count across nodes, local ranks in one",
                [(d["rank"], d["local_rank"], d["world"]) for d in first] == [("0", "0", "2"), ("1", "0", "2")],
            ),
            Claim(
                "RANK 0 runs on node0 (node rank 0), RANK 1 on node1 (node rank 1)",
                [(d["node"], d["node_rank"]) for d in first] == [("node0", "0"), ("node1", "1")],
            ),
            Claim(f"both ranks build their process group at one store, {store}", first[1]["store"] == store),
        ]
        if self.netns:
            hosts = [(d["host"], d["addr"], d["ifname"]) for d in first]
            claims.append(
                Claim(
                    f"each rank sits on its own host with its own address on veth0, the store on node0's ({store})",
                    hosts == [("node0", "10.77.0.1", "veth0"), ("node1", "10.77.0.2", "veth0")]
                    and store.startswith("10.77.0.1:"),
                )
            )
        return claims

    # -------------------------------------------------------------------------------------------- the rounds

    def rounds_table(self) -> str:
        rows = [f"{'agent':<6} {'round':>5} {'restart_count':>13} {'master_port':>11} {'group_rank':>10}"]
        for node, rounds in sorted(self.rendezvous().items()):
            for i, r in enumerate(rounds, 1):
                rows.append(
                    f"{node:<6} {i:>5} {r.get('restart_count', '?'):>13} {r.get('master_port', '?'):>11} "
                    f"{r.get('group_rank', '?'):>10}"
                )
        return "\n".join(rows)

    def rounds_claims(self) -> list[Claim]:
        """Two rounds on each node; round two's master_port new and shared; restart counts per agent (node0's agent
        restarted its rank: 1; the replacement node1 is a new agent: 0)."""
        r = self.rendezvous()
        n0, n1 = r.get("node0", []), r.get("node1", [])
        rounds = Claim(
            f"each node took part in two rendezvous rounds (node0 {len(n0)}, node1 {len(n1)})", len(n0) == len(n1) == 2
        )
        if not rounds.holds:
            return [rounds]  # the port and the counts are read from both rounds of both nodes
        ports = [x.get("master_port") for x in (n0[0], n0[1], n1[1])]
        counts = [n0[0].get("restart_count"), n0[1].get("restart_count"), n1[1].get("restart_count")]
        return [
            rounds,
            Claim(
                f"round two gave the ranks a new master_port ({ports[0]} -> {ports[1]}), the same on both nodes",
                ports[0] != ports[1] and ports[1] == ports[2],
            ),
            Claim(
                f"restart counts are per agent: node0 counts {counts[1]} after its restart, the replacement node1 "
                f"counts {counts[2]}",
                counts == ["0", "1", "0"],
            ),
        ]

    # -------------------------------------------------------------------------------------------- the bytes

    def node1_allreduces(self, steps: int) -> int:
        """The plan: node1's rank's optimizer steps, each one all-reduce: kill_step before the kill, then from the
        newest snapshot before it (one every self.every steps) to the last of `steps`. Planned, not counted: the rank
        hook kills at its own setting, and whether the run resumed from that snapshot is timeline_claims' check."""
        return self.kill_step + steps - self.kill_step // self.every * self.every

    def traffic_table(self, params: int, steps: int) -> str:
        t = self.record.get("traffic") or {}
        rows = [f"{params:,} parameters -> {params * 4 / 2**20:.1f} MiB of gradients per step and rank"]
        rows += [
            f"{k:<12} sent {v['tx_bytes'] / 2**20:8.1f} MiB   received {v['rx_bytes'] / 2**20:8.1f} MiB"
            for k, v in t.items()
        ]
        plan, snap = self.node1_allreduces(steps), self.kill_step // self.every * self.every
        rows.append(
            f"the plan: node1's rank makes {self.kill_step} + ({steps} - {snap}) = {plan} optimizer steps, "
            f"{self.kill_step} before the kill and {steps - snap} from the snapshot at step {snap}: "
            f"{plan * params * 4 / 2**20:.1f} MiB of gradients expected"
        )
        return "\n".join(rows)

    def traffic_claims(self, params: int, steps: int) -> list[Claim]:
        """node1 sent one copy of the gradients per planned step (node1_allreduces), within -3% / +5%: the headers TCP
        and Ethernet add, the barriers and the weight check came to +1.0% to +2.7% in the recorded runs, and one step
        is 2.4% of the total (a resume from the snapshot before the newest, 3 steps more, fails). node0 at least as
        much (it also broadcasts the weights); loopback next to nothing. No namespaces (loopback fallback): nothing to
        count."""
        t = self.record.get("traffic") or {}
        if not self.netns or "node1/veth0" not in t:
            return []
        expected = self.node1_allreduces(steps) * params * 4
        n1, n0, lo = t["node1/veth0"]["tx_bytes"], t["node0/veth0"]["tx_bytes"], t["node0/lo"]["tx_bytes"]
        return [
            Claim(
                f"node1 sent {n1 / 2**20:.1f} MiB over veth0, {100 * (n1 / max(expected, 1) - 1):+.1f}% from one copy "
                f"of the gradients per planned step ({expected / 2**20:.1f} MiB)",
                0.97 < n1 / max(expected, 1) < 1.05,
            ),
            Claim(
                f"node0 sent {n0 / 2**20:.1f} MiB: at least a copy of the gradients per step too",
                expected > 0 and n0 > 0.97 * expected,
            ),
            Claim("loopback carried next to nothing: the ranks really talked over veth0", lo < 0.01 * n0),
        ]

    # ---------------------------------------------------------------------------------------- the timeline

    def times(self) -> dict:
        """When each thing happened (seconds from the start, two_nodes.py's stamps): the kill, node0's error, the
        replacement's start, round two's identities, the resume, the end."""
        ev = self.record.get("events", [])

        def first(name):
            return next((e["t"] for e in ev if e["event"] == name), None)

        def last(prefix):
            return next((e["t"] for e in reversed(ev) if e["event"].startswith(prefix)), None)

        ids = [e["t"] for e in ev if e["event"] == "node0 identity"]
        return {
            "start": first("node0 started"),
            "round1": ids[0] if ids else None,
            "fresh": first("node0 started fresh"),
            "kill": first("node1 killed"),
            "error": first("node0 error"),
            "replacement": last("node1 started (launch"),
            "round2": ids[-1] if len(ids) > 1 else None,
            "resumed": first("node0 resumed"),
            "end": last("node0 exited"),
        }

    def timeline_table(self) -> str:
        t = self.times()
        names = {
            "round1": "both ranks start (round 1)",
            "fresh": "rank 0 found no snapshot: training starts",
            "kill": f"node1 killed after step {self.kill_step}",
            "error": "node0's rank fails in its all-reduce",
            "replacement": "a replacement node1 starts",
            "round2": "both ranks start again (round 2)",
            "resumed": "rank 0 loaded the snapshot",
            "end": "both nodes exit",
        }
        return "\n".join(f"{t[k]:7.1f} s  {v}" for k, v in names.items() if t.get(k) is not None)

    def timeline_claims(self) -> list[Claim]:
        """node0's rank failed because the connection dropped, within a few seconds of the kill (not after
        --ddp_timeout); the restarted run resumed from the newest snapshot before the kill; both nodes exited 0 with
        identical weights. That node1 died after kill_step is the hook's own setting, printed in the timeline, not
        claimed: the timeline and the resume from the newest snapshot before it are the evidence."""
        t, out = self.times(), self.output
        e = self.error("node0")
        snap, ddp_timeout = snapshot_name(self.kill_step, self.every), self.ddp_timeout
        waited = None if t["error"] is None or t["kill"] is None else t["error"] - t["kill"]
        dropped = bool(e and e["cause"] and any(d in e["cause"] for d in DROPPED))
        cause = e["cause"] if e and e["cause"] else "no cause quoted"
        return [
            Claim(
                f"node0's rank failed {waited if waited is not None else float('nan'):.1f} s after the kill, in its "
                f"next all-reduce, because the connection dropped ({cause}), not after the {ddp_timeout:g} s timeout",
                dropped and waited is not None and 0 <= waited < min(5.0, ddp_timeout / 2),
            ),
            Claim(
                f"the restarted run resumed from {snap}, the newest snapshot before the kill, on shared storage",
                any(l.startswith("node0 |") and "resumed from" in l and snap in l for l in self.lines),
            ),
            Claim(
                "the run finished: both nodes exited 0, the ranks ended with identical weights",
                self.returncode == 0
                and self.record.get("exit_code") == 0
                and "parameters identical on all 2 ranks: True" in out,
            ),
        ]


def can_make_nodes() -> tuple[bool, bool, str]:
    """(Linux, network namespaces usable, one line saying so): without namespaces the two agents run on loopback."""
    if not sys.platform.startswith("linux"):
        return (
            False,
            False,
            (
                f"SKIPPED: this chapter needs Linux ({sys.platform} here): its nodes are Linux network namespaces. "
                "Read it, or run it on Linux (Kaggle, Colab, WSL)."
            ),
        )
    sys.path.insert(0, str(TWO_NODES.parent))
    from two_nodes import namespaces_usable

    ok, why = namespaces_usable()
    if ok:
        return (
            True,
            True,
            f"network namespaces: yes ({why}): node0 and node1 get their own network stacks, joined by veth0",
        )
    return (
        True,
        False,
        (
            f"network namespaces: no ({why}). FALLBACK: the two agents run on loopback (127.0.0.1); the rendezvous, "
            "the ranks and the node that dies are the same, but no real network is crossed"
        ),
    )


def snapshot_name(kill_step: int, every: int) -> str:
    """The newest snapshot written before the kill: one every `every` optimizer steps, named by its batch."""
    return f"snap_e001_b{kill_step // every * every:06d}.pt"


def plot_timeline(run: TwoNodeRun, save_to=None):
    """Who was doing what, second by second: each node's rank training, dead, starting (agent and rendezvous),
    loading (imports, data, the snapshot) or waiting at the rendezvous, with the kill, node0's error and the resume
    marked. Training starts when rank 0 says it found no snapshot (round 1) or loaded one (round 2); rank 1 cannot
    step before it, since every step's all-reduce waits for both. A log without those lines draws loading as
    training."""
    from .plots import _pyplot

    plt = _pyplot()
    t = run.times()
    fig, ax = plt.subplots(figsize=(10, 2.6))
    lanes = {"node0": 1, "node1": 0}
    go1 = t["fresh"] if t["fresh"] is not None and t["round1"] is not None and t["fresh"] > t["round1"] else t["round1"]
    go2 = t["resumed"] if t["resumed"] is not None and t["round2"] is not None else t["round2"]
    spans = [
        ("node0", t["start"], t["round1"], "tab:gray", "starting (agent, rendezvous)"),
        ("node0", t["round1"], go1, "tan", "loading (imports, data, snapshot)"),
        ("node0", go1, t["error"], "tab:blue", "training"),
        ("node0", t["error"], t["round2"], "tab:orange", "waiting at the rendezvous"),
        ("node0", t["round2"], go2, "tan", None),
        ("node0", go2, t["end"], "tab:blue", None),
        ("node1", t["start"], t["round1"], "tab:gray", None),
        ("node1", t["round1"], go1, "tan", None),
        ("node1", go1, t["kill"], "tab:blue", None),
        ("node1", t["kill"], t["replacement"], "black", "gone"),
        ("node1", t["replacement"], t["round2"], "tab:gray", None),
        ("node1", t["round2"], go2, "tan", None),
        ("node1", go2, t["end"], "tab:blue", None),
    ]
    for node, a, b, color, label in spans:
        if a is not None and b is not None and b > a:
            ax.barh(lanes[node], b - a, left=a, height=0.5, color=color, label=label)
    for key, text in (("kill", "node1 killed"), ("resumed", "resumed from the snapshot")):
        if t.get(key) is not None:
            ax.axvline(t[key], color="tab:red" if key == "kill" else "tab:green", ls="--", lw=1)
            ax.text(t[key], 1.45, f" {text} ({t[key]:.1f} s)", fontsize=8, va="bottom")
    ax.set_yticks([0, 1], ["node1", "node0"])
    ax.set_ylim(-0.5, 1.9)
    ax.set_xlabel("seconds since the job started")
    ax.legend(loc="lower right", fontsize=7, ncol=5)
    ax.set_title(f"2 nodes: node1 killed after step {run.kill_step}, a replacement joins, the run resumes")
    return finish(fig, save_to)
