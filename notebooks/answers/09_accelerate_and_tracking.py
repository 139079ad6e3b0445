"""Chapter 09's reference answers (read only by its solution cells; see README.md here)."""

from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def my_scalars(run_dir, tag):
    """[(step, value), ...] for `tag` from the TensorBoard event files under run_dir / "tensorboard"."""
    events = EventAccumulator(str(Path(run_dir) / "tensorboard"))
    events.Reload()
    return sorted((e.step, e.value) for e in events.Scalars(tag))
