"""The generated blocks of the README and docs/, each made from the notebooks, the tree or the records under
benchmarks/ (and citing the records it quotes, so that figures.py can trace every figure)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from .. import ROOT
from . import chapters as ch
from . import layout

BENCH = ROOT / "benchmarks"
DOCS = ROOT / "docs"
NOT_MEASURED = "–"


def _rel(path: Path) -> str:
    path = path.resolve()
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else f"benchmarks/{path.name}"


def _load(name: str) -> dict:
    return json.loads((BENCH / name).read_text())


def num(v: float, decimals: int = 0) -> str:
    return f"{v:,.{decimals}f}"


def cite(paths, prefix: str = "") -> str:
    """'Records: [benchmarks/x.json](prefix + benchmarks/x.json), ...': the records a block quotes."""
    links = [f"[{p}]({prefix}{p})" for p in paths]
    return "Records: " + ", ".join(links) + "." if links else ""


# --------------------------------------------------------------------------- chapters


def _minutes(t: ch.Timing | None) -> str:
    if t is None:
        return NOT_MEASURED
    return f"{t.seconds / 60:.1f} min" + ("" if t.current else "†")


def _records_line(used: list[Path], kind: str, prefix: str) -> str:
    parts = []
    for path in used:
        data = json.loads(path.read_text())
        parts.append(f"{data['device']}, preset {data.get('preset')} ([{_rel(path)}]({prefix}{_rel(path)}))")
    return f"{kind}: " + "; ".join(parts) if parts else f"{kind}: not yet measured"


def chapter_table(prefix: str = "", notebooks: Path = ch.NOTEBOOKS, bench: Path = BENCH) -> str:
    """The README's chapter table: number, notebook, title and what the learner will be able to do, minutes."""
    chapter_list = ch.chapters(notebooks)
    cpu, cpu_used = ch.timings(chapter_list, "cpu", bench)
    gpu, gpu_used = ch.timings(chapter_list, "gpu", bench)
    rows = ["| # | notebook | you will be able to | CPU | GPU |", "|---|---|---|---|---|"]
    for c in chapter_list:
        rows.append(
            f"| {c.number} | `{c.stem}` | **{c.title.split(': ')[0]}**: {c.short} | {_minutes(cpu.get(c.stem))} | "
            f"{_minutes(gpu.get(c.stem))} |"
        )
    notes = [
        _records_line(cpu_used, "CPU", prefix) + ".",
        _records_line(gpu_used, "GPU", prefix) + ".",
        f"{NOT_MEASURED}: not yet measured. †: measured on an earlier version of the chapter.",
    ]
    return "\n".join(rows) + "\n\n" + " ".join(notes)


def chapter_details(prefix: str = "../") -> str:
    """docs/chapters.md's body: each chapter's whole "You will be able to", its last measured times and headlines."""
    chapter_list = ch.chapters()
    found = {kind: ch.timings(chapter_list, kind)[0] for kind in ("cpu", "gpu")}
    out = []
    for c in chapter_list:
        out.append(f"### {c.number} · {c.title}\n")
        out.append(f"[`notebooks/{c.stem}.ipynb`]({prefix}notebooks/{c.stem}.ipynb). You will be able to {c.able_to}\n")
        for kind in ("cpu", "gpu"):
            t = found[kind].get(c.stem)
            if t is None:
                out.append(f"- {kind.upper()}: not yet measured")
                continue
            row = next(r for r in json.loads(t.record.read_text())["chapters"] if r["chapter"] == c.stem)
            when = "" if t.current else ", an earlier version of the chapter"
            head = f" Its run: {row['headline']}." if row.get("headline") else ""
            path = _rel(t.record)
            out.append(f"- {kind.upper()}: {t.seconds:,.1f} s ([{path}]({prefix}{path}){when}).{head}")
        out.append("")
    return "\n".join(out)


def course_total(prefix: str = "") -> str:
    lines = []
    for path, data in ch.records():
        ok = [c for c in data["chapters"] if c["status"] == "ok"]
        lines.append(
            f"- {data['device']} (preset {data.get('preset')}, {data['updated'][:10]}): {len(ok)} chapters ok in "
            f"{num(data['seconds_ok'], 1)} s ([{_rel(path)}]({prefix}{_rel(path)}))"
        )
    return "\n".join(lines) or "Not yet measured."


