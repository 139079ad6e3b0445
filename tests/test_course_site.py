"""scripts/run_course.py --html: the executed course as a static site, checked in a real headless browser.

The real runner (papermill, a real kernel) runs a tiny course of three notebooks with --html: 01 draws a
matplotlib figure, prints the machine's own folders and a line too long for a phone, holds a wide table and a
solution cell, and writes its record from a cell tagged `hide`; 02 fails; 03 never runs. Chromium (Debian's, driven
by Playwright) then opens the site from disk with every request to another host refused, and checks what a reader
would see: no console error on any page, every image decoded, the index's table equal to the runner's summary.json,
the hidden cell and papermill's injected parameters cell gone, the sidebar listing the chapters and the page's
sections, the solution folded, the code highlighted, no local folder anywhere, and nothing wider than the window at
a phone's width (390 px) and a desktop's (1280 px). browse_site() does the same on any run folder, and
screenshot_site() takes the pictures in docs/site/:
`python -c "from pathlib import Path; from tests.test_course_site import browse_site; browse_site(Path('runs/TS'))"`.
Without Playwright or chromium the browser test skips and says why
(.ci/run installs chromium as root with apt; requirements-dev.txt has playwright). About 30 s on a 2-core CPU.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from distrinews_course.site import local_paths, remote_references

ROOT = Path(__file__).resolve().parent.parent
RUNNER = ROOT / "scripts" / "run_course.py"

PARAMS = 'PRESET = "auto"\nNPROC = "auto"'
PLOT = """import matplotlib
import matplotlib.pyplot as plt
fig, ax = plt.subplots(figsize=(3, 2))
ax.plot([1, 2, 3], [0.5, 0.7, 0.9])
ax.set_title("accuracy per epoch")
plt.show()
print("VISIBLE-OUTPUT-7431")"""
# What a page must not show as it is: the machine's folders, printed the way chapters do (setup() prints the project).
PATHS = """import os
from pathlib import Path
print("cwd", os.getcwd())
print("run", Path(os.environ["DISTRINEWS_COURSE_RECORDS"]).parent)
print("home", Path.home())
print("LONG-" + "x" * 400)   # no space to break at: it must wrap inside the cell, not widen the page
# a code line much longer than a phone is wide, which must wrap inside its cell too ............................................................. end"""  # noqa: E501
WIDE_TABLE = (
    "## A wide table\n\n| "
    + " | ".join(f"column {i}" for i in range(14))
    + " |\n|"
    + "---|" * 14
    + "\n| "
    + " | ".join(f"value-{i}-0123456789" for i in range(14))
    + " |"
)
SOLUTION = """def exercise_1():
    print("SOLUTION-CODE-3318")   # folded on the page behind "show the solution"


exercise_1()"""
# The record cell, as every chapter's: tagged `hide`, so neither it nor what it prints reaches the page.
RECORD = """from distrinews_course.records import write_record
write_record("01_plot", {"accuracy": 0.8125, "samples_per_s": 363.25, "steps": 12, "data": "a tiny sample"},
             headline=f"accuracy 81.2% with {PRESET}")  # HIDDEN-SOURCE-2207
print("HIDDEN-PRINT-5519")"""


