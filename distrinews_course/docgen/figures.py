"""The figures a page of documentation states, and whether a record holds each one.

A figure is a measured quantity a run produced: a number with a unit of time, a rate, a speedup, a percentage, a size,
or a count of passed tests or launches. A setting (a bound such as "at most 10 minutes", "within 15%"), a date, a
version, a command (code is left out) and a file name are not figures. Each figure must be held by one of the records
its section cites (a benchmarks/*.json path named between its heading and the next), as stored or in the units the
page uses (a fraction as a percentage, seconds as minutes or milliseconds, bytes as MiB), at the precision shown.

    unbacked(Path("README.md").read_text(), "README.md")   # [] when every figure traces to a record
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from .. import ROOT

UNIT = (
    r"(?:%|x(?![\w-])|×|ms\b|µs\b|us\b|s\b|seconds?\b|min\b|minutes?\b|hours?\b|CPU-s\b|KiB\b|MiB\b|GiB\b|KB\b|MB\b|"
    r"GB\b|TB\b|kB\b|(?:samples|req|requests|texts|tokens|TFLOP|GB|MB|TB)/s\b|Mbit/s\b|Gbit/s\b|"
    r"passed\b|failed\b|launches\b|aborted\b)"
)
NUMBER = r"(?<![\w.\-/#])(\d{1,3}(?:,\d{3})+|\d+)(?:\.(\d+))?"
FIGURE = re.compile(NUMBER + r"\s?(" + UNIT + ")")
# Words that make the number after them a bound or a setting, not a measurement.
BOUND = re.compile(
    r"(?:within|at most|at least|under|up to|below|above|over|every|limit|budget|max|less than|more than|"
    r"each|per|of at most|than)\s+(?:about\s+|~)?$",
    re.I,
)
RECORD = re.compile(r"benchmarks/[\w.\-]+\.json")
# Generated blocks that quote the code's own docstrings (what a module does, with its settings: "15% masked tokens",
# "retries for ~25 s"); their numbers are the code's settings, not measurements, and no record is meant to hold them.
QUOTES_CODE = ("layout-detail",)
# The units a record may store a figure in, by the unit the page writes it with: a fraction shown as a percentage,
# seconds shown as minutes or milliseconds, bytes shown as MiB; a speedup or a count as it is.
TIME = (1, 1000, 0.001, 1e6, 1e-6, 1 / 60, 60, 1 / 3600)
SIZE = (1, 2**-10, 2**-20, 2**-30, 1e-3, 1e-6, 1e-9, 2**10, 2**20)
SCALES = {"%": (1, 100), "x": (1,), "×": (1,), "time": TIME, "size": SIZE, "rate": (1, 1e-3, 1e-6, 1e-9, 1e3, 1e6)}


def _kind(unit: str) -> str:
    if unit in ("%", "x", "×"):
        return unit
    if re.fullmatch(r"ms|µs|us|s|seconds?|min|minutes?|hours?|CPU-s", unit):
        return "time"
    if unit.endswith("/s"):
        return "rate"
    if unit.endswith("B"):
        return "size"
    return "count"


@dataclass
class Figure:
    text: str  # as the page writes it: "1.65x", "699 s"
    value: float
    decimals: int
    unit: str
    section: str  # the heading it sits under
    records: tuple  # the records its section cites


def prose(markdown: str) -> str:
    """markdown without what is not prose: fenced code, inline code, HTML comments, link targets."""
    text = re.sub(r"```.*?```", lambda m: "\n" * m.group(0).count("\n"), markdown, flags=re.S)
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    text = re.sub(r"`[^`\n]*`", "``", text)
    return re.sub(r"\]\([^)]*\)", "]()", text)


def sections(markdown: str) -> list[tuple[str, str]]:
    """[(heading, body)] of a page, the text before its first heading under ''."""
    out, heading, body = [], "", []
    in_code = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if not in_code and re.match(r"#{1,6} ", line):
            out.append((heading, "\n".join(body)))
            heading, body = line.lstrip("# ").strip(), []
        else:
            body.append(line)
    out.append((heading, "\n".join(body)))
    return out


def figures(markdown: str) -> list[Figure]:
    """Every figure the page states, with the records its section cites."""
    found = []
    for heading, body in sections(markdown):
        cited = tuple(sorted(set(RECORD.findall(body))))
        text = prose(body)
        for m in FIGURE.finditer(text):
            if BOUND.search(text[max(0, m.start() - 20) : m.start()]):
                continue
            whole, frac = m.group(1).replace(",", ""), m.group(2)
            value = float(whole + ("." + frac if frac else ""))
            found.append(Figure(m.group(0), value, len(frac or ""), m.group(3), heading, cited))
    return found


def _numbers(obj, out: set) -> set:
    if isinstance(obj, bool):
        return out
    if isinstance(obj, (int, float)):
        out.add(float(obj))
    elif isinstance(obj, str):
        out.update(float(n.replace(",", "")) for n in re.findall(r"\d[\d,]*(?:\.\d+)?", obj) if n[-1] != ",")
    elif isinstance(obj, dict):
        for v in obj.values():
            _numbers(v, out)
    elif isinstance(obj, list):
        for v in obj:
            _numbers(v, out)
    return out


@lru_cache(maxsize=None)
def record_numbers(path: str, root: Path = ROOT) -> frozenset:
    """Every number a record holds, in its values and in the text of its strings."""
    file = root / path
    if not file.is_file():
        return frozenset()
    return frozenset(_numbers(json.loads(file.read_text()), set()))


def held(fig: Figure, numbers) -> bool:
    """Does one of `numbers`, in some unit the page may use, round to the figure as shown?"""
    for n in numbers:
        for scale in SCALES.get(_kind(fig.unit), (1,)):
            if round(n * scale, fig.decimals) == fig.value:
                return True
    return False


def unbacked(markdown: str, page: str, root: Path = ROOT) -> list[str]:
    """One line per figure on the page that no record its section cites holds."""
    for name in QUOTES_CODE:
        markdown = re.sub(rf"^<!-- generated: {name} -->$.*?^<!-- end: {name} -->$", "", markdown, flags=re.S | re.M)
    problems = []
    for fig in figures(markdown):
        where = f"{page}: '{fig.text}' under '{fig.section or '(top)'}'"
        if not fig.records:
            problems.append(f"{where} cites no record (name the benchmarks/*.json that holds it in its section)")
            continue
        missing = [r for r in fig.records if not (root / r).is_file()]
        if missing:
            problems.append(f"{where}: {', '.join(missing)} does not exist")
            continue
        numbers = set().union(*(record_numbers(r, root) for r in fig.records))
        if not held(fig, numbers):
            problems.append(f"{where} is in none of {', '.join(fig.records)}")
    return problems