# --------------------------------------------------------------------------- the tree and the docs


# The order a reader meets the pages in; a page not named here follows, by its file name.
READING_ORDER = ["running-the-course", "chapters", "kaggle-and-colab", "training", "datasets-and-experiments",
                 "fault-tolerance", "several-nodes-and-slurm", "serving", "gpu", "benchmarks", "testing",
                 "timing-fragile-tests", "layout"]  # fmt: skip


def docs_index(prefix: str = "docs/") -> str:
    """One line per page of docs/: its title, linked, in READING_ORDER."""
    tracked = set(layout.tree_files(ROOT))
    found = [p for p in DOCS.glob("*.md") if p.relative_to(ROOT).as_posix() in tracked]
    pages = sorted(found, key=lambda p: (READING_ORDER.index(p.stem) if p.stem in READING_ORDER
                                         else len(READING_ORDER), p.name))  # fmt: skip
    lines = []
    for page in pages:
        title = next(
            (line.lstrip("# ").strip() for line in page.read_text().splitlines() if line.startswith("# ")), page.stem
        )
        lines.append(f"- [{title}]({prefix}{page.name})")
    return "\n".join(lines)


# --------------------------------------------------------------------------- benchmarks


def _what(data: dict) -> str:
    for key in ("what", "benchmark", "kind", "chapter"):
        v = data.get(key)
        if isinstance(v, str) and v:
            return layout.one_line(v, 90)
    if "rungs" in data:
        return "chapter 03's ladder raced against torch's DDP"
    if "contenders" in data and "layout" in data:
        return "chapter 08's two-level race"
    return "(no description in the record)"


def _date(data: dict) -> str:
    for key in ("started", "created", "recorded", "updated"):
        v = data.get(key) or (data.get("provenance") or {}).get(key)
        if isinstance(v, str):
            return v[:10]
    return ""


def records_index(prefix: str = "../") -> str:
    rows = ["| record | what | machine | date |", "|---|---|---|---|"]
    for path in sorted(BENCH.glob("*.json")):
        data = json.loads(path.read_text())
        prov = data.get("provenance") or {}
        machine = data.get("machine") or prov.get("machine") or ""
        machine = machine if isinstance(machine, str) else machine.get("machine", "")
        rows.append(f"| [{path.name}]({prefix}benchmarks/{path.name}) | {_what(data)} | {machine} | {_date(data)} |")
    return "\n".join(rows)


def train_headline(prefix: str = "../") -> str:
    name = "train_cpu2-intel-r-xeon-r.json"
    h = _load(name)["headline"]
    rows = [
        "| contender or option | ours over it |",
        "|---|---|",
        f"| Trainer with its defaults | {h['tiny_ours_vs_trainer_defaults_speedup']:.2f}x |",
        f"| Trainer given our options | {h['tiny_ours_vs_trainer_same_options_speedup']:.2f}x |",
    ]
    for key, v in h.items():
        m = re.fullmatch(r"tiny_option_(.+)_ours_over_it", key)
        if m:
            rows.append(f"| ours with `{m.group(1)}` | {v:.2f}x |")
    ddp = ["| global batch | 2 processes over 1 | efficiency |", "|---|---|---|"]
    for key, v in h.items():
        m = re.fullmatch(r"ddp2_global_batch(\d+)_speedup", key)
        if m:
            eff = h.get(f"ddp2_global_batch{m.group(1)}_efficiency")
            ddp.append(f"| {m.group(1)} | {v:.2f}x | {eff * 100:.0f}% |")
    return "\n".join(rows) + "\n\n" + "\n".join(ddp) + "\n\n" + cite([f"benchmarks/{name}"], prefix)


