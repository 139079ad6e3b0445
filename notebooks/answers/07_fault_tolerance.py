"""Chapter 07's reference answers (read only by its solution cells; see README.md here)."""

from distrinews_lib.training import snapshot


def redone_steps(kill_step, every):
    """Steps trained twice: those after the newest snapshot before the kill (the last multiple of `every`)."""
    return kill_step - kill_step // every * every


def pick_snapshot(run_dir):
    """The newest snapshot of run_dir that can be read, or None (the run then starts from the beginning)."""
    for path in reversed(snapshot.list_snapshots(run_dir)):  # newest first: by name, i.e. epoch then batch
        try:
            snapshot.read_snapshot(path, mmap=True)  # mapping the file is enough to tell a damaged one
        except snapshot.SnapshotError:
            continue
        return path
    return None
