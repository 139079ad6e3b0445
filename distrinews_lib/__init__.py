"""distrinews_lib: the plumbing behind the DistriNews course's training scripts, its server and a learner's own script.

The DDP ideas stay in the course's scripts; this package holds what is not the lesson. Its layout is its
architecture: the core the training scripts import (distributed.py, errors.py, files.py, hub.py, machine.py,
checkpoint.py and the packages training/, data/, models/), and beside it, depending on the core and never the
reverse, lm/ (language modelling as a task) and serving/ (the HTTP server). The course's own machinery (checkers,
races, cost models, site, launchers) and the benchmarks' are another package, distrinews_course, which imports this
one and is never imported by it.
"""

__version__ = "0.1.0"
