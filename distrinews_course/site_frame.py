"""What every page of the course's site shares around its content (distrinews_course/site.py renders the pages):
the stylesheet, the sidebar with the chapters and the current page's sections, the bars to move between chapters,
and the one line that says what papermill ran a chapter with. Plain strings of HTML, no nbconvert: each piece is
small enough to read at a glance and is checked in a real browser by tests/test_course_site.py."""

from __future__ import annotations

import html
import re

# Shared by the index and the chapters: a sidebar beside the page on a wide screen, above it on a phone; code and
# outputs wrap inside their cell; wide tables and figures scroll or shrink inside the page, never past it.
CSS = """
html { overflow-wrap: anywhere; }
body.course-page { margin: 0; }
nav.course-sidebar { font-family: sans-serif; font-size: 14px; line-height: 1.35; background: #f6f7f9;
  border-bottom: 1px solid #ddd; padding: 10px 14px; box-sizing: border-box; }
nav.course-sidebar a { color: #1a5fb4; text-decoration: none; }
nav.course-sidebar a:hover { text-decoration: underline; }
nav.course-sidebar .home { font-weight: bold; display: block; margin-bottom: 6px; }
nav.course-sidebar summary { cursor: pointer; color: #555; font-weight: bold; margin: 6px 0 2px; }
nav.course-sidebar ol { margin: 2px 0 8px; padding-left: 1.6em; }
nav.course-sidebar li { margin: 3px 0; }
nav.course-sidebar li.current > a { color: #222; font-weight: bold; }
nav.course-sidebar li.not-run { color: #888; }
nav.course-sidebar .label { color: #555; font-weight: bold; margin: 10px 0 2px; }
main.course-main { box-sizing: border-box; padding: 0 12px 24px; max-width: 1100px; }
nav.course-nav { font-family: sans-serif; padding: 10px 0; display: flex; flex-wrap: wrap; gap: 4px 1.5em; }
nav.course-nav a { color: #1a5fb4; text-decoration: underline; }
p.course-run { font-family: sans-serif; color: #555; font-size: 13px; margin: 0 0 8px; }
details.solution { border-left: 3px solid #e0a800; margin: 8px 0; padding-left: 6px; }
details.solution > summary { cursor: pointer; font-family: sans-serif; color: #8a6100; padding: 4px 0; }
details.fold > summary { cursor: pointer; font-family: sans-serif; color: #555; padding: 4px 0; }
.jp-InputArea-editor pre, .jp-OutputArea-output pre, pre { white-space: pre-wrap; overflow-wrap: anywhere; }
.jp-Cell, .jp-Cell-inputWrapper, .jp-Cell-outputWrapper, .jp-InputArea, .jp-OutputArea-child,
.jp-OutputArea-output, .jp-InputArea-editor { min-width: 0; max-width: 100%; }
.jp-OutputArea-output img, .jp-RenderedHTMLCommon img { max-width: 100%; height: auto; }
.jp-RenderedHTMLCommon table, table.summary { display: block; overflow-x: auto; max-width: 100%; }
@media (min-width: 900px) {
  nav.course-sidebar { position: fixed; top: 0; bottom: 0; left: 0; width: 250px; overflow-y: auto;
    border-bottom: none; border-right: 1px solid #ddd; }
  main.course-main { margin-left: 250px; padding: 0 28px 32px; }
}
@media (max-width: 700px) {
  .jp-InputPrompt, .jp-OutputPrompt { display: none; }
  .jp-Cell { padding: 2px 0; }
}
"""

# Open the sidebar's lists where there is room for them (on a phone they start folded above the page).
JS = """<script>
if (window.matchMedia("(min-width: 900px)").matches)
  document.querySelectorAll("nav.course-sidebar details").forEach(function (d) { d.open = true; });
</script>"""

SIDEBAR_SLOT = "<!--course-sidebar-->"


def nav_bar(prev: tuple[str, str] | None, nxt: tuple[str, str] | None) -> str:
    links = ['<a href="index.html">Course index</a>']
    if prev:
        links.append(f'<a href="{prev[0]}">&larr; {html.escape(prev[1])}</a>')
    if nxt:
        links.append(f'<a href="{nxt[0]}">{html.escape(nxt[1])} &rarr;</a>')
    return '<nav class="course-nav">' + "".join(links) + "</nav>"


def run_line(nb) -> str:
    """What the chapter ran with (papermill's injected parameters), in one line instead of a second cell."""
    params = (nb.metadata.get("papermill") or {}).get("parameters") or {}
    if not params:
        return ""
    shown = ", ".join(f"{k} = {v!r}" for k, v in params.items())
    return f'<p class="course-run">Executed with {html.escape(shown)}</p>'


_HEADING = re.compile(r"<h2>(.*?)</h2>", re.S)


def add_section_ids(body: str) -> tuple[str, list[tuple[str, str]]]:
    """Give every h2 of the page an id; return the page and its sections (id, heading text)."""
    sections, used = [], set()

    def named(match):
        text = re.sub(r"<[^>]+>", "", match.group(1)).strip()
        slug = re.sub(r"[^a-z0-9]+", "-", html.unescape(text).lower()).strip("-") or "section"
        base, n = slug, 2
        while slug in used:
            slug, n = f"{base}-{n}", n + 1
        used.add(slug)
        sections.append((slug, text))
        return f'<h2 id="{slug}">{match.group(1)}</h2>'

    return _HEADING.sub(named, body), sections


def sidebar(chapters: list[dict], current: str | None, sections: list[tuple[str, str]]) -> str:
    """The course's chapters (the current one marked) and the current chapter's sections."""
    items = []
    for ch in chapters:
        title = html.escape(ch["title"] or ch["name"])
        if ch["page"]:
            cls = ' class="current"' if ch["name"] == current else ""
            aria = ' aria-current="page"' if ch["name"] == current else ""
            items.append(f'<li{cls}><a href="{html.escape(ch["page"])}"{aria}>{title}</a></li>')
        else:
            items.append(f'<li class="not-run">{title} (not run)</li>')
    parts = [
        '<nav class="course-sidebar" aria-label="course">',
        '<a class="home" href="index.html">DistriNews course</a>',
        f'<details class="chapters"><summary>Chapters</summary><ol>{"".join(items)}</ol></details>',
    ]
    if sections:
        links = "".join(f'<li><a href="#{slug}">{text}</a></li>' for slug, text in sections)
        parts.append(f'<details class="sections"><summary>On this page</summary><ol>{links}</ol></details>')
    parts.append("</nav>")
    return "\n".join(parts)
