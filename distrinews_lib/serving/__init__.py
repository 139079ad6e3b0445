"""Serve a trained DistriNews checkpoint over HTTP (FastAPI + uvicorn), with micro-batching.

    python -m distrinews_lib.serving --checkpoint checkpoints/distilbert_agnews.pt
    uvicorn distrinews_lib.serving.app:app --port 8000

Importing this package loads no model; see app.create_app.
"""

from .batching import MicroBatcher
from .schemas import MAX_BATCH_TEXTS, MAX_BODY_BYTES, MAX_TEXT_CHARS

__all__ = ["MicroBatcher", "MAX_BATCH_TEXTS", "MAX_BODY_BYTES", "MAX_TEXT_CHARS", "create_app"]


def create_app(*args, **kwargs):
    """distrinews_lib.serving.app.create_app (imported on first use: it pulls in FastAPI and torch)."""
    from .app import create_app as _create_app

    return _create_app(*args, **kwargs)
