"""The executed course as a static site: one page per chapter and an index, readable offline.

    from distrinews_lib.course.site import render_site
    index = render_site(Path("runs/20260101-120000"))   # -> runs/20260101-120000/site/index.html

scripts/run_course.py --html calls this after a run (--html-only RUN_DIR on an earlier one). The input is the run
folder as the runner leaves it: the executed notebooks and summary.json (status, seconds, headline, record and the
machine of every chapter). The pages are nbconvert's JupyterLab look with every script that nbconvert would load
from the internet (require.js, MathJax, mermaid) left out, the plots embedded as data: URIs, and the cells tagged
`hide` (the chapters' record cells: plumbing, not lesson) removed. Nothing on a page refers to another host.
"""

from __future__ import annotations

import html
import json
import re
from html.parser import HTMLParser
from pathlib import Path

# nbconvert, jinja2 and traitlets come with the course's Jupyter stack: imported here, not by the core.
import nbformat
from jinja2 import DictLoader
from nbconvert import HTMLExporter
from traitlets.config import Config

HIDDEN_TAG = "hide"

# nbconvert's lab template with its CDN scripts taken out (the course's markdown has no maths or mermaid
# diagrams; a page that waited on a CDN would show nothing offline), and a bar to move between the chapters.
_TEMPLATE = """{%- extends 'index.html.j2' -%}
{%- block html_head_js -%}{%- endblock html_head_js -%}
{%- block jupyter_widgets -%}{%- endblock jupyter_widgets -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
{%- block extra_css -%}
<style type="text/css">
nav.course-nav { font-family: sans-serif; padding: 8px 16px; border-bottom: 1px solid #ddd; }
nav.course-nav a { margin-right: 1.5em; color: #1a5fb4; text-decoration: underline; }
</style>
{%- endblock extra_css -%}
{%- block body_header -%}
{{ super() }}
{{ resources.course_nav }}
{%- endblock body_header -%}
"""


def _exporter() -> HTMLExporter:
    c = Config()
    c.TagRemovePreprocessor.enabled = True
    c.TagRemovePreprocessor.remove_cell_tags = {HIDDEN_TAG}
    c.HTMLExporter.preprocessors = ["nbconvert.preprocessors.TagRemovePreprocessor"]
    return HTMLExporter(config=c, template_name="lab", extra_loaders=[DictLoader({"course.html.j2": _TEMPLATE})],
                        template_file="course.html.j2", embed_images=True, exclude_anchor_links=True)


def chapter_title(nb) -> str:
    """The notebook's first markdown heading, without its #s."""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("#"):
                    return line.lstrip("#").strip()
    return ""


