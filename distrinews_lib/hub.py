"""Is the Hugging Face hub reachable?  Answered in a few seconds at most, and remembered.

Offline, `datasets.load_dataset("ag_news")` retries for ~25 s before failing, so every hub
path asks this first. The probe is a real HTTPS request: a sandbox or proxy that accepts any
TCP connection must not pass for the hub.
"""

from __future__ import annotations

import os
import threading
import urllib.error
import urllib.request

HUB_URL = "https://huggingface.co/api/models/distilbert-base-uncased"
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
            with urllib.request.urlopen(os.environ.get("DISTRINEWS_HUB_URL", HUB_URL), timeout=timeout) as r:
                result[0] = r.status < 500
        except urllib.error.HTTPError as err:  # the hub answered (e.g. 401/404): it is reachable
            result[0] = err.code < 500
        except Exception:  # DNS failure, refused, timeout, TLS error: not reachable
            pass

    # DNS lookups ignore socket timeouts, so the probe runs in a thread we stop waiting for.
    t = threading.Thread(target=probe, daemon=True)
    t.start()
    t.join(timeout + 0.5)
    _cached = result[0]
    return _cached
