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


def load_resharded(folder, model, optimizer):
    """Fill this world's sharded model and optimizer from a checkpoint saved on any number of ranks; return its
    training state."""
    import json

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)  # this world's shards: where each rank's slices go
    state = {"model": model_sd, "optim": optim_sd, "train": ""}
    dcp.load(state, checkpoint_id=folder)  # every rank reads the byte ranges that hold its slices
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return json.loads(state["train"])
