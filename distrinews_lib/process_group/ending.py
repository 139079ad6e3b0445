"""Ending a process that joined a process group, without the interpreter's teardown (end_process says why)."""

from __future__ import annotations

import atexit
import gc
import logging
import os
import sys
import traceback
from typing import Callable, NoReturn

import torch.distributed as dist

from ..errors import exit_code_of
from .ranks import is_initialized


def end_process(code: int = 0) -> NoReturn:
    """End a process that joined a process group, without the interpreter's teardown.

    Why: gloo's worker threads can still hold finished async work (and its tensors) when Python finalizes; releasing
    them then takes the GIL during teardown and the process aborts ("terminate called without an active exception",
    exit -6) after all its work is done: 1 run in 15 of a bare torch DDP loop (scripts/repro_exit_abort.py measures
    it). An upstream fix (destroying groups at exit) was abandoned, so a finished rank leaves here instead:
    1. unreachable objects are collected (finished work handles and their tensors are dropped while the
       interpreter is whole), and the process group is destroyed if the script has not done it;
    2. Python's exit handlers run (trackers, logging: what a normal exit would flush) and stdout/stderr are flushed;
    3. os._exit(code): no interpreter teardown, no C++ static destructors to race gloo's threads.
    The code is the script's own: a failed rank still exits non-zero, after its message."""
    try:
        gc.collect()
        if is_initialized():
            dist.destroy_process_group()
        gc.collect()
    except Exception as err:  # noqa: BLE001  (tearing down after a failure may fail too; the exit code stands)
        sys.stderr.write(f"[rank {os.environ.get('RANK', 0)}] process group teardown: {err}\n")
        code = code or 1
    try:
        atexit._run_exitfuncs()
        logging.shutdown()
    except Exception:  # noqa: BLE001
        traceback.print_exc()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def run_and_end(main: Callable[[], object]) -> NoReturn:
    """main(), then end_process with main's exit code (errors.exit_code_of: a return value or sys.exit(...) as
    usual, 1 after an uncaught exception, whose traceback is printed first, as Python would)."""
    end_process(exit_code_of(main))
