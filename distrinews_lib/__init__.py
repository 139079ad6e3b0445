"""distrinews_lib: the plumbing behind the DistriNews course.

The DDP ideas stay in the course's scripts; this package holds what is not the lesson. Its layout is its
architecture: the core the training scripts import (distributed.py, errors.py, files.py, hub.py, machine.py and
the packages training/, data/, models/), and beside it, depending on the core and never the reverse, course/
(the notebooks' tooling), bench/ (benchmarking) and serving/ (the HTTP server).
"""

__version__ = "0.1.0"
