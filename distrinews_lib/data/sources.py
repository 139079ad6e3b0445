"""Where a dataset comes from. --dataset: a known one (ag_news, imdb, amazon_polarity, yelp_polarity),
hub:OWNER/NAME, a FOLDER (layouts in readers.py) or csv:PATH. --data for a known one: hub (or its cache
offline), a folder, embedded (a real AG News sample in the package), synthetic (AG News shaped, only when
asked for), or auto: the hub when reachable, else $DISTRINEWS_DATA_DIR, else the hub cache, else embedded
(decided once, on rank 0, by the run plan).
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import UserError
from ..hub import (
    dataset_download_command,
    datasets_cache_dir,
    env_says_offline,
    hub_cache_name,
    hub_reachable,
)
from .readers import load_folder
from .texts import (
    DATASETS,
    TextOptions,
    TextSplits,
    known_datasets_text,
    take_subsets,
)

EMBEDDED_DIR = Path(__file__).resolve().parent.parent / "assets" / "ag_news_sample"


def load_embedded() -> TextSplits:
    """The real AG News sample inside the package: offline, and real news (see assets/ag_news_sample/README.md)."""
    splits = load_folder(EMBEDDED_DIR)
    splits.source, splits.detail = "embedded", "real AG News sample shipped in distrinews_lib/assets/ag_news_sample"
    return splits


def resolve_dataset(dataset: str) -> str:
    """--dataset as the plan records it: a known key, 'hub:OWNER/NAME', 'folder:/abs/path' or 'csv:/abs/path'."""
    dataset = (dataset or "ag_news").strip()
    if dataset.lower() in DATASETS:
        return dataset.lower()
    if dataset.startswith("csv:"):
        path = Path(dataset[4:]).expanduser()
        if not dataset[4:] or not path.exists():
            raise UserError(
                f"--dataset {dataset}: no such file or folder. csv:PATH takes a CSV file with a header row, or "
                "a folder holding train.csv and test.csv."
            )
        return f"csv:{path.resolve()}"
    if dataset.startswith("hub:"):
        if dataset[4:].count("/") != 1:
            raise UserError(f"--dataset {dataset}: a hub id has the form hub:OWNER/NAME (e.g. hub:stanfordnlp/imdb).")
        return dataset
    path = Path(dataset).expanduser()
    if path.is_dir():
        return f"folder:{path.resolve()}"
    if dataset.count("/") == 1 and not dataset.startswith((".", "/", "~")) and not path.exists():
        known = next((k for k, s in DATASETS.items() if s.hub_id == dataset), None)
        return known or f"hub:{dataset}"
    raise UserError(
        f"--dataset {dataset}: not a dataset the course knows and not a folder. Choices: {known_datasets_text()}."
    )


DATA_DIR_ENV = "DISTRINEWS_DATA_DIR"


def data_dir(folder: str | None = None, flag: str = "--data", choices: tuple = ()) -> str | None:
    """THE rule for where the AG News folder is, for every script: a folder given on the command line (`flag`)
    wins; else $DISTRINEWS_DATA_DIR (set and not empty); else None, and the caller falls back to its default (the
    hub, its cache or the embedded sample). A folder named either way must exist: a wrong one stops with a message
    that says where it came from, never a quiet fallback. Returns the folder as an absolute path."""
    if folder:
        given, origin = folder, f"{flag} {folder}"
        instead = f", or one of {', '.join(choices)}" if choices else ""
    else:
        given = os.environ.get(DATA_DIR_ENV)
        origin, instead = f"{DATA_DIR_ENV}={given}", ", or unset it to use the real AG News sample in distrinews_lib"
    if not given:
        return None
    path = Path(given).expanduser()
    if not path.is_dir():
        why = "is not a folder" if path.exists() else "does not exist"
        raise UserError(
            f"{origin}: no such folder ({path} {why}). Point it at a folder with train.csv and test.csv "
            f"(.gz ok){instead}."
        )
    return str(path.resolve())


def resolve_source(source: str, dataset: str = "ag_news", hub: bool | None = None) -> str:
    spec = DATASETS.get(dataset)
    if spec is None:  # a folder, csv:PATH or hub:ID: --dataset says where it is
        if source not in ("auto", "hub") and not (dataset.startswith("hub:") and source == "hub"):
            raise UserError(
                f"--data {source} does not go with --dataset {dataset.split(':', 1)[-1]}: that already says "
                "where the data is. Leave --data at auto."
            )
        return "hub" if dataset.startswith("hub:") else dataset.split(":", 1)[0]
    if source in ("embedded", "synthetic") and spec.key != "ag_news":
        raise UserError(
            f"--data {source} is AG News only (the sample inside the package, or generated headlines). "
            f"For {spec.name} use --data hub (or its cache offline) or --data FOLDER ({spec.folder_hint})."
        )
    if source != "auto":
        return source
    reachable = (not env_says_offline() and hub_reachable()) if hub is None else hub
    if reachable:
        return "hub"
    if spec.key == "ag_news":
        return data_dir() or ("hub" if hub_cache_name(spec, spec.hub_id) else "embedded")
    if hub_cache_name(spec, spec.hub_id):
        return "hub"
    raise UserError(
        f"--dataset {spec.key}: the Hugging Face hub is not reachable and its cache at {datasets_cache_dir()} "
        f"holds no copy of {spec.hub_id}. Point --data at a local copy ({spec.folder_hint}), or fill the cache "
        f"on a machine with internet (a login node): {dataset_download_command(spec.hub_id)}"
    )


def load_dataset_splits(
    dataset: str,
    source: str,
    num_samples: int | None = None,
    eval_samples: int | None = None,
    seed: int = 0,
    opts: TextOptions = TextOptions(),
) -> TextSplits:
    spec = DATASETS.get(dataset)
    if spec is not None:
        if opts.label_names and len(opts.label_names) != len(spec.label_names):
            raise UserError(
                f"--label_names gives {len(opts.label_names)} names ({', '.join(opts.label_names)}) but "
                f"{spec.name} has {len(spec.label_names)} classes ({', '.join(spec.label_names)})."
            )
        if spec.key == "ag_news" and source == "embedded":
            splits = load_embedded()
        elif spec.key == "ag_news" and source == "synthetic":
            from .synthetic import synthetic_agnews  # only when asked for: not part of a normal run

            splits = synthetic_agnews()
        elif source == "hub":
            from .hub_data import load_hub  # only a run that reads from the hub loads it (and the datasets library)

            splits = load_hub(spec.hub_id, spec, opts, num_samples, eval_samples, seed)
        else:
            splits = load_folder(source, spec, opts)
        if opts.label_names and source in ("embedded", "synthetic"):
            splits.label_names = list(opts.label_names)
    elif dataset.startswith("hub:"):
        from .hub_data import load_hub

        splits = load_hub(dataset[4:], None, opts, num_samples, eval_samples, seed)
    elif dataset.startswith("csv:"):
        from .header_csv import load_csv  # a CSV with a header: read only when one is asked for

        splits = load_csv(dataset[4:], opts)
    elif dataset.startswith("folder:"):
        splits = load_folder(dataset[7:], None, opts)
    else:
        raise UserError(f"--dataset {dataset}: unknown. Choices: {known_datasets_text()}.")
    if opts.label_names and len(opts.label_names) != len(splits.label_names):
        raise UserError(
            f"--label_names gives {len(opts.label_names)} names ({', '.join(opts.label_names)}) but the data "
            f"has {len(splits.label_names)} classes ({', '.join(splits.label_names)[:200]})."
        )
    if len(splits.label_names) < 2:
        raise UserError(
            f"{splits.detail}: only one class ({', '.join(splits.label_names)}); a classifier needs two or more."
        )
    return take_subsets(splits, num_samples, eval_samples, seed)


def load_agnews(
    source: str, num_samples: int | None = None, eval_samples: int | None = None, seed: int = 0
) -> TextSplits:
    return load_dataset_splits("ag_news", resolve_source(source), num_samples, eval_samples, seed)
