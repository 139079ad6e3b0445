#!/usr/bin/env python
"""Run the whole DistriNews course (or some chapters) in batch, with papermill, and summarise it.

    python scripts/run_course.py                       # every notebook in notebooks/, in order
    python scripts/run_course.py --only 02             # one chapter (its number or its file name)
    python scripts/run_course.py --only 01,02 --preset cpu_smoke
    python scripts/run_course.py --data-dir ../shared/data/ag_news --offline   # a machine without internet
    python scripts/run_course.py --html                # and render the executed chapters as a site
    python scripts/run_course.py --html-only runs/20260101-120000                 # the site of an earlier run

Each notebook runs with PRESET (and NPROC) injected into its `parameters` cell; the executed copies go
to runs/<timestamp>/ (git-ignored). One line per notebook as it starts and ends, papermill's progress
bar in between. The first failure stops the run: the runner names the notebook, the failing cell
(its index and first line) and the error, and exits 1. At the end a table gives each notebook's
status, time and key figures, read from the small JSON record each chapter writes into
$DISTRINEWS_COURSE_RECORDS (set here to runs/<timestamp>/records/). summary.json holds the same table, and the
machine it ran on. With --html the executed chapters become a static site that works offline,
runs/<timestamp>/site/index.html: that table with a link to each chapter's page (distrinews_course.site).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from distrinews_lib.machine import git_commit, machine_info, versions
from distrinews_lib.training.config import PRESETS

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class NotebookRun:
    name: str
    status: str = "not run"  # ok | FAILED | not run
    seconds: float | None = None
    headline: str = ""
    record: dict = field(default_factory=dict)
    output: str | None = None
    error: str | None = None


def course_notebooks(folder: Path) -> list[Path]:
    """The chapters: NN_*.ipynb in number order (checkpoint copies and scratch notebooks left out)."""
    return sorted(
        p for p in Path(folder).glob("*.ipynb") if p.name[:2].isdigit() and not p.name.endswith("-checkpoint.ipynb")
    )


def select(notebooks: list[Path], only: str | None) -> list[Path]:
    """--only '02' or '01,02' or '02_ddp_training' (number prefixes or names, with or without .ipynb)."""
    if not only:
        return notebooks
    chosen = []
    for token in (t.strip() for t in only.split(",")):
        if not token:
            continue
        token = token.removesuffix(".ipynb")
        matches = [p for p in notebooks if p.stem == token or p.stem.split("_", 1)[0] == token.zfill(2)]
        if not matches:
            raise SystemExit(
                f"--only {token}: no such notebook. Choose from: "
                + ", ".join(p.stem.split("_", 1)[0] for p in notebooks)
                + f" (in {_rel(notebooks[0].parent) if notebooks else '?'})"
            )
        chosen += [m for m in matches if m not in chosen]
    return sorted(chosen)


def _rel(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def failing_cell(err, source_nb: Path) -> tuple[int | None, str]:
    """(index of the failing cell in the SOURCE notebook, its first line). Papermill's own index counts
    the cells it added (injected parameters, an error banner), so find the cell by its source text."""
    import nbformat

    source = getattr(err, "source", None)
    lines = (source or "").strip().splitlines()
    first_line = lines[0] if lines else ""
    index = getattr(err, "cell_index", None)
    if source is not None:
        try:
            cells = nbformat.read(str(source_nb), as_version=4).cells
            hits = [i for i, c in enumerate(cells) if c.cell_type == "code" and c.source == source]
            if hits:
                return min(hits, key=lambda i: abs(i - (index or 0))), first_line
        except Exception:  # papermill's index is still better than nothing
            pass
    return index, first_line


def describe_error(err) -> str:
    """The exception's name and message; for a LaunchError that includes the script's last lines."""
    ename = getattr(err, "ename", None) or type(err).__name__
    evalue = getattr(err, "evalue", None) or str(err)
    lines = str(evalue).rstrip().splitlines()
    if len(lines) > 45:
        lines = lines[:5] + [f"... ({len(lines) - 45} lines) ..."] + lines[-40:]
    return f"{ename}: " + "\n".join(lines)


def read_record(records: Path, nb: Path, started: float) -> dict:
    """The record the chapter wrote during this run (None of a previous run's)."""
    path = records / f"{nb.stem}.json"
    try:
        if path.stat().st_mtime >= started - 1:
            return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        pass
    return {}


def headline_of(record: dict) -> str:
    if record.get("headline"):
        return str(record["headline"])
    parts = []
    for key, value in record.items():
        if isinstance(value, float):
            parts.append(f"{key} {100 * value:.1f}%" if "accuracy" in key else f"{key} {value:.3g}")
    return ", ".join(parts[:4])


def print_summary(results: list[NotebookRun], run_dir: Path, total: float, stream=sys.stdout) -> None:
    width = max([len(r.name) for r in results] + [8])
    print(f"\n{'=' * 30} course summary {'=' * 30}", file=stream)
    print(f"{'notebook':<{width}}  {'status':<7}  {'seconds':>7}  key figures", file=stream)
    for r in results:
        secs = f"{r.seconds:7.1f}" if r.seconds is not None else f"{'-':>7}"
        print(f"{r.name:<{width}}  {r.status:<7}  {secs}  {r.headline}", file=stream)
    n_ok = sum(r.status == "ok" for r in results)
    print(f"{n_ok}/{len(results)} notebooks ran in {total:.1f} s; executed copies in {_rel(run_dir)}/", file=stream)


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--preset",
        default="auto",
        choices=("auto", *PRESETS),
        help="PRESET parameter for every notebook (default auto)",
    )
    p.add_argument("--nproc", default="auto", help="NPROC parameter: DDP processes (default auto: every GPU, else 2)")
    p.add_argument("--only", default=None, help="run only these chapters, e.g. 02 or 01,02")
    p.add_argument(
        "--notebooks-dir", type=Path, default=ROOT / "notebooks", help="where the chapters are (default notebooks/)"
    )
    p.add_argument("--runs-dir", type=Path, default=ROOT / "runs", help="executed copies go to RUNS_DIR/<timestamp>/")
    p.add_argument(
        "--data-dir", default=None, help="offline AG News folder (sets DISTRINEWS_DATA_DIR for the notebooks)"
    )
    p.add_argument("--offline", action="store_true", help="never try the Hugging Face hub (HF_HUB_OFFLINE=1)")
    p.add_argument("--kernel", default="python3", help="Jupyter kernel name (default python3)")
    p.add_argument(
        "--cell-timeout",
        type=float,
        default=None,
        help="seconds one cell may run (default: none; the chapters time their own launches)",
    )
    p.add_argument("--solutions", action="store_true", help="also run the exercises' solution cells (SOLUTIONS=True)")
    p.add_argument("--log-output", action="store_true", help="also stream every cell's output to this terminal")
    p.add_argument("--no-progress", action="store_true", help="no papermill progress bar")
    p.add_argument(
        "--html", action="store_true", help="also render the executed chapters as a site: RUN/site/index.html"
    )
    p.add_argument(
        "--html-only",
        type=Path,
        default=None,
        metavar="RUN_DIR",
        help="run nothing: render the site of an earlier run folder (runs/<timestamp>/)",
    )
    return p.parse_args(argv)


