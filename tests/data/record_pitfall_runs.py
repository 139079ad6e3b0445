"""Record tests/data/pitfall_runs.json: chapter 04's runs on 2 gloo ranks, launched as the chapter launches them
(one shared launch for the runs that finish, one launch each for the four that must fail), with every JSON and
output they produced. tests/test_pitfall_symptoms.py reads it.

    flock /tmp/heavy.lock .venv/bin/python tests/data/record_pitfall_runs.py
"""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from distrinews_course.demo import FailingRuns, SharedLaunch, failing_limit, pitfall_failing, pitfall_finishing  # noqa: E402

HANG_TIMEOUT_S, NPROC = 3, 2


def main() -> None:
    pitfalls, out = ROOT / "scripts" / "pitfalls", ROOT / "outputs" / "pitfalls"  # where the scripts write
    finished = SharedLaunch([(pitfalls / s, a, o) for s, a, o in pitfall_finishing(out)], NPROC, 600)
    finishing = {}
    for script, _, _ in pitfall_finishing(out):
        output, r = finished(script, echo=False)
        finishing[script] = {"json": r, "output": output}
    limit = failing_limit(finished.startup_s, len(pitfall_failing(HANG_TIMEOUT_S)), HANG_TIMEOUT_S)
    failing = FailingRuns(pitfalls, pitfall_failing(HANG_TIMEOUT_S), NPROC, limit)
    failed = {}
    for script, args in pitfall_failing(HANG_TIMEOUT_S):
        res = failing(script, *args)
        failed[script] = {k: getattr(res, k) for k in ("returncode", "output", "seconds", "timed_out")}
    record = {"nproc": NPROC, "hang_timeout_s": HANG_TIMEOUT_S, "limit_s": limit}
    record |= {"finishing": finishing, "failing": failed}
    path = ROOT / "tests" / "data" / "pitfall_runs.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {path.relative_to(ROOT)}: {len(finishing)} finishing, {len(failed)} failing runs")


if __name__ == "__main__":
    main()