def experiments(prefix: str = "../") -> str:
    section = _load("accuracy.json")["custom_hash"]
    rows = ["| experiment | data | model | processes | accuracy | train time per epoch |", "|---|---|---|---|---|---|"]
    for name, r in section["runs"].items():
        data = f"{r['data']}, {r['train_texts']:,} train / {r['test_texts']:,} test"
        rows.append(
            f"| `{name}` | {data} | {r['model']} + {r['tokenizer']} | {r['processes']} | "
            f"{r['final_accuracy_percent']:.2f}% | {r['mean_epoch_time_s']:.1f} s |"
        )
    pairs = _load("accuracy.json")["custom_hash_speedup"]["pairs"]
    sp = ["| pair | 2 processes over 1 (quiet step windows) | all-reduce share of a 2-process step |", "|---|---|---|"]
    for p in pairs:
        share = p.get("allreduce_share_of_step_2p")
        sp.append(f"| {p['pair']} | {p['speedup']:.2f}x | {share * 100:.0f}% |" if share is not None else
                  f"| {p['pair']} | {p['speedup']:.2f}x | |")  # fmt: skip
    return "\n".join(rows) + "\n\n" + "\n".join(sp) + "\n\n" + cite(["benchmarks/accuracy.json"], prefix)


def process_end(prefix: str = "../") -> str:
    abort = _load("exit_abort_cpu2-intel-r-xeon-r.json")["summary"]
    rows = ["| an all-reduce left in flight | launches | aborted | hung |", "|---|---|---|---|"]
    for key, s in abort.items():
        how = "without `end_process`" if s["mode"] == "plain" else "with `end_process`"
        rows.append(f"| {how} | {s['launches']} launches | {s['aborted']} aborted | {s['hung']} |")
    stress = _load("launch_stress_cpu2-intel-r-xeon-r.json")["summary"]
    st = ["| entry point, under slow_machine.py | launches | aborted | hung | failed |", "|---|---|---|---|---|"]
    for name, s in stress.items():
        st.append(f"| {name} | {s['launches']} launches | {s['aborted']} aborted | {s['hung']} | {s['failed']} |")
    records = ["benchmarks/exit_abort_cpu2-intel-r-xeon-r.json", "benchmarks/launch_stress_cpu2-intel-r-xeon-r.json"]
    return "\n".join(rows) + "\n\n" + "\n".join(st) + "\n\n" + cite(records, prefix)


# --------------------------------------------------------------------------- the GPU


def gpu_measured(prefix: str = "../") -> str:
    rows = ["| machine | CUDA tests | fp16 training | bf16 training | DDP over NCCL (1 rank) | API p50 |",
            "|---|---|---|---|---|---|"]  # fmt: skip
    names = []
    for path in sorted(BENCH.glob("gpu_*.json")):
        d = json.loads(path.read_text())
        if d.get("dry_run"):
            continue
        h = d["headline"]
        names.append(f"benchmarks/{path.name}")
        rows.append(
            f"| {', '.join(d.get('gpu') or [])} ({d['versions']['torch']}, {_date(d)}) | "
            f"{h.get('cuda_tests_passed')} passed | {num(h['train_fp16_samples_per_s'])} samples/s | "
            f"{num(h['train_bf16_samples_per_s'])} samples/s | {num(h['ddp_nccl_samples_per_s'])} samples/s | "
            f"{h['serving_p50_ms']:.1f} ms |"
        )
    return "\n".join(rows) + "\n\n" + cite(names, prefix)


def gpu_forecast(prefix: str = "../") -> str:
    name = "launch_floor_proxy_cpu2-intel-r-xeon-r.json"
    f = _load(name)
    gpu = sorted(BENCH.glob("gpu_*.json"))[-1]
    est = json.loads(gpu.read_text())["t4_epoch_estimate"]
    (scenario, s), *_ = est["scenarios"].items()
    lines = [
        "| what | per step | launches a step |",
        "|---|---|---|",
        f"| the CPU launch floor, eager ({f['kind']}) | {f['eager']['seconds_per_step'] * 1000:.1f} ms | "
        f"{f['eager']['launches_per_step']:.0f} |",
        f"| the CPU launch floor, CUDA graphs ({f['kind']}) | {f['cuda_graphs']['seconds_per_step'] * 1000:.1f} ms | "
        f"{f['cuda_graphs']['launches_per_step']:.0f} |",
    ]
    text = (
        f"An epoch of {est['rows']:,} rows from FLOPs alone, at {scenario}: {s['1x T4 minutes']:.2f} minutes on "
        f"one T4, {s['2x T4 minutes']:.2f} minutes on two ({est['label']})."
    )
    return "\n".join(lines) + "\n\n" + text + "\n\n" + cite([f"benchmarks/{name}", f"benchmarks/{gpu.name}"], prefix)


