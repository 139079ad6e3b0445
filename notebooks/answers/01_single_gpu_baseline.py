"""Chapter 01's reference answers (read only by its solution cells; see README.md here)."""

import torch


def save_state(path, model, optimizer, epoch):
    """Save everything a run needs to continue after `epoch` (finished)."""
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}, path)


def load_state(path, model, optimizer):
    """Restore a save_state file into freshly built model and optimizer; return the epoch to continue with."""
    state = torch.load(path, weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])  # AdamW's moments and step counts
    return state["epoch"] + 1  # the saved epoch is finished
