"""Run a training script under torchrun with a different environment per rank, to imitate several nodes.

    torchrun --nproc_per_node=2 tests/workers/per_rank_env.py SCRIPT ARGS...
    PER_RANK_ENV='{"1": {"DISTRINEWS_DATA_DIR": "/elsewhere", "cwd": "/node1"}}'

For this process's RANK, every key is set as an environment variable (a value of null unsets it),
except "cwd", which changes the working directory (a node with its own local disk). Then the
script runs unchanged, as __main__.
"""

import json
import os
import runpy
import sys

script = os.path.abspath(sys.argv[1])  # before any chdir below
settings = json.loads(os.environ.get("PER_RANK_ENV", "{}")).get(os.environ.get("RANK", "0"), {})
for key, value in settings.items():
    if key == "cwd":
        os.makedirs(value, exist_ok=True)
        os.chdir(value)
    elif value is None:
        os.environ.pop(key, None)
    else:
        os.environ[key] = str(value)
sys.argv = [script, *sys.argv[2:]]
runpy.run_path(script, run_name="__main__")
