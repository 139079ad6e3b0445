"""Build a small, real Hugging Face cache in a temporary folder, as a login node's download would leave it.

- a dataset: prepared by `datasets`' own Parquet builder (the builder the hub uses for parquet-hosted datasets),
  then placed where `datasets` caches a hub dataset: <HF_DATASETS_CACHE>/<owner>___<name>/default/0.0.0/<hash>/
  with <name>-train.arrow, <name>-test.arrow and dataset_info.json;
- a model: save_pretrained() files in huggingface_hub's layout, <HF_HUB_CACHE>/models--<owner>--<name>/
  snapshots/<commit>/ with refs/main naming that commit (blobs and symlinks, which a download also makes, are
  not needed to read it).

With HF_HUB_OFFLINE=1, `datasets.load_dataset(repo_id)` and `from_pretrained(repo_id)` then read them without a
single request.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def cache_dataset(cache_dir, repo_id: str, splits: dict, label_names: list, text_columns=("text",)) -> Path:
    """splits: {"train": (texts or tuples of column values, labels), "test": (...)}; returns the prepared folder."""
    from datasets import ClassLabel, Dataset, Features, Value
    from datasets.packaged_modules.parquet.parquet import Parquet

    from distrinews_lib.hub import dataset_cache_folder

    features = Features({**{c: Value("string") for c in text_columns}, "label": ClassLabel(names=list(label_names))})
    name = repo_id.split("/")[-1]
    with tempfile.TemporaryDirectory() as scratch:
        files = {}
        for split, (texts, labels) in splits.items():
            columns = {c: [t if isinstance(t, str) else t[i] for t in texts] for i, c in enumerate(text_columns)}
            files[split] = [os.path.join(scratch, f"{split}.parquet")]
            Dataset.from_dict({**columns, "label": list(labels)}, features=features).to_parquet(files[split][0])
        builder = Parquet(
            cache_dir=os.path.join(scratch, "prepared"),
            dataset_name=name,
            config_name="default",
            hash=COMMIT[:16],
            data_files=files,
            features=features,
        )
        builder.download_and_prepare()
        dest = Path(dataset_cache_folder(repo_id, str(cache_dir))) / "default" / "0.0.0" / COMMIT[:16]
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(builder.cache_dir, dest)
    return dest


def cache_model(cache_dir, repo_id: str, model, tokenizer) -> Path:
    """save_pretrained() model and tokenizer into the hub cache's layout for repo_id; returns the snapshot folder."""
    root = Path(cache_dir) / ("models--" + repo_id.replace("/", "--"))
    snapshot = root / "snapshots" / COMMIT
    snapshot.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(snapshot)
    tokenizer.save_pretrained(snapshot)
    (root / "refs").mkdir(exist_ok=True)
    (root / "refs" / "main").write_text(COMMIT)
    return snapshot
