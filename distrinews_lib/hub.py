"""Is the Hugging Face hub reachable (asked first: offline, load_dataset retries for ~25 s)? And its local
cache. The probe is a real HTTPS request: a proxy that accepts any TCP connection must not pass for the hub."""

from __future__ import annotations

import glob
import os
import re
import threading
import urllib.error
import urllib.request

HUB_URL = "https://huggingface.co/api/models/distilbert-base-uncased"
_cached: bool | None = None


def env_says_offline() -> bool:
    """HF_HUB_OFFLINE / HF_DATASETS_OFFLINE / DISTRINEWS_OFFLINE set to 1: never touch the network."""
    return any(
        os.environ.get(v, "").lower() in ("1", "true", "yes")
        for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "DISTRINEWS_OFFLINE")
    )


def hub_reachable(timeout: float = 3.0) -> bool:
    global _cached
    if env_says_offline():
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


# Offline compute nodes: the cache is filled on a login node, then runs use HF_HUB_OFFLINE=1 (nothing probed).


def _hf_home() -> str:
    return os.path.expanduser(
        os.environ.get("HF_HOME")
        or os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache"), "huggingface")
    )


def datasets_cache_dir() -> str:
    """Where `datasets` keeps prepared datasets, read from the environment now (not when datasets was imported)."""
    return os.path.expanduser(os.environ.get("HF_DATASETS_CACHE") or os.path.join(_hf_home(), "datasets"))


def models_cache_dir() -> str:
    """Where huggingface_hub keeps downloaded repositories (models), read from the environment now."""
    return os.path.expanduser(
        os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE") or os.path.join(_hf_home(), "hub")
    )


def dataset_cache_folder(repo_id: str, cache_dir: str | None = None) -> str:
    """The folder `datasets` prepares `repo_id` in: <cache>/<owner>___<name>.

    See datasets' CachedDatasetModuleFactory.
    """
    parts = repo_id.split("/")
    name = parts[-1]
    # datasets' camelcase_to_snakecase, for names such as "AgNews"
    name = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)
    name = re.sub(r"([a-z\d])([A-Z])", r"\1_\2", name).lower()
    return os.path.join(cache_dir or datasets_cache_dir(), "___".join(parts[:-1] + [name]))


def dataset_cached(repo_id: str, cache_dir: str | None = None) -> bool:
    """Does the datasets cache hold a prepared copy of repo_id?

    That is a <folder>/<config>/<version>/<hash>/dataset_info.json.
    """
    return any(
        os.path.isfile(os.path.join(p, "dataset_info.json"))
        for p in glob.glob(os.path.join(dataset_cache_folder(repo_id, cache_dir), "*", "*", "*"))
    )


def dataset_download_command(repo_id: str) -> str:
    return f"HF_HOME={_hf_home()} python -c \"from datasets import load_dataset; load_dataset('{repo_id}')\""


def model_download_command(repo_id: str) -> str:
    return f"HF_HOME={_hf_home()} hf download {repo_id}"


def hub_cache_name(spec, repo_id: str) -> str | None:
    """The name under which the datasets cache holds repo_id (or one of its older aliases), or None."""
    for name in (repo_id, *(spec.cache_aliases if spec else ())):
        if dataset_cached(name):
            return name
    return None
