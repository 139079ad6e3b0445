"""Rank 0 writes many lines when torchrun stops it with SIGTERM, after rank 1 failed: the lines a rank writes as it
is being stopped (the hang doctor's paragraph) must reach the launcher, whatever else torchrun's signal reaches."""

import os
import signal
import sys
import time
from pathlib import Path

LINES = 4000  # ~80 KB, more than a pipe holds: the tee in front of the launcher's pipe must still be reading

folder = Path(sys.argv[1])
if os.environ["RANK"] == "1":
    while not (folder / "armed").exists():  # fail only once rank 0 listens for torchrun's signal
        time.sleep(0.05)
    sys.exit(1)


def last_words(*_):
    for i in range(LINES):
        print(f"last word {i} of rank 0", flush=True)
    os._exit(0)


signal.signal(signal.SIGTERM, last_words)
(folder / "armed").write_text("")
while True:
    time.sleep(0.1)
