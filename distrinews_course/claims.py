"""A claim a chapter makes about the figures its run just produced: checked, or, where this run cannot decide it (other
programs took the cores, the rounds disagreed), shown with one line that says why.

    claim = Claim("at 64 per process the model is within 15% of the measurement", holds=abs(r - 1) < 0.15)
    settle(claim)                        # 'checked: ...' or the notebook fails with 'claim failed: ...'
    settle(Claim(text, holds, unchecked="other programs used 0.6 cores during its runs"))   # 'NOTE: ...'
    settle_folded(claims, "facts of the box (the link read back, ...)")  # all hold: ONE line, the rest folded

The decision of whether a figure holds, and whether the run could tell, lives in the function that builds the Claim
(with a docstring that says why its margin is what it is); the notebook cell only settles it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .notebook import check


@dataclass(frozen=True)
class Claim:
    text: str  # what the run shows, with its own figures
    holds: bool  # whether those figures support it
    unchecked: str | None = None  # why this run cannot check it; None: it is checked

    @property
    def checked(self) -> bool:
        return self.unchecked is None


def settle(claims) -> None:
    """Check each claim (a failed one fails the notebook), or print the one line saying why this run cannot."""
    for claim in [claims] if isinstance(claims, Claim) else claims:
        if claim.checked:
            check(claim.holds, claim.text)
        else:
            print(f"NOTE: not checked on this run ({claim.unchecked}): {claim.text}")


def folded(summary: str, body: str) -> str:
    """Markdown for display(Markdown(...)): `summary` as one visible line, `body` (plain-text lines: a table, the
    checked lines) in a folded <details> that the learner opens on purpose."""
    return f"{summary}\n\n<details><summary>show the lines</summary>\n\n```\n{body}\n```\n</details>"


def checked_fold(claims, what: str) -> str | None:
    """The checked claims, all holding, as ONE line ('checked: 3 of 3 <what> - details folded') and their full
    'checked: ...' lines folded; None where none is checked. A failed claim is never folded: ValueError."""
    checked = [c for c in claims if c.checked]
    if any(not c.holds for c in checked):
        raise ValueError("a failed claim is shown unfolded: settle() it")
    if not checked:
        return None
    n = len(checked)
    return folded(f"checked: {n} of {n} {what} - details folded", "\n".join(f"checked: {c.text}" for c in checked))


def settle_folded(claims, what: str) -> None:
    """settle(), shorter on the page. Where every checked claim holds: the NOTE lines of those this run cannot decide
    (visible, as settle prints them), then checked_fold's one line with the 'checked: ...' lines folded. Where any
    fails: every line unfolded, exactly as settle() prints them, and the notebook fails on the first failed claim."""
    claims = [claims] if isinstance(claims, Claim) else list(claims)
    if any(c.checked and not c.holds for c in claims):
        settle(claims)
        return
    settle([c for c in claims if not c.checked])
    fold = checked_fold(claims, what)
    if fold:
        show(fold)


def show(markdown: str) -> None:
    """Display Markdown in the notebook (a fold's <details> stays folded there and on the site)."""
    from IPython.display import Markdown, display

    display(Markdown(markdown))


def show_folded(summary: str, body: str) -> None:
    """folded(summary, body), displayed: one visible line, the lines of `body` folded."""
    show(folded(summary, body))


def written_by_launch(path, metadata: dict, started_s: float, seconds: float, expected: dict, slack_s=1.0) -> Claim:
    """A checkpoint is this launch's, judged from outside the program that wrote it: the file system dates the file
    inside the launch (from `started_s`, the notebook's time.time() just before it, to `seconds` later; slack_s for
    the clock's rounding), and the settings the file records equal those the notebook passed (`expected`, e.g.
    {"preset": "cpu_smoke", "world_size": 2}). A file left by an earlier run, or by a run with other settings, fails."""
    after = Path(path).stat().st_mtime - started_s
    wrong = {k: metadata.get(k) for k, v in expected.items() if metadata.get(k) != v}
    said = ", ".join(f"{k} {v}" for k, v in expected.items())
    return Claim(
        f"the checkpoint was written by this launch ({after:.0f} s in) with its {said}"
        + (f"; it records {wrong}" if wrong else ""),
        -slack_s <= after <= seconds + slack_s and not wrong,
    )
