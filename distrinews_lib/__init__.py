"""distrinews_lib: the plumbing behind the DistriNews course.

The DDP ideas stay in the course's scripts; this package holds what is not the lesson:
data, models, the shared training loop, checkpoints, metrics, launching and serving.
"""

__version__ = "0.1.0"

# AG News classes, in the order of the original classes.txt (label index 0..3).
LABEL_NAMES = ["World", "Sports", "Business", "Sci/Tech"]
