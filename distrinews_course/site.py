"""The executed course as a static site: one page per chapter and an index, readable offline.

    from distrinews_course.site import render_site
    index = render_site(Path("runs/20260101-120000"))   # -> runs/20260101-120000/site/index.html

scripts/run_course.py --html calls this after a run (--html-only RUN_DIR on an earlier one). The input is the run
folder as the runner leaves it: the executed notebooks and summary.json (status, seconds, headline, record and the
machine of every chapter). The pages are nbconvert's JupyterLab look with every script that nbconvert would load
from the internet (require.js, MathJax, mermaid) left out, the plots embedded as data: URIs, and the cells tagged
`hide` (the chapters' record cells: plumbing, not lesson) removed. Nothing on a page refers to another host.

What a reader gets besides nbconvert's page: a sidebar with the chapters and the current chapter's sections (beside the
page on a wide screen, folded above it on a phone); each cell tagged `solution` folded behind "show the solution";
code and outputs wrapped inside their cell (nothing runs past the page at any width); the parameters papermill ran the
chapter with said in one line, not in a second parameters cell; and no folder of the machine it ran on: the project,
the run and the home folder read `<project>`, `<run>` and `~`, both where the run was made (papermill's metadata
says) and where the site is rendered (a run copied elsewhere, or rendered by another checkout, shows neither).
The frame every page shares (stylesheet, sidebar, bars between chapters) is in site_frame.py.
"""

from __future__ import annotations

import html
import json
import re
import textwrap
from html.parser import HTMLParser
from pathlib import Path

# nbconvert, jinja2 and traitlets come with the course's Jupyter stack: imported here, not by the core.
import nbformat
from jinja2 import DictLoader
from nbconvert import HTMLExporter
from nbconvert.filters.markdown_mistune import markdown2html_mistune
from nbconvert.preprocessors import Preprocessor
from traitlets import List
from traitlets.config import Config

from . import ROOT
from .site_frame import CSS, JS, SIDEBAR_SLOT, add_section_ids, nav_bar, run_line, sidebar

PROJECT_ROOT = ROOT

HIDDEN_TAG = "hide"
SOLUTION_TAG = "solution"
FOLD_TAG = "fold"  # a cell whose output is long (a diff, a whole script): on the page it is folded behind a summary
# papermill's copy of the parameters it injected: the page names them once, in its header, instead of a second cell
INJECTED_TAG = "injected-parameters"

# nbconvert's lab template with its CDN scripts taken out (the course's markdown has no maths or mermaid
# diagrams; a page that waited on a CDN would show nothing offline), the sidebar and the bars to move between
# chapters, and each solution cell folded behind "show the solution".
_TEMPLATE = (
    """{%- extends 'index.html.j2' -%}
{%- block html_head_js -%}{%- endblock html_head_js -%}
{%- block jupyter_widgets -%}{%- endblock jupyter_widgets -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
{%- block html_head_css -%}
<style type="text/css">{{ resources.course_css }}</style>
{%- endblock html_head_css -%}
{%- block body_header -%}
<body class="jp-Notebook course-page" data-jp-theme-light="true" data-jp-theme-name="JupyterLab Light">
"""
    + SIDEBAR_SLOT
    + """
<main class="course-main">
{{ resources.course_nav }}
{{ resources.course_run }}
{%- endblock body_header -%}
{%- block any_cell -%}
{%- if '"""
    + SOLUTION_TAG
    + """' in cell.metadata.get('tags', []) -%}
<details class="solution"><summary>show the solution</summary>
{{ super() }}
</details>
{%- else -%}
{{ super() }}
{%- endif -%}
{%- endblock any_cell -%}
{%- block outputs -%}
{%- if '"""
    + FOLD_TAG
    + """' in cell.metadata.get('tags', []) -%}
<details class="fold"><summary>show the output (long)</summary>
{{ super() }}
</details>
{%- else -%}
{{ super() }}
{%- endif -%}
{%- endblock outputs -%}
{%- block body_footer -%}
{{ resources.course_nav }}
</main>
{{ resources.course_js }}
</body>
{%- endblock body_footer -%}
"""
)


