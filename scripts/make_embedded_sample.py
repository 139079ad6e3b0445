#!/usr/bin/env python
"""Build the real AG News sample that ships inside the package (distrinews_lib/assets/ag_news_sample/).

    python scripts/make_embedded_sample.py --source ../shared/data/ag_news

It takes a class-balanced random sample of TRAIN rows from the 12,000-row train subset (never a test row)
and the full 7,600-row test set, writes them gzipped in the original ag_news_csv layout, and writes a
README with their provenance, per-class counts and checksums. Deterministic: the same source and seed
give byte-identical files.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import hashlib
import io
import random
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "distrinews_lib" / "assets" / "ag_news_sample"
CLASSES = {1: "World", 2: "Sports", 3: "Business", 4: "Sci/Tech"}


def read_rows(path: Path) -> list:
    with gzip.open(path, "rt", encoding="utf-8", newline="") as f:
        return [row for row in csv.reader(f) if row]


def write_gz(rows: list, path: Path) -> bytes:
    text = io.StringIO()
    csv.writer(text, quoting=csv.QUOTE_ALL, lineterminator="\n").writerows(rows)
    raw = text.getvalue().encode("utf-8")
    with open(path, "wb") as f:  # mtime=0 and no file name: the same rows always give the same bytes
        with gzip.GzipFile(filename="", mode="wb", fileobj=f, mtime=0, compresslevel=9) as gz:
            gz.write(raw)
    return raw


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--source", default=str(ROOT.parent / "shared" / "data" / "ag_news"))
    p.add_argument("--per_class", type=int, default=2000, help="training rows per class")
    p.add_argument("--seed", type=int, default=20261122)
    args = p.parse_args()
    source = Path(args.source)
    train_src, test_src = source / "train_subset_12000.csv.gz", source / "test.csv.gz"
    train, test = read_rows(train_src), read_rows(test_src)
    test_keys = {(r[1], r[2]) for r in test}
    rng = random.Random(args.seed)
    picked = []
    for c in sorted(CLASSES):
        rows = [r for r in train if int(r[0]) == c and (r[1], r[2]) not in test_keys]
        picked += rng.sample(rows, args.per_class)
    rng.shuffle(picked)
    OUT.mkdir(parents=True, exist_ok=True)
    files = {"train.csv.gz": picked, "test.csv.gz": test}
    lines = []
    for name, rows in files.items():
        raw = write_gz(rows, OUT / name)
        counts = Counter(int(r[0]) for r in rows)
        lines.append(
            f"| `{name}` | {len(rows):,} | {' / '.join(str(counts[c]) for c in sorted(CLASSES))} | "
            f"{sha256((OUT / name).read_bytes())} | {sha256(raw)} |"
        )
    src = {f.name: sha256(f.read_bytes()) for f in (train_src, test_src)}
    (OUT / "README.md").write_text(f"""# The embedded AG News sample (real news, offline)

The course's offline default (`--data auto` with no hub and no `$DISTRINEWS_DATA_DIR`, or `--data embedded`).
Real AG News rows, not synthetic: {len(picked):,} training rows and the full {len(test):,}-row test set.

| file | rows | per class (World / Sports / Business / Sci/Tech) | sha256 (.gz) | sha256 (uncompressed) |
| --- | --- | --- | --- | --- |
{chr(10).join(lines)}

Format: the original `ag_news_csv` layout, no header, UTF-8, every field quoted: `"class_index","title","description"`
(classes 1 World, 2 Sports, 3 Business, 4 Sci/Tech; text as in the original, `\\` line breaks and bare HTML escapes kept).

Provenance:
- `train.csv.gz`: {args.per_class} rows per class drawn at random (seed {args.seed}) from `train_subset_12000.csv.gz`,
  a random 10% of the original AG News training set (github.com/yxhong-tw/AG-News-Exercise, `data/formal/validation.csv`),
  sha256 of the source .gz {src[train_src.name]}. Training rows only: no row whose (title, description) occurs in the test set.
- `test.csv.gz`: the canonical AG News test set, unchanged (7,600 rows, 1,900 per class;
  github.com/mhjabreel/CharCnn_Keras `data/ag_news_csv/test.csv`, md5 of the CSV d52ea96a97a2d943681189a97654912d
  as torchtext pins it), sha256 of the source .gz {src[test_src.name]}.
- Built by `python scripts/make_embedded_sample.py --source <folder with those two files>` (deterministic).

Licence: AG's corpus of news articles is provided for non-commercial research and educational use only
(see the original readme.txt by Xiang Zhang: http://groups.di.unipi.it/~gulli/AG_corpus_of_news_articles.html).
The course uses it for teaching; do not use this sample commercially.
""")  # noqa: E501
    total = sum((OUT / n).stat().st_size for n in files)
    print(f"wrote {OUT}: {len(picked)} train + {len(test)} test rows, {total / 2**20:.2f} MB gzipped")


if __name__ == "__main__":
    main()
