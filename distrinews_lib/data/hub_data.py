"""A dataset through the Hugging Face hub (--data hub, or --dataset hub:OWNER/NAME): downloaded, or read from the
datasets cache offline, its labels mapped to classes, and the texts subset as asked. Loaded only when a run reads
from the hub: the embedded sample and local folders never import it (nor the datasets library)."""

from __future__ import annotations

import contextlib

from ..errors import UserError
from ..hub import (
    dataset_download_command,
    datasets_cache_dir,
    env_says_offline,
    hub_cache_name,
    hub_reachable,
)
from .header_csv import label_indices
from .texts import DATASETS, HUB_DATASET, DatasetSpec, TextOptions, TextSplits, clean_review, subset_index


@contextlib.contextmanager
def offline_datasets():
    """Within it, `datasets` and huggingface_hub act as under HF_HUB_OFFLINE=1, whatever the environment
    said when they were imported."""
    import datasets.config as dc  # deferred: datasets is optional (the hub extra)
    import huggingface_hub.constants as hc

    saved = (dc.HF_HUB_OFFLINE, dc.HF_DATASETS_OFFLINE, hc.HF_HUB_OFFLINE)
    dc.HF_HUB_OFFLINE = dc.HF_DATASETS_OFFLINE = hc.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        dc.HF_HUB_OFFLINE, dc.HF_DATASETS_OFFLINE, hc.HF_HUB_OFFLINE = saved


def load_hub(
    name: str = HUB_DATASET,
    spec: DatasetSpec | None = None,
    opts: TextOptions = TextOptions(),
    num_samples: int | None = None,
    eval_samples: int | None = None,
    seed: int = 0,
) -> TextSplits:
    """A dataset through `datasets`: from the hub, or from its cache (offline, or the hub does not answer).
    Subsets are taken before cleaning (Amazon's 3.6M reviews would take minutes)."""
    if spec is None:
        spec = next((s for s in DATASETS.values() if s.hub_id == name or name in s.cache_aliases), None)
    ds, offline = _open_hub_dataset(name, spec)
    tr, te = ds["train"], ds["test"]
    label_column = opts.label_column or "label"
    text_columns = opts.text_columns or (spec.hub_text_columns if spec else ("text",))
    for col in (*text_columns, label_column):
        if col not in tr.column_names:
            raise UserError(
                f"'{name}' has no column '{col}' (its columns: {', '.join(tr.column_names)}). Name the text "
                "and label columns with --text_column and --label_column."
            )
    names, tr_labels, te_labels = _hub_labels(name, spec, opts, tr, te, label_column)
    full = {"train": len(tr), "test": len(te)}
    idx_tr, idx_te = subset_index(tr_labels, num_samples, seed), subset_index(te_labels, eval_samples, seed)
    if idx_tr is not None:
        tr, tr_labels = tr.select(idx_tr), [tr_labels[i] for i in idx_tr]
    if idx_te is not None:
        te, te_labels = te.select(idx_te), [te_labels[i] for i in idx_te]
    clean = spec.clean if spec else clean_review

    def texts(split):
        columns = [split[c] for c in text_columns]
        return [clean(*(str(v) if v is not None else "" for v in row)) for row in zip(*columns)]

    detail = name + (f" (from the cache in {datasets_cache_dir()}, offline)" if offline else "")
    return TextSplits(
        texts(tr),
        tr_labels,
        texts(te),
        te_labels,
        "hub",
        detail,
        full_sizes=full,
        label_names=names,
        name=spec.name if spec else name,
    )


def _open_hub_dataset(name: str, spec: DatasetSpec | None):
    """({split: dataset}, offline): from the hub, or from its cache (offline, or the hub did not answer)."""
    offline = env_says_offline() or not hub_reachable()
    load_name = name
    if offline:
        load_name = hub_cache_name(spec, name)
        if load_name is None:
            why = (
                "the hub is not reachable (offline mode: HF_HUB_OFFLINE/HF_DATASETS_OFFLINE is set)"
                if env_says_offline()
                else "the Hugging Face hub is not reachable from this machine"
            )
            raise UserError(
                f"--data hub: {why}, and the Hugging Face datasets cache at {datasets_cache_dir()} holds "
                f"no copy of '{name}'. On a machine with internet (a login node), fill that cache with: "
                f"{dataset_download_command(name)} - then run again here with HF_HUB_OFFLINE=1 (set HF_HOME "
                f"or HF_DATASETS_CACHE the same way on both). Or use a local copy: --data <folder>"
                + (" or --data embedded (a real AG News sample, offline)." if name == HUB_DATASET else ".")
            )
    from datasets import load_dataset  # deferred: an optional dependency (the hub extra), and a slow import

    try:
        with offline_datasets() if offline else contextlib.nullcontext():
            ds = load_dataset(load_name, cache_dir=datasets_cache_dir())
    except Exception as err:  # network errors, renamed datasets, a damaged cache... all are the user's environment
        where = f"the cache at {datasets_cache_dir()}" if offline else "the Hugging Face hub"
        raise UserError(
            f"could not load '{name}' from {where} ({type(err).__name__}: "
            f"{str(err).splitlines()[0][:200] if str(err) else ''}). Use --data <folder>"
            + (" or --data embedded." if name == HUB_DATASET else ".")
        ) from None
    splits = {k.lower(): v for k, v in ds.items()}
    if "train" not in splits or "test" not in splits:
        raise UserError(f"'{name}' has the splits {', '.join(ds)}; the course needs a 'train' and a 'test' split.")
    return splits, offline


def _hub_labels(name: str, spec: DatasetSpec | None, opts: TextOptions, tr, te, label_column: str):
    """(names, train labels, test labels): names from --label_names, the known dataset or a ClassLabel."""
    feature = tr.features[label_column]
    names = (
        list(opts.label_names)
        if opts.label_names
        else list(spec.label_names)
        if spec
        else list(feature.names)
        if hasattr(feature, "names")
        else None
    )
    tr_labels, te_labels = list(tr[label_column]), list(te[label_column])
    if names is None or not all(isinstance(v, int) for v in tr_labels[:1000]):
        raw_tr = [(str(v), i + 2) for i, v in enumerate(tr_labels)]
        raw_te = [(str(v), i + 2) for i, v in enumerate(te_labels)]
        if names is None:
            _, names = label_indices(raw_tr + raw_te, None, name)
        tr_labels, _ = label_indices(raw_tr, names, f"{name} (train)")
        te_labels, _ = label_indices(raw_te, names, f"{name} (test)")
        return names, tr_labels, te_labels
    bad = next((v for v in tr_labels + te_labels if not 0 <= v < len(names)), None)
    if bad is not None:
        raise UserError(
            f"'{name}' has the label {bad}, outside 0..{len(names) - 1} ({', '.join(names)}). Name every "
            "class with --label_names."
        )
    return names, tr_labels, te_labels