class _LocalPaths(Preprocessor):
    """Replaces the machine's own folders (the project, the run, the notebooks' folder, the home) in every cell's
    source and text output by a name: a page shows `<project>/scripts/...`, never `/home/someone/...`."""

    replacements = List(default_value=[]).tag(config=True)  # (absolute path, what to show instead), longest first

    def scrub(self, text):
        if isinstance(text, list):
            return [self.scrub(t) for t in text]
        if not isinstance(text, str):
            return text
        for path, name in self.replacements:
            text = text.replace(path, name)
        return text

    def preprocess_cell(self, cell, resources, index):
        cell.source = self.scrub(cell.source)
        for out in cell.get("outputs", []):
            if "text" in out:
                out["text"] = self.scrub(out["text"])
            if "traceback" in out:
                out["traceback"] = self.scrub(out["traceback"])
            if "evalue" in out:
                out["evalue"] = self.scrub(out["evalue"])
            for mime in ("text/plain", "text/html", "text/markdown", "text/latex", "application/javascript"):
                if mime in out.get("data", {}):
                    out["data"][mime] = self.scrub(out["data"][mime])
        return cell, resources


def ran_in(nb) -> list[tuple[Path, str]]:
    """The folders the chapter ran in, from papermill's record of it: the folder its executed copy was written to
    (`<run>`, though the run folder has been copied or moved since) and the chapters' folder (`<notebooks>`), whose
    parent is the project it ran from when that folder is the course's `notebooks/` (run_course.py's default). A site
    rendered from another checkout, or from a copy of the run, must hide these as well as its own folders."""
    meta = (nb.metadata.get("papermill") or {}) if nb is not None else {}
    named = []
    for key, name in (("output_path", "<run>"), ("input_path", "<notebooks>")):
        path = meta.get(key)
        if isinstance(path, str) and Path(path).is_absolute():
            named.append((Path(path).parent, name))
            if key == "input_path" and Path(path).parent.name == "notebooks":
                named.append((Path(path).parent.parent, "<project>"))
    return named


def local_paths(run_dir: Path, *nbs) -> list[tuple[str, str]]:
    """The folders a page must not show, each with the name it shows instead, longest first (so a run folder inside
    the project reads `<run>`, and the project's other files `<project>/...`): this checkout's, the run folder's and
    the home, then those the chapters in nbs ran in (ran_in) where they differ."""
    named = [(PROJECT_ROOT, "<project>"), (Path(run_dir), "<run>"), (Path.home(), "~")]
    for nb in nbs:
        named += ran_in(nb)
    pairs = {}
    for path, name in named:
        for form in (str(path), str(path.resolve())):
            if len(form) > 1:  # never "/" itself
                pairs.setdefault(form, name)
    return sorted(pairs.items(), key=lambda pair: -len(pair[0]))


_DETAILS = re.compile(
    r"^<details(?P<attrs>[^>]*)>\s*<summary>(?P<summary>.*?)</summary>(?P<body>.*?)</details>", re.S | re.M
)


def fold_details(markdown: str) -> str:
    """A markdown cell's `<details>` notes as one HTML block each, their markdown rendered inside, so that they stay
    folded on the page as in Jupyter. Left as they are, nbconvert closes each `<details>` right after its summary:
    the blank line after `</summary>` ends the HTML block (CommonMark), and the note's text lands outside, unfolded.
    Inside the block a blank line would end it again, so each becomes an empty comment (in a `<pre>` it still reads
    as an empty line)."""

    def one(m: re.Match) -> str:
        body = markdown2html_mistune(textwrap.dedent(m["body"]).strip("\n"))
        block = f"<details{m['attrs']}><summary>{m['summary'].strip()}</summary>\n{body.strip()}\n</details>"
        return "\n" + re.sub(r"\n[ \t]*(?=\n)", "\n<!-- -->", block) + "\n"

    return _DETAILS.sub(one, markdown)


class _FoldedDetails(Preprocessor):
    """Each markdown cell's <details> notes kept folded on the page (fold_details)."""

    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type == "markdown" and "<details" in cell.source:
            cell.source = fold_details(cell.source)
        return cell, resources


def _exporter(replacements) -> HTMLExporter:
    c = Config()
    c.TagRemovePreprocessor.enabled = True
    c.TagRemovePreprocessor.remove_cell_tags = {HIDDEN_TAG, INJECTED_TAG}
    c.HTMLExporter.preprocessors = [
        "nbconvert.preprocessors.TagRemovePreprocessor",
        _LocalPaths(replacements=replacements),
        _FoldedDetails(),
    ]
    return HTMLExporter(
        config=c,
        template_name="lab",
        extra_loaders=[DictLoader({"course.html.j2": _TEMPLATE})],
        template_file="course.html.j2",
        embed_images=True,
        exclude_anchor_links=True,
    )


def chapter_title(nb) -> str:
    """The notebook's first markdown heading, without its #s."""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("#"):
                    return line.lstrip("#").strip()
    return ""


