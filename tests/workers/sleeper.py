"""A rank that only writes down its PID and then sleeps: for the tests that kill a launch halfway."""
import os
import sys
import time
from pathlib import Path

if sys.argv[2:3] == ["--library"]:  # a rank that uses distrinews_lib's init (dies with its torchrun agent)
    from distrinews_lib.distributed import ensure_torchrun_env

    ensure_torchrun_env()
folder = Path(sys.argv[1])
folder.mkdir(parents=True, exist_ok=True)
(folder / f"rank{os.environ.get('RANK', 0)}.pid").write_text(str(os.getpid()))
time.sleep(120)
