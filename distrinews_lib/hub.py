"""Is the Hugging Face hub reachable?  Answered in a few seconds at most, and remembered.

Offline, `datasets.load_dataset("ag_news")` retries for ~25 s before failing, so every hub
path asks this first.
"""

from __future__ import annotations

import os
import socket
import threading

HUB_HOST = "huggingface.co"
_cached: bool | None = None


def _env_says_offline() -> bool:
    return any(os.environ.get(v, "").lower() in ("1", "true", "yes") for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "DISTRINEWS_OFFLINE"))


def hub_reachable(timeout: float = 3.0) -> bool:
    global _cached
    if _env_says_offline():
        return False
    if _cached is not None:
        return _cached
    result = [False]

    def probe():
        try:
            with socket.create_connection((os.environ.get("DISTRINEWS_HUB_HOST", HUB_HOST), 443), timeout=timeout):
                result[0] = True
        except OSError:
            pass

    # DNS lookups ignore the socket timeout, so the probe runs in a thread we stop waiting for.
    t = threading.Thread(target=probe, daemon=True)
    t.start()
    t.join(timeout)
    _cached = result[0]
    return _cached