def prepare_environment(args, records: Path) -> list[str]:
    """Environment for the notebook kernels (papermill starts them with this process's environment)."""
    notes = []
    os.environ["DISTRINEWS_COURSE_RECORDS"] = str(records)
    if args.data_dir:
        data_dir = Path(args.data_dir).expanduser().resolve()
        if not data_dir.is_dir():
            raise SystemExit(f"--data-dir {args.data_dir}: not a folder")
        os.environ["DISTRINEWS_DATA_DIR"] = str(data_dir)
        notes.append(f"data: {data_dir}")
    if args.offline:
        os.environ.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
        notes.append("offline: the Hugging Face hub is not tried")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if "OMP_WAIT_POLICY" not in os.environ and not _has_cuda():
        # On a CPU that other programs also use, OpenMP threads that spin while waiting steal the cores
        # from each other: a 2-thread training process ran 7x slower next to one other busy process.
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
        notes.append("CPU only: OMP_WAIT_POLICY=PASSIVE (threads sleep instead of spinning while they wait)")
    return notes


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


# The kernel logs to this terminal, not to the notebook: at CRITICAL only, or every chapter would print ipykernel's
# warning that its local TCP sockets are unencrypted (papermill's kernel listens on 127.0.0.1 only), and a busy
# machine's shutdown after a failed cell "[IPKernelApp] ERROR | KeyboardInterrupt caught in kernel" (the kernel
# interrupted as it stops). A cell's own error reaches the summary through papermill, whatever this level.
KERNEL_ARGUMENTS = ["--IPKernelApp.log_level=CRITICAL"]


