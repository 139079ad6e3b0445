"""Run a script (or `-m module`) as __main__ and, when its process exits, write which modules of the project it had
imported: $DISTRINEWS_IMPORTS_OUT/rank<RANK>.json, {module: its file}. This file imports nothing of the project, so
what the record holds is the script's own (and, under course.launch's torchrun, its rank wrapper's: harden.py).

    python tests/workers/imports_at_exit.py scripts/train_single.py ARGS...
    python tests/workers/imports_at_exit.py -m distrinews_lib.serving ARGS...
"""

import atexit
import json
import os
import runpy
import sys
from pathlib import Path

PACKAGES = ("distrinews_lib", "distrinews_course")


def record() -> None:
    found = {
        name: getattr(module, "__file__", None)
        for name, module in list(sys.modules.items())
        if name.split(".")[0] in PACKAGES and getattr(module, "__file__", None)
    }
    out = Path(os.environ["DISTRINEWS_IMPORTS_OUT"]) / f"rank{os.environ.get('RANK', 0)}.json"
    out.write_text(json.dumps(found, indent=1, sort_keys=True))


# An exit handler: a normal exit runs it, and so does distributed.end_process (train_ddp.py's os._exit path).
atexit.register(record)
if sys.argv[1] == "-m":
    sys.argv = sys.argv[2:]
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
else:
    sys.argv = sys.argv[1:]
    sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[0])))  # as `python SCRIPT` would
    runpy.run_path(sys.argv[0], run_name="__main__")
