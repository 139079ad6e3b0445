"""The generated blocks of a Markdown page: the text between `<!-- generated: NAME -->` and `<!-- end: NAME -->`,
which scripts/make_docs.py rewrites and nothing else touches."""

from __future__ import annotations

import re
from typing import Callable

# A marker is a line of its own, so a page may quote one inside a sentence (as docs/layout.md quotes this module).
BLOCK = re.compile(r"^(<!-- generated: ([\w-]+) -->\n)(.*?)^(<!-- end: \2 -->)$", re.S | re.M)
OPENED = re.compile(r"^<!-- generated: ([\w-]+) -->$", re.M)


class BlockError(Exception):
    """A page's markers are broken or name a block nobody generates."""


def names(text: str) -> list[str]:
    return [m.group(2) for m in BLOCK.finditer(text)]


def rewrite(text: str, make: dict[str, Callable[[], str]], page: str = "page") -> str:
    """text with every block's body replaced by make[NAME]()."""
    opened = OPENED.findall(text)
    if sorted(opened) != sorted(names(text)):
        raise BlockError(f"{page}: a '<!-- generated: NAME -->' without its '<!-- end: NAME -->' ({opened})")
    unknown = [n for n in names(text) if n not in make]
    if unknown:
        raise BlockError(f"{page}: no generator for block(s) {', '.join(unknown)}; known: {', '.join(sorted(make))}")
    return BLOCK.sub(lambda m: m.group(1) + make[m.group(2)]().strip("\n") + "\n" + m.group(4), text)


def stale(text: str, make: dict[str, Callable[[], str]], page: str = "page") -> list[str]:
    """The names of the blocks whose body differs from what make[NAME]() generates now."""
    fresh = dict((m.group(2), m.group(3)) for m in BLOCK.finditer(rewrite(text, make, page)))
    return [m.group(2) for m in BLOCK.finditer(text) if fresh[m.group(2)] != m.group(3)]