def hosted_images() -> str:
    from .. import wheelhouse

    reqs = wheelhouse.course_requirements()
    rows = ["| image | Python | platform | lacks of the course's requirements |", "|---|---|---|---|"]
    for name in ("kaggle", "colab", "gpu_session"):
        image = wheelhouse.load_image(name)
        lacks = ", ".join(f"`{r}`" for r in wheelhouse.lacking(image, reqs)) or "nothing"
        rows.append(f"| {name} | {image.python} | {image.platform} | {lacks} |")
    return "\n".join(rows)


# --------------------------------------------------------------------------- the test suite


def suite_time(prefix: str = "../") -> str:
    name = "suite_time_cpu2-intel-r-xeon-r.json"
    d = _load(name)
    rows = ["| date | the suite | the base | ratio | conditions |", "|---|---|---|---|---|"]
    for p in d["pairs"]:
        suite = f"{num(p['seconds'])} s, " + (f"{num(p['passed'])} passed" if p.get("passed") else "green")
        base = f"{num(p['base_seconds'])} s, " + (
            f"{num(p['base_passed'])} passed" if p.get("base_passed") else "green"
        )
        rows.append(f"| {p['date']} | {suite} | {base} | {p['ratio']:.2f}x | {p['conditions']} |")
    return "\n".join(rows) + "\n\n" + cite([f"benchmarks/{name}"], prefix)


def suite_profile(prefix: str = "../") -> str:
    name = "suite_time_cpu2-intel-r-xeon-r.json"
    p = _load(name)["profile"]
    rows = ["| part | CPU | wall | cores busy |", "|---|---|---|---|"]
    for part in ("shared", "quiet"):
        q = p[part]
        rows.append(f"| {q['what']} | {num(q['cpu_s'])} CPU-s | {num(q['wall_s'])} s | {q['busy_percent']}% |")
    c = _load(name)["census"]
    lines = [
        f"- A rank that builds the model imports torch ({c['torch_import_cpu_s']:.1f} CPU-s) and transformers' "
        f"DistilBERT ({c['distilbert_import_cpu_s']:.1f} CPU-s more); a torchrun launch of two ranks that only meet "
        f"costs {c['two_rank_launch_cpu_s']:.1f} CPU-s ({c['two_rank_launch_s']:.1f} s).",
        "- Loading modules with the garbage collector paused and then frozen: `train_single.py` on the embedded "
        f"sample {c['gc']['train_single_cpu_s'][0]:.1f} → {c['gc']['train_single_cpu_s'][1]:.1f} CPU-s, a 2-rank "
        f"`train_ddp.py` launch {c['gc']['train_ddp_cpu_s'][0]:.1f} → {c['gc']['train_ddp_cpu_s'][1]:.1f} CPU-s.",
    ]
    return "\n".join(rows) + "\n\n" + "\n".join(lines) + "\n\n" + cite([f"benchmarks/{name}"], prefix)


def generators() -> dict:
    """Every block name a page may hold, and what makes it (README's blocks link from the root, docs/ from docs/)."""
    return {
        "chapters": lambda: chapter_table(""),
        "course-total": lambda: course_total("../"),
        "layout": layout.readme_layout,
        "docs-index": docs_index,
        "chapters-detail": chapter_details,
        "layout-detail": layout.detailed_layout,
        "records": records_index,
        "train": train_headline,
        "experiments": experiments,
        "process-end": process_end,
        "gpu-measured": gpu_measured,
        "gpu-forecast": gpu_forecast,
        "hosted-images": hosted_images,
        "suite-time": suite_time,
        "suite-profile": suite_profile,
    }
