"""node.py's preflight: before this node's torchrun can say anything, reach the rendezvous endpoint (naming what
failed if it cannot: refused, timed out, no route), publish this node's settings in the rendezvous store and
compare them with the other nodes' (a different --nnodes stops this node with both values named)."""

from __future__ import annotations

import json
import os
import socket
import threading
import time


class Refused(Exception):
    """A setup mistake, explained in one paragraph."""


class Preflight(threading.Thread):
    """Reach the rendezvous endpoint, publish this node's settings there, and compare them with the other nodes'."""

    def __init__(self, a, master_ip: str, local: str, on_refused):
        super().__init__(daemon=True)
        self.a, self.master_ip, self.local, self.on_refused = a, master_ip, local, on_refused
        self.stop = threading.Event()
        self.reached = threading.Event()
        self.nodes: dict[int, dict] = {}
        self.error: str | None = None
        self.expected = int(a.nnodes.split(":")[-1])  # the most nodes this run can have

    def _probe(self) -> None:
        a, deadline, last = self.a, time.monotonic() + self.a.connect_timeout, None
        while not self.stop.is_set():
            try:
                socket.create_connection((self.master_ip, a.master_port), timeout=2).close()
                return
            except ConnectionRefusedError:
                last = "refused"
            except (socket.timeout, TimeoutError):
                last = "timeout"
            except OSError as err:
                last = err.strerror or str(err)
            if time.monotonic() > deadline and self.a.node_rank != 0:  # node 0 waits for its own torchrun to listen
                where = f"MASTER_ADDR:MASTER_PORT = {a.master_addr}:{a.master_port} ({self.master_ip})"
                if last == "refused":
                    why = (
                        "the connection was refused: that machine answers, but nothing listens on that port. "
                        "Check MASTER_PORT (the same on every node) and that node rank 0 is running."
                    )
                elif last == "timeout":
                    why = (
                        "no machine answered (timed out): check MASTER_ADDR, it must be node rank 0's address on the "
                        "network the nodes share, and that no firewall drops the port."
                    )
                elif last in ("No route to host", "Network is unreachable"):
                    why = (
                        f"{last.lower()} (no machine has that address on this network): check MASTER_ADDR, it must be "
                        "node rank 0's address on the network the nodes share."
                    )
                else:
                    why = f"{last}: check MASTER_ADDR and the network between the nodes."
                raise Refused(
                    f"could not reach the rendezvous at {where} from this node ({self.local}) within "
                    f"{a.connect_timeout} s: {why}"
                )
            time.sleep(0.5)

    def run(self) -> None:
        try:
            self._probe()
            if self.stop.is_set():
                return
            self.reached.set()
            from datetime import timedelta

            os.environ.setdefault(
                "TORCH_CPP_LOG_LEVEL", "ERROR"
            )  # this process only: no C++ warning when the store goes away
            from torch.distributed import TCPStore

            store = TCPStore(
                self.master_ip, self.a.master_port, is_master=False, timeout=timedelta(seconds=self.a.connect_timeout)
            )
            prefix = f"distrinews/preflight/{self.a.rdzv_id}"
            me = {"host": socket.gethostname(), "addr": self.local, "nnodes": self.a.nnodes, "nproc": self.a.nproc}
            index = store.add(f"{prefix}/arrived", 1) - 1
            store.set(f"{prefix}/node{index}", json.dumps(me))
            while not self.stop.is_set():
                count = store.add(f"{prefix}/arrived", 0)
                for i in range(count):
                    if i not in self.nodes and store.check([f"{prefix}/node{i}"]):
                        self.nodes[i] = json.loads(store.get(f"{prefix}/node{i}"))
                odd = [n for n in self.nodes.values() if n["nnodes"] != me["nnodes"]]
                if odd:
                    # Every node that has arrived must read the entries too before this node's store may go:
                    # each one that judged the mismatch says so; wait for all of them (hard bound: connect timeout).
                    # The verdict stands even if the store goes meanwhile: node 0 stops its torchrun (the store's
                    # host) as soon as it has counted every node's verdict, maybe before this node's next look.
                    try:
                        store.add(f"{prefix}/judged", 1)
                        until = time.monotonic() + self.a.connect_timeout
                        while store.add(f"{prefix}/judged", 0) < count and time.monotonic() < until:
                            self.stop.wait(0.1)
                    except Exception:
                        pass
                    raise Refused(
                        f"the nodes disagree on --nnodes: this node ({me['host']}, {me['addr']}) has "
                        f"--nnodes={me['nnodes']}, node {odd[0]['host']} ({odd[0]['addr']}) has "
                        f"--nnodes={odd[0]['nnodes']}. Every node must pass the same --nnodes (and "
                        "--rdzv_id and endpoint); "
                        "torchrun would otherwise wait or build a smaller world than asked for."
                    )
                if count >= self.expected and len(self.nodes) >= self.expected:
                    return  # every node has arrived and agrees
                self.stop.wait(1.0)
        except Refused as err:
            self.error = str(err)
            self.on_refused()
        except Exception:  # the store went away (node 0 finished or died): nothing more to compare
            pass

    def arrived(self) -> str:
        return ", ".join(f"{n['host']} ({n['addr']})" for _, n in sorted(self.nodes.items())) or "none seen"