def run_one(nb: Path, out: Path, args) -> None:
    import papermill as pm

    pm.execute_notebook(
        str(nb),
        str(out),
        parameters={"PRESET": args.preset, "NPROC": args.nproc, "SOLUTIONS": args.solutions},
        kernel_name=args.kernel,
        cwd=str(nb.parent),
        progress_bar=not args.no_progress,
        log_output=args.log_output,
        execution_timeout=args.cell_timeout,
        request_save_on_cell_execute=True,
        extra_arguments=KERNEL_ARGUMENTS,
    )


def the_machine() -> dict:
    """What the site says the course ran on: the machine, the versions of what it used, the code's commit."""
    return {**machine_info(), **versions(), "git_commit": git_commit()}


def render_html(run_dir: Path) -> Path | None:
    """The site of a run folder; None (and the reason on stderr) when it cannot be rendered."""
    from distrinews_course.site import render_site  # deferred on purpose: nbconvert only for --html

    try:
        index = render_site(run_dir)
    except Exception as err:  # a folder that is no run, or nbconvert's own error: say which, not a traceback
        print(f"site not rendered: {type(err).__name__}: {err}", file=sys.stderr)
        return None
    print(f"site: {_rel(index)} (open it in a browser; it works offline)")
    return index


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.html_only:
        return 0 if render_html(args.html_only.resolve()) else 2
    folder = args.notebooks_dir.resolve()
    notebooks = select(course_notebooks(folder), args.only)
    if not notebooks:
        print(f"no notebooks (NN_*.ipynb) in {folder}", file=sys.stderr)
        return 2
    run_dir = args.runs_dir.resolve() / time.strftime("%Y%m%d-%H%M%S")
    suffix = 1
    while run_dir.exists():
        run_dir = run_dir.with_name(run_dir.name.split("+")[0] + f"+{suffix}")
        suffix += 1
    records = run_dir / "records"
    records.mkdir(parents=True)
    notes = prepare_environment(args, records)
    machine = the_machine()
    started_at = time.strftime("%Y-%m-%d %H:%M:%S %Z")

    print(
        f"DistriNews course: {len(notebooks)} notebook(s) from {_rel(folder)}, preset {args.preset}, nproc {args.nproc}"
    )
    for note in notes:
        print(f"  {note}")
    print(f"  executed copies: {_rel(run_dir)}/", flush=True)

    results = [NotebookRun(nb.stem) for nb in notebooks]
    start_all = time.time()
    failed = None
    for i, (nb, res) in enumerate(zip(notebooks, results), 1):
        out = run_dir / nb.name
        res.output = str(out)
        print(f"\n[{i}/{len(notebooks)}] {nb.name} started", flush=True)
        started = time.time()
        try:
            run_one(nb, out, args)
        except BaseException as err:  # papermill's execution error, a dead kernel, Ctrl-C...
            res.seconds = time.time() - started
            res.status = "FAILED"
            index, first = failing_cell(err, nb)
            where = (
                f"cell {index}" + (f" (`{first[:100]}`)" if first else "")
                if index is not None
                else "before any cell ran"
            )
            res.error = f"{nb.name} failed at {where}\n{describe_error(err)}"
            res.headline = f"failed at {where.split(' (')[0]}: {getattr(err, 'ename', None) or type(err).__name__}"
            print(f"[{i}/{len(notebooks)}] {nb.name} FAILED after {res.seconds:.1f} s", flush=True)
            print(f"\nFAILED: {res.error}\n(full output: {_rel(out)})", file=sys.stderr, flush=True)
            failed = err
            break
        res.seconds = time.time() - started
        res.status = "ok"
        res.record = read_record(records, nb, started)
        res.headline = headline_of(res.record)
        print(
            f"[{i}/{len(notebooks)}] {nb.name} ok in {res.seconds:.1f} s"
            + (f": {res.headline}" if res.headline else ""),
            flush=True,
        )

    total = time.time() - start_all
    (run_dir / "summary.json").write_text(
        json.dumps(
            {
                "preset": args.preset,
                "nproc": args.nproc,
                "seconds": round(total, 1),
                "started": started_at,
                "machine": machine,
                "notebooks": [asdict(r) for r in results],
            },
            indent=2,
            default=str,
        )
    )
    print_summary(results, run_dir, total)
    # A failed run's site too: the failing chapter's page shows the error where it happened.
    site_missing = args.html and render_html(run_dir) is None
    if isinstance(failed, KeyboardInterrupt):
        return 130
    return 1 if failed or site_missing else 0


if __name__ == "__main__":
    sys.exit(main())