class _RemoteRefs(HTMLParser):
    def __init__(self):
        super().__init__()
        self.found: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        url = a.get("src") if tag in ("script", "img", "iframe") else a.get("href") if tag == "link" else None
        if url and re.match(r"\s*(https?:)?//", url):
            self.found.append(f"<{tag}> {url}")


def remote_references(page: str) -> list[str]:
    """Scripts, stylesheets, images or frames the page would fetch from another host (empty when it works offline)."""
    parser = _RemoteRefs()
    parser.feed(page)
    return parser.found + [f"@import {u}" for u in re.findall(r"@import\s+(?:url\()?['\"]?(https?://[^'\")\s]+)", page)]


def _fmt(value) -> str:
    """A record's figure as HTML: a number to 4 digits, a dict of dicts (rows of the same figures) a table, a dict a
    list of its figures, a list its items; every text escaped."""
    if isinstance(value, bool) or value is None:
        return html.escape(str(value))
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(_fmt(v) for v in value)
    if isinstance(value, dict):
        rows = [v for v in value.values() if isinstance(v, dict)]
        if value and len(rows) == len(value) and all(set(r) == set(rows[0]) for r in rows):
            head = "".join(f"<th>{html.escape(str(k))}</th>" for k in rows[0])
            body = "".join(
                f"<tr><th>{html.escape(str(name))}</th>"
                + "".join(f"<td>{_fmt(v)}</td>" for v in row.values())
                + "</tr>"
                for name, row in value.items()
            )
            # a wide table scrolls inside its cell: the page itself is never wider than the window
            return f'<div class="figures-wide"><table class="figures"><tr><th></th>{head}</tr>{body}</table></div>'
        items = "".join(f"<dt>{html.escape(str(k))}</dt><dd>{_fmt(v)}</dd>" for k, v in value.items())
        return f'<dl class="figures">{items}</dl>'
    return html.escape(str(value))


