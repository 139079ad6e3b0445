"""distrinews_course: the course's own machinery, beside the library and never imported by it.

The notebooks' setup and launchers, chapter 03's ladder tooling (checker, race), the cost and memory models, the
plots and the static site; bench/ holds the benchmarks' machinery (harness, timing, provenance). It imports
distrinews_lib; distrinews_lib never imports it (tests/test_library.py checks both directions).
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the checkout: its scripts/, notebooks/ and configs/
