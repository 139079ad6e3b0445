"""A rank that only writes down its PID and then sleeps: for the tests that kill a launch halfway.

(`--library`, which the tests pass to some launches, changes nothing any more: every rank that course.launch starts
runs through course/harden.py, which ties it to its torchrun agent.)"""

import os
import sys
import time
from pathlib import Path

folder = Path(sys.argv[1])
folder.mkdir(parents=True, exist_ok=True)
(folder / f"rank{os.environ.get('RANK', 0)}.pid").write_text(str(os.getpid()))
time.sleep(120)