def _index_page(summary: dict, chapters: list[dict]) -> str:
    rows = []
    for ch in chapters:
        name = html.escape(ch["name"])
        title = html.escape(ch["title"] or ch["name"])
        link = f'<a href="{html.escape(ch["page"])}">{title}</a>' if ch["page"] else title
        secs = f"{ch['seconds']:.1f}" if ch["seconds"] is not None else "-"
        figures = "".join(
            f'<dt>{html.escape(k)}</dt><dd data-key="{html.escape(k)}" '
            f'data-value="{html.escape(json.dumps(v))}">{_fmt(v)}</dd>'
            for k, v in ch["record"].items()
            if k not in ("headline", "notebook")
        )
        details = (
            f'<details><summary>all figures</summary><dl class="figures">{figures}</dl></details>' if figures else ""
        )
        rows.append(
            f'<tr data-notebook="{name}" class="{html.escape(ch["status"].replace(" ", "-").lower())}">'
            f'<td class="chapter">{link}<div class="stem">{name}</div></td>'
            f'<td class="status">{html.escape(ch["status"])}</td><td class="seconds">{secs}</td>'
            f'<td class="figures"><div class="headline">{html.escape(ch["headline"] or "")}</div>{details}</td></tr>'
        )
    machine = summary.get("machine") or {}
    machine_rows = "".join(
        f'<dt>{html.escape(str(k))}</dt><dd data-key="{html.escape(str(k))}">'
        f"{html.escape(', '.join(map(str, v)) if isinstance(v, list) else str(v))}</dd>"
        for k, v in machine.items()
        if v is not None
    )
    machine_html = (
        f'<dl class="machine">{machine_rows}</dl>'
        if machine_rows
        else '<p class="machine">This run did not record its machine (a run folder from before run_course.py did).</p>'
    )
    n_ok = sum(ch["status"] == "ok" for ch in chapters)
    run = html.escape(
        f"preset {summary.get('preset', '?')}, nproc {summary.get('nproc', '?')}"
        + (f", started {summary['started']}" if summary.get("started") else "")
        + f"; {n_ok}/{len(chapters)} chapters ran in {summary.get('seconds', 0):.1f} s"
    )
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1.0">
<title>DistriNews course: executed run</title>
<style>
{CSS}
body {{ font-family: sans-serif; color: #222; }}
main.course-main {{ padding-top: 1em; }}
table {{ border-collapse: collapse; width: 100%; }}
th, td {{ border-bottom: 1px solid #ddd; padding: 6px 8px; text-align: left; vertical-align: top; }}
td.seconds {{ text-align: right; font-variant-numeric: tabular-nums; }}
th, td.status, td.seconds {{ white-space: nowrap; overflow-wrap: normal; }}  /* not "stat|us", "130.|2" */
tr.failed td.status {{ color: #b00; font-weight: bold; }}
tr.not-run {{ color: #888; }}
.stem {{ font-size: 80%; color: #888; }}
dl {{ display: grid; grid-template-columns: max-content minmax(0, 1fr); gap: 2px 1em; margin: 0.5em 0; }}
dt {{ color: #555; }} dd {{ margin: 0; min-width: 0; }}
.figures-wide {{ overflow-x: auto; max-width: 100%; }}
table.figures {{ width: auto; font-size: 90%; }}
table.figures th, table.figures td {{ padding: 2px 6px; font-variant-numeric: tabular-nums; }}
@media (max-width: 700px) {{
  /* the summary's own rows only (">"): a table of figures inside a cell stays a table, and scrolls */
  table.summary, table.summary > tbody, table.summary > tbody > tr, table.summary > tbody > tr > td {{
    display: block; width: auto; }}
  table.summary > thead {{ display: none; }}
  table.summary > tbody > tr {{ border-bottom: 1px solid #ccc; padding: 6px 0; }}
  table.summary > tbody > tr > td {{ border: none; padding: 2px 0; text-align: left; }}
  table.summary td.status::before {{ content: "status: "; color: #555; }}
  table.summary td.seconds::before {{ content: "seconds: "; color: #555; }}
  dl {{ grid-template-columns: minmax(0, 1fr); }}
}}
</style>
</head>
<body class="course-page">
{sidebar(chapters, None, [])}
<main class="course-main">
<h1>DistriNews: the executed course</h1>
<p class="run">{run}</p>
<table class="summary">
<thead><tr><th>chapter</th><th>status</th><th>seconds</th><th>key figures</th></tr></thead>
<tbody>
{chr(10).join(rows)}
</tbody>
</table>
<h2>The machine it ran on</h2>
{machine_html}
</main>
{JS}
</body>
</html>
"""


def render_site(run_dir: Path, site_dir: Path | None = None) -> Path:
    """Render run_dir's executed chapters and its summary.json into site_dir (default run_dir/site/); returns the
    index page. Chapters that did not run get a row but no page."""
    run_dir = Path(run_dir)
    summary_path = run_dir / "summary.json"
    if not summary_path.is_file():
        raise FileNotFoundError(
            f"{summary_path}: no summary.json here; is {run_dir} a folder scripts/run_course.py "
            "wrote (runs/<timestamp>/)?"
        )
    summary = json.loads(summary_path.read_text())
    site = Path(site_dir) if site_dir else run_dir / "site"
    site.mkdir(parents=True, exist_ok=True)

    chapters = []
    for entry in summary["notebooks"]:
        executed = run_dir / f"{entry['name']}.ipynb"
        nb = nbformat.read(str(executed), as_version=4) if executed.is_file() else None
        chapters.append(
            {
                "name": entry["name"],
                "status": entry["status"],
                "seconds": entry.get("seconds"),
                "headline": entry.get("headline", ""),
                "record": entry.get("record") or {},
                "title": chapter_title(nb) if nb else "",
                "nb": nb,
                "page": f"{entry['name']}.html" if nb else None,
            }
        )
    pages = [ch for ch in chapters if ch["page"]]
    for i, ch in enumerate(pages):
        prev = (pages[i - 1]["page"], pages[i - 1]["title"] or pages[i - 1]["name"]) if i > 0 else None
        nxt = (pages[i + 1]["page"], pages[i + 1]["title"] or pages[i + 1]["name"]) if i + 1 < len(pages) else None
        nb = ch["nb"]
        nb.metadata["title"] = ch["title"] or ch["name"]
        scrub = local_paths(run_dir, nb)
        body, _ = _exporter(scrub).from_notebook_node(
            nb,
            resources={
                "course_nav": nav_bar(prev, nxt),
                "course_run": _LocalPaths(replacements=scrub).scrub(run_line(nb)),
                "course_css": CSS,
                "course_js": JS,
            },
        )
        body, sections = add_section_ids(body)
        _write_offline(site / ch["page"], body.replace(SIDEBAR_SLOT, sidebar(chapters, ch["name"], sections), 1))
    index = site / "index.html"
    scrub = local_paths(run_dir, *(ch["nb"] for ch in pages))
    _write_offline(index, _LocalPaths(replacements=scrub).scrub(_index_page(summary, chapters)))
    return index


def _write_offline(path: Path, page: str) -> None:
    remote = remote_references(page)
    if remote:  # a new nbconvert version that adds a CDN script would break the offline promise silently
        raise RuntimeError(
            f"{path.name} would load from the internet: {', '.join(remote[:3])}; "
            "the site must work offline (see distrinews_course/site.py's template)"
        )
    path.write_text(page, encoding="utf-8")