def _nav(prev: tuple[str, str] | None, nxt: tuple[str, str] | None) -> str:
    links = ['<a href="index.html">Course index</a>']
    if prev:
        links.append(f'<a href="{prev[0]}">&larr; {html.escape(prev[1])}</a>')
    if nxt:
        links.append(f'<a href="{nxt[0]}">{html.escape(nxt[1])} &rarr;</a>')
    return '<nav class="course-nav">' + "".join(links) + "</nav>"


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
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _index_page(summary: dict, chapters: list[dict]) -> str:
    rows = []
    for ch in chapters:
        name = html.escape(ch["name"])
        title = html.escape(ch["title"] or ch["name"])
        link = f'<a href="{html.escape(ch["page"])}">{title}</a>' if ch["page"] else title
        secs = f'{ch["seconds"]:.1f}' if ch["seconds"] is not None else "-"
        figures = "".join(f'<dt>{html.escape(k)}</dt><dd data-key="{html.escape(k)}" '
                          f'data-value="{html.escape(json.dumps(v))}">{html.escape(_fmt(v))}</dd>'
                          for k, v in ch["record"].items() if k not in ("headline", "notebook"))
        details = f"<details><summary>all figures</summary><dl class=\"figures\">{figures}</dl></details>" if figures else ""
        rows.append(f'<tr data-notebook="{name}" class="{html.escape(ch["status"].replace(" ", "-").lower())}">'
                    f'<td class="chapter">{link}<div class="stem">{name}</div></td>'
                    f'<td class="status">{html.escape(ch["status"])}</td><td class="seconds">{secs}</td>'
                    f'<td class="figures"><div class="headline">{html.escape(ch["headline"] or "")}</div>{details}</td></tr>')
    machine = summary.get("machine") or {}
    machine_rows = "".join(f'<dt>{html.escape(str(k))}</dt><dd data-key="{html.escape(str(k))}">'
                           f'{html.escape(", ".join(map(str, v)) if isinstance(v, list) else str(v))}</dd>'
                           for k, v in machine.items() if v is not None)
    machine_html = f'<dl class="machine">{machine_rows}</dl>' if machine_rows else \
        '<p class="machine">This run did not record its machine (a run folder from before run_course.py did).</p>'
    n_ok = sum(ch["status"] == "ok" for ch in chapters)
    run = html.escape(f'preset {summary.get("preset", "?")}, nproc {summary.get("nproc", "?")}'
                      + (f', started {summary["started"]}' if summary.get("started") else "")
                      + f'; {n_ok}/{len(chapters)} chapters ran in {summary.get("seconds", 0):.1f} s')
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1.0">
<title>DistriNews course: executed run</title>
<style>
body {{ font-family: sans-serif; max-width: 1100px; margin: 2em auto; padding: 0 1em; color: #222; }}
table {{ border-collapse: collapse; width: 100%; }}
th, td {{ border-bottom: 1px solid #ddd; padding: 6px 8px; text-align: left; vertical-align: top; }}
td.seconds {{ text-align: right; font-variant-numeric: tabular-nums; }}
tr.failed td.status {{ color: #b00; font-weight: bold; }}
tr.not-run {{ color: #888; }}
.stem {{ font-size: 80%; color: #888; }}
dl {{ display: grid; grid-template-columns: max-content auto; gap: 2px 1em; margin: 0.5em 0; }}
dt {{ color: #555; }} dd {{ margin: 0; }}
</style>
</head>
<body>
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
</body>
</html>
"""


def render_site(run_dir: Path, site_dir: Path | None = None) -> Path:
    """Render run_dir's executed chapters and its summary.json into site_dir (default run_dir/site/); returns the
    index page. Chapters that did not run get a row but no page."""
    run_dir = Path(run_dir)
    summary_path = run_dir / "summary.json"
    if not summary_path.is_file():
        raise FileNotFoundError(f"{summary_path}: no summary.json here; is {run_dir} a folder scripts/run_course.py "
                                "wrote (runs/<timestamp>/)?")
    summary = json.loads(summary_path.read_text())
    site = Path(site_dir) if site_dir else run_dir / "site"
    site.mkdir(parents=True, exist_ok=True)

    chapters = []
    for entry in summary["notebooks"]:
        executed = run_dir / f"{entry['name']}.ipynb"
        nb = nbformat.read(str(executed), as_version=4) if executed.is_file() else None
        chapters.append({"name": entry["name"], "status": entry["status"], "seconds": entry.get("seconds"),
                         "headline": entry.get("headline", ""), "record": entry.get("record") or {},
                         "title": chapter_title(nb) if nb else "", "nb": nb,
                         "page": f"{entry['name']}.html" if nb else None})
    pages = [ch for ch in chapters if ch["page"]]
    exporter = _exporter()
    for i, ch in enumerate(pages):
        prev = (pages[i - 1]["page"], pages[i - 1]["title"] or pages[i - 1]["name"]) if i > 0 else None
        nxt = (pages[i + 1]["page"], pages[i + 1]["title"] or pages[i + 1]["name"]) if i + 1 < len(pages) else None
        ch["nb"].metadata["title"] = ch["title"] or ch["name"]
        body, _ = exporter.from_notebook_node(ch["nb"], resources={"course_nav": _nav(prev, nxt)})
        _write_offline(site / ch["page"], body)
    index = site / "index.html"
    _write_offline(index, _index_page(summary, chapters))
    return index


def _write_offline(path: Path, page: str) -> None:
    remote = remote_references(page)
    if remote:  # a new nbconvert version that adds a CDN script would break the offline promise silently
        raise RuntimeError(f"{path.name} would load from the internet: {', '.join(remote[:3])}; "
                           "the site must work offline (see distrinews_lib/course/site.py's template)")
    path.write_text(page, encoding="utf-8")
