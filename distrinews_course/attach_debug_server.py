"""Start torch's debug server in a script that does not start it itself, without editing the script.

    torchrun --nproc_per_node=2 -m distrinews_course.attach_debug_server --port 25999 SCRIPT ARGS...
    torchrun ... -m distrinews_course.attach_debug_server --port 25999 -m distrinews_lib.hang_doctor --after 3 SCRIPT

A script you can edit needs one line after init_process_group:
    torch.distributed.debug.start_debug_server(port=25999)
This wrapper makes that call for it: init_process_group, once it returns, starts the server on every rank (each rank
serves its own stacks and Flight Recorder entries on a port of its own; rank 0 also serves the page that gathers every
rank's, on --port), and prints `RESULT rank=R pid=P debug_port=PORT` so that a notebook can find each rank's process.
The server needs Jinja2, aiohttp and tabulate (requirements.txt).
"""

from __future__ import annotations

import argparse
import os
import sys

from distrinews_lib.hang_doctor.wrapping import run_target, split_target, target_problem

FETCH_S = 2.0  # how long the page waits for each rank: a rank that does not answer by then is shown as such


def import_torch_debug():
    """torch.distributed.debug, imported so that this process can still exit cleanly. Its import registers a Python
    function (the torch_profile handler) in a C++ registry whose destructor runs after the interpreter has finalized;
    where that registry holds the last reference (pytest, a notebook kernel) it frees the function without the GIL and
    the process aborts at exit ("PyThreadState_Get: ... the GIL is released", exit code 134). One reference more,
    never dropped, keeps the function alive past that destructor; a torch without the module raises ImportError."""
    import ctypes

    import torch.distributed.debug as debug
    from torch.distributed.debug import _handlers

    for fn in vars(_handlers).values():
        if callable(fn) and getattr(fn, "__module__", None) == _handlers.__name__ and not hasattr(fn, "_pinned"):
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(fn))
            fn._pinned = True
    return debug


def attach(port: int, fetch_timeout: float = FETCH_S) -> None:
    import torch.distributed as dist

    original = dist.init_process_group

    def init_then_serve(*args, **kwargs):
        original(*args, **kwargs)
        import_torch_debug().start_debug_server(port=port, fetch_timeout=fetch_timeout)
        sys.stdout.write(f"RESULT rank={dist.get_rank()} pid={os.getpid()} debug_port={port}\n")
        sys.stdout.flush()

    dist.init_process_group = init_then_serve


def main(argv: list) -> None:
    p = argparse.ArgumentParser(prog="python -m distrinews_course.attach_debug_server")
    p.add_argument("--port", type=int, required=True, help="the port of the page that gathers every rank's state")
    p.add_argument("--fetch_timeout", type=float, default=FETCH_S)
    own, target = split_target(argv, ("--port", "--fetch_timeout"))
    args = p.parse_args(own)
    if target_problem(target):
        p.error(target_problem(target))
    attach(args.port, args.fetch_timeout)
    run_target(target)


if __name__ == "__main__":
    main(sys.argv[1:])