def _notebook(path: Path, title: str, *cells) -> None:
    nb = new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [
        new_markdown_cell(f"# {title}\n\nSome prose."),
        new_code_cell(PARAMS, metadata={"tags": ["parameters"]}),
        *cells,
    ]
    nbformat.write(nb, str(path))


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    course = tmp_path_factory.mktemp("course")
    _notebook(
        course / "01_plot.ipynb",
        "01 A plot",
        new_markdown_cell("## The plot"),
        new_code_cell(PLOT),
        new_markdown_cell("## Where it ran"),
        new_code_cell(PATHS),
        new_markdown_cell(WIDE_TABLE),
        new_markdown_cell("## Exercises"),
        new_code_cell(SOLUTION, metadata={"tags": ["solution"], "jupyter": {"source_hidden": True}}),
        new_code_cell(RECORD, metadata={"tags": ["hide"]}),
    )
    _notebook(course / "02_fails.ipynb", "02 A failure", new_code_cell("raise ValueError('02 fails here')"))
    _notebook(course / "03_never.ipynb", "03 Never run", new_code_cell("print('never')"))
    runs = tmp_path_factory.mktemp("runs")
    proc = subprocess.run(
        [
            sys.executable,
            str(RUNNER),
            "--no-progress",
            "--notebooks-dir",
            str(course),
            "--runs-dir",
            str(runs),
            "--preset",
            "cpu_smoke",
            "--html",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out  # 02 failed; the site is rendered all the same
    assert "site: " in out and "site not rendered" not in out, out
    (run,) = list(runs.iterdir())
    return run


def test_a_page_hides_the_folders_the_run_was_made_in():
    """A run copied elsewhere, or rendered by another checkout: the folders papermill recorded are named too."""
    nb = new_notebook()
    nb.metadata["papermill"] = {
        "input_path": "/elsewhere/DistriNews/notebooks/02_ddp_training.ipynb",
        "output_path": "/elsewhere/DistriNews/runs/20260101-120000/02_ddp_training.ipynb",
    }
    pairs = dict(local_paths(Path("/copies/run"), nb))
    assert pairs["/elsewhere/DistriNews"] == "<project>" and pairs["/elsewhere/DistriNews/notebooks"] == "<notebooks>"
    assert pairs["/elsewhere/DistriNews/runs/20260101-120000"] == "<run>" and pairs["/copies/run"] == "<run>"
    assert pairs[str(ROOT)] == "<project>" and pairs[str(Path.home())] == "~"
    assert list(pairs) == sorted(pairs, key=len, reverse=True)  # the run folder before the project holding it
    nb.metadata["papermill"]["input_path"] = "/elsewhere/course/01_plot.ipynb"  # a course outside a project
    pairs = dict(local_paths(Path("/copies/run"), nb))
    assert pairs["/elsewhere/course"] == "<notebooks>" and "/elsewhere" not in pairs


@pytest.mark.slow
def test_the_site_is_written_offline_and_without_hidden_cells(run_dir):
    site = run_dir / "site"
    assert sorted(p.name for p in site.iterdir()) == ["01_plot.html", "02_fails.html", "index.html"]
    for page in site.iterdir():
        text = page.read_text()
        assert remote_references(text) == [], page.name
        assert "HIDDEN-" not in text, f"{page.name} shows the hide-tagged cell"
    chapter = (site / "01_plot.html").read_text()
    assert "VISIBLE-OUTPUT-7431" in chapter and 'src="data:image/png;base64,' in chapter


@pytest.mark.slow
def test_html_only_renders_an_earlier_run_again(run_dir, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    shutil.rmtree(copy / "site")
    proc = subprocess.run(
        [sys.executable, str(RUNNER), "--html-only", str(copy)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for page in ("index.html", "01_plot.html", "02_fails.html"):  # the run's folder moved: not a line of a page did
        assert (copy / "site" / page).read_text() == (run_dir / "site" / page).read_text(), page
    proc = subprocess.run(
        [sys.executable, str(RUNNER), "--html-only", str(tmp_path / "nothing")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "no summary.json" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def _browser():
    """(playwright context manager, chromium path), or pytest.skip with what is missing."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("no Playwright for Python: pip install -r requirements-dev.txt")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if not chromium:
        pytest.skip("no chromium on PATH: apt-get install chromium (.ci/run does it when run as root)")
    return sync_playwright, chromium


# What a phone and a desktop show; at both, nothing on any page may be wider than the window.
WIDTHS = {"phone": (390, 844), "desktop": (1280, 800)}
HIDDEN_TAGS = {"hide", "injected-parameters"}  # cells the site leaves out (the parameters are said in one line)

_WIDER_THAN_WINDOW = """() => [...document.querySelectorAll('body *')]
    .filter(e => e.getBoundingClientRect().right > window.innerWidth + 0.5)
    .slice(0, 5).map(e => e.tagName.toLowerCase() + '.' + String(e.className).split(' ')[0])"""


# Code and text outputs wrap: a <pre> that scrolls or clips sideways hides part of its line from the reader.
_UNWRAPPED = """() => [...document.querySelectorAll('pre')]
    .filter(p => Math.max(p.scrollWidth, p.getBoundingClientRect().width) > (p.closest('.jp-Cell') || document.body).clientWidth + 1)
    .slice(0, 3).map(p => p.textContent.slice(0, 60))"""  # noqa: E501


# The index's headers, statuses and seconds are short: each on one line, never "stat|us" or "130.|2".
_BROKEN_CELLS = """() => [...document.querySelectorAll('table.summary th, table.summary td.status, table.summary td.seconds')]
    .filter(c => { const r = document.createRange(); r.selectNodeContents(c);
                   return new Set([...r.getClientRects()].map(x => Math.round(x.top))).size > 1; })
    .slice(0, 3).map(c => c.textContent)"""  # noqa: E501


def _overflow(page) -> str | None:
    """None when the page fits the window's width and every <pre> wraps; else what sticks out."""
    width, window = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    if width > window:
        return f"{width} px wide in a {window} px window: {page.evaluate(_WIDER_THAN_WINDOW)}"
    unwrapped = page.evaluate(_UNWRAPPED)
    return f"lines that do not wrap: {unwrapped}" if unwrapped else None


def _local_folders(run_dir: Path) -> set[str]:
    """What no page may show: this checkout, the home and the run folder where they are now, and the folders the
    chapters ran in as papermill recorded them (the run folder it wrote and the chapters' folder, each with its
    parent: the project, in the course's layout), for a run that was copied or is rendered by another checkout."""
    ran_in = set()
    for executed in run_dir.glob("*.ipynb"):
        meta = nbformat.read(str(executed), as_version=4).metadata.get("papermill") or {}
        for key in ("input_path", "output_path"):
            if meta.get(key) and Path(meta[key]).is_absolute():
                ran_in |= {Path(meta[key]).parent, Path(meta[key]).parent.parent}
    ran_in = {f for f in ran_in if len(f.parts) > 2}  # a folder such as /tmp alone is in every system path
    return {str(f) for f in {run_dir, run_dir.resolve(), ROOT, Path.home(), *ran_in}}


def browse_site(run_dir: Path) -> dict:
    """Open run_dir/site in chromium, offline, as a reader does: the index, then each chapter through its link, at a
    phone's width and at a desktop's. Checks what holds for any run (no console error, images decoded, the index equal
    to summary.json, the `hide`-tagged and injected-parameters cells gone and every other cell there, solutions folded,
    the sidebar's links, no local folder, nothing wider than the window); returns the index's rows and each page's
    text, image count and sidebar for the caller's own checks. Skips (pytest.skip) without a browser."""
    sync_playwright, chromium = _browser()
    summary = json.loads((run_dir / "summary.json").read_text())
    index = (run_dir / "site" / "index.html").resolve().as_uri()
    local = _local_folders(run_dir)
    pages = {}
    with sync_playwright() as pw:
        try:
            browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        except Exception as err:  # a chromium that cannot start here (missing libraries, ...)
            pytest.skip(f"chromium at {chromium} did not start: {str(err).splitlines()[0]}")
        page = browser.new_page(viewport=dict(zip(("width", "height"), WIDTHS["desktop"])))
        problems, remote, overflows = [], [], []
        page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
        page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
        page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url}"))

        def offline(route):  # the site must not need the network: refuse anything that is not a local file
            if route.request.url.startswith(("file:", "data:")):
                route.continue_()
            else:
                remote.append(route.request.url)
                route.abort()

        page.route("**/*", offline)

        page.goto(index)
        rows = page.eval_on_selector_all(
            "table.summary tbody tr",
            """rows => rows.map(r => ({
            name: r.dataset.notebook, status: r.querySelector('td.status').textContent,
            seconds: r.querySelector('td.seconds').textContent,
            headline: r.querySelector('.headline').textContent,
            link: r.querySelector('td.chapter a') ? r.querySelector('td.chapter a').getAttribute('href') : null,
            figures: Object.fromEntries([...r.querySelectorAll('dd[data-key]')].map(
                d => [d.dataset.key, JSON.parse(d.dataset.value)]))}))""",
        )
        # the index's table is the runner's summary: status, seconds as the runner prints them, key figures
        expected = [
            {
                "name": n["name"],
                "status": n["status"],
                "seconds": f"{n['seconds']:.1f}" if n["seconds"] is not None else "-",
                "headline": n["headline"],
                "figures": {k: v for k, v in n["record"].items() if k not in ("headline", "notebook")},
            }
            for n in summary["notebooks"]
        ]
        assert [{k: v for k, v in r.items() if k != "link"} for r in rows] == expected
        leaked = sorted(p for p in local if p in page.content())
        assert not leaked, f"the index shows local folders: {leaked}"
        machine = page.inner_text("dl.machine")
        for key in ("hostname", "processor", "torch"):
            assert str(summary["machine"][key]) in machine, (key, machine)
        linked = [r["link"] for r in rows if r["link"]]
        sidebar_links = page.eval_on_selector_all(
            "nav.course-sidebar details.chapters a", "as => as.map(a => a.getAttribute('href'))"
        )
        assert sidebar_links == linked, f"the index's sidebar links {sidebar_links}, its table {linked}"

        for row in rows:
            if not row["link"]:
                assert row["status"] == "not run", row
                continue
            page.goto(index)
            page.click(f'table.summary a[href="{row["link"]}"]')  # the link itself, as a reader follows it
            page.wait_for_load_state("load")
            assert page.url.endswith(row["link"])
            images = page.eval_on_selector_all("img", "imgs => imgs.map(i => [i.complete, i.naturalWidth])")
            assert all(done and width > 0 for done, width in images), f"{row['link']}: an image did not decode"
            shown = set(page.eval_on_selector_all("[id^='cell-id=']", "els => els.map(e => e.id.slice(8))"))
            cells = nbformat.read(str(run_dir / f"{row['name']}.ipynb"), as_version=4).cells
            hidden = {c.id for c in cells if HIDDEN_TAGS & set(c.metadata.get("tags", []))}
            assert not hidden & shown, f"{row['link']} shows the cells tagged {HIDDEN_TAGS}: {hidden & shown}"
            assert {c.id for c in cells} - hidden <= shown, f"{row['link']} lost cells that are not hidden"
            solutions = {c.id for c in cells if "solution" in c.metadata.get("tags", [])}
            folded = set(
                page.eval_on_selector_all(
                    "details.solution:not([open]) > [id^='cell-id=']", "els => els.map(e => e.id.slice(8))"
                )
            )
            assert folded == solutions, (
                f"{row['link']}: solution cells {solutions}, folded behind 'show the solution' {folded}"
            )
            sidebar = page.evaluate("""() => ({
                chapters: [...document.querySelectorAll('nav.course-sidebar details.chapters a')].map(a => a.getAttribute('href')),
                current: [...document.querySelectorAll('nav.course-sidebar li.current a')].map(a => a.getAttribute('href')),
                sections: [...document.querySelectorAll('nav.course-sidebar details.sections a')].map(a => [a.getAttribute('href'), a.textContent]),
                headings: [...document.querySelectorAll('main h2[id]')].map(h => ['#' + h.id, h.textContent])})""")  # noqa: E501
            assert sidebar["chapters"] == linked and sidebar["current"] == [row["link"]], (row["link"], sidebar)
            assert sidebar["sections"] == sidebar["headings"], (
                f"{row['link']}: the sidebar's sections are not the page's: {sidebar}"
            )
            source = page.content()
            leaked = sorted(p for p in local if p in source)
            assert not leaked, f"{row['link']} shows local folders: {leaked}"
            pages[row["name"]] = {
                "text": page.inner_text("body"),
                "images": len(images),
                "sidebar": sidebar,
                "html": source,
            }

        for name, (width, height) in WIDTHS.items():  # a phone's width and a desktop's: nothing sticks out
            page.set_viewport_size({"width": width, "height": height})
            for link in ["index.html", *linked]:
                page.goto((run_dir / "site" / link).resolve().as_uri())
                wide = _overflow(page)
                if wide:
                    overflows.append(f"{link} at {name} width: {wide}")
                broken = page.evaluate(_BROKEN_CELLS) if link == "index.html" else []
                if broken:
                    overflows.append(f"index.html at {name} width: cut across lines: {broken}")
        browser.close()
    assert remote == [], f"the site asked the network for {remote}"
    assert problems == [], problems
    assert overflows == [], overflows
    return {"rows": rows, "pages": pages}


def _small_png(path: Path) -> None:
    """Down to 256 colours: a page is mostly flat colour, so the picture stays sharp at about 40% of the bytes
    (docs/site/: 96 KB instead of 244 KB at a desktop's width, 34 KB instead of 75 KB at a phone's)."""
    from PIL import Image

    with Image.open(path) as image:
        small = image.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    small.save(path, optimize=True)


def screenshot_site(run_dir: Path, out: Path, chapter: str) -> list[Path]:
    """The index and one chapter's page at a phone's width and at a desktop's: the top of each page, as PNGs in `out`
    (docs/site/ holds the course's: `python -c "from pathlib import Path; from tests.test_course_site import
    screenshot_site; screenshot_site(Path('runs/TS'), Path('docs/site'), '02_ddp_training')"`)."""
    sync_playwright, chromium = _browser()
    out.mkdir(parents=True, exist_ok=True)
    shots = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        for name, (width, height) in WIDTHS.items():
            page = browser.new_page(viewport={"width": width, "height": height})
            for stem, file in (("index", "index.html"), (chapter, f"{chapter}.html")):
                page.goto((run_dir / "site" / file).resolve().as_uri())
                assert _overflow(page) is None, f"{file} at {name} width: {_overflow(page)}"
                shots.append(out / f"{stem}-{name}.png")
                page.screenshot(path=str(shots[-1]))
                _small_png(shots[-1])
            page.close()
        browser.close()
    return shots


@pytest.mark.slow
def test_a_real_browser_reads_the_site(run_dir, tmp_path):
    seen = browse_site(run_dir)
    rows, pages = seen["rows"], seen["pages"]
    assert [r["status"] for r in rows] == ["ok", "FAILED", "not run"]
    assert [r["link"] for r in rows] == ["01_plot.html", "02_fails.html", None]
    assert rows[0]["figures"]["accuracy"] == 0.8125 and rows[0]["headline"] == "accuracy 81.2% with cpu_smoke"
    assert pages["01_plot"]["images"] == 1 and pages["02_fails"]["images"] == 0  # the matplotlib figure
    assert "VISIBLE-OUTPUT-7431" in pages["01_plot"]["text"] and "Course index" in pages["01_plot"]["text"]
    assert all("HIDDEN-" not in p["text"] for p in pages.values())
    assert "02 fails here" in pages["02_fails"]["text"]  # the failing cell's error, where it happened
    plot = pages["01_plot"]
    # the sidebar: every chapter that ran, and this page's sections in order
    assert [text for _, text in plot["sidebar"]["sections"]] == [
        "The plot",
        "Where it ran",
        "A wide table",
        "Exercises",
    ]
    # the solution is on the page, folded: its code is in the HTML but not shown until the reader opens it
    assert "SOLUTION-CODE-3318" in plot["html"] and "SOLUTION-CODE-3318" not in plot["text"]
    assert "show the solution" in plot["text"]
    # the parameters papermill injected: said once, in the page's header line, not as a second cell
    assert (
        plot["text"].count('PRESET = "auto"') == 1 and "Executed with" in plot["text"] and "'cpu_smoke'" in plot["text"]
    )
    # the machine's folders have names instead
    for shown in ("cwd <notebooks>", "run <run>", "home ~"):
        assert shown in plot["text"], (shown, plot["text"][:2000])
    # code is highlighted: pygments' classes on the tokens (a keyword, a string)
    assert '<span class="kn">import</span>' in plot["html"] and '<span class="s2">' in plot["html"]
    shots = screenshot_site(run_dir, tmp_path, "01_plot")
    assert [p.name for p in shots] == [
        "index-phone.png",
        "01_plot-phone.png",
        "index-desktop.png",
        "01_plot-desktop.png",
    ]
    assert all(1000 < p.stat().st_size < 300_000 for p in shots), [p.stat().st_size for p in shots]


def test_a_figure_that_is_a_dict_is_a_table_not_python():
    """#44: chapter 03's record holds a figure per rung; the index showed it as a Python dict (quotes, 16 digits)."""
    from distrinews_course.site import _fmt

    rungs = {
        "naive": {"step_time_ratio_vs_ddp": 1.0434782608695652, "peak_mb_per_rank": 76.1},
        "zero1": {"step_time_ratio_vs_ddp": 1.1, "peak_mb_per_rank": 81.9},
    }
    out = _fmt(rungs)
    assert out.startswith('<div class="figures-wide"><table class="figures">') and "<th>zero1</th>" in out
    assert "<td>1.043</td>" in out
    assert "'" not in out and "{" not in out
    assert _fmt({"a": 1.0, "b": "x<y", "c": [1, 2]}) == (
        '<dl class="figures"><dt>a</dt><dd>1</dd><dt>b</dt><dd>x&lt;y</dd><dt>c</dt><dd>1, 2</dd></dl>'
    )


NOTE = """## A section

Some prose.

<details>
<summary>How this is measured</summary>

- **Rounds.** NOTE-ITEM-6021, the first of two.
- A second item.

```
a line

after a blank line
```
</details>

AFTER-NOTE-8840"""


def _inside_details(page: str) -> dict[str, bool]:
    """For each marker of NOTE: whether the page has it inside an open <details> element."""
    from html.parser import HTMLParser

    class Walk(HTMLParser):
        depth, found = 0, {}

        def handle_starttag(self, tag, attrs):
            self.depth += tag == "details"

        def handle_endtag(self, tag):
            self.depth -= tag == "details"

        def handle_data(self, data):
            for marker in ("NOTE-ITEM-6021", "after a blank line", "AFTER-NOTE-8840"):
                if marker in data:
                    self.found[marker] = self.depth > 0

    walk = Walk()
    walk.feed(page)
    return walk.found


def test_a_how_this_is_measured_note_stays_folded_on_the_page():
    """A markdown cell's <details> note is folded in Jupyter; nbconvert alone closed it straight after its summary (the
    blank line ends the HTML block), so the note's text showed, unfolded, below an empty fold. The page keeps it in."""
    from nbconvert import HTMLExporter

    from distrinews_course.site import _exporter, fold_details

    nb = new_notebook()
    nb.cells = [new_markdown_cell(NOTE)]
    plain, _ = HTMLExporter(template_name="lab", embed_images=True).from_notebook_node(nb)
    assert _inside_details(plain)["NOTE-ITEM-6021"] is False  # the defect, as nbconvert alone renders it
    page, _ = _exporter([]).from_notebook_node(
        nb, resources={"course_nav": "", "course_run": "", "course_css": "", "course_js": ""}
    )
    assert _inside_details(page) == {"NOTE-ITEM-6021": True, "after a blank line": True, "AFTER-NOTE-8840": False}
    assert "a line\n<!-- -->\nafter a blank line" in page  # the code's blank line is still a line of its own
    same_line = fold_details("<details><summary><b>How</b> (rounds)</summary>\n\n- one\n</details>")
    assert same_line.strip().startswith("<details><summary><b>How</b> (rounds)</summary>\n<ul>")
    assert fold_details("no note here") == "no note here"
