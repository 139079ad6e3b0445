"""AG News for the course: where it comes from, tokenized once, batched with dynamic padding.

Sources (`--data`):
  hub        the Hugging Face hub through `datasets` (needs internet)
  <folder>   the original ag_news_csv layout (train.csv / test.csv, no header, "class","title","description",
             optionally .gz) or the Kaggle CSV (header `Class Index,Title,Description`)
  embedded   a real AG News sample shipped inside this package (8,000 train rows, the full 7,600-row test
             set; assets/ag_news_sample/README.md gives its provenance): real news, offline
  synthetic  an AG-News-shaped set generated offline, only when asked for; never mistaken for the real thing
  auto       hub when reachable, else the folder in $DISTRINEWS_DATA_DIR, else embedded (decided once, on
             rank 0, by the run plan)
Labels everywhere: 0 World, 1 Sports, 2 Business, 3 Sci/Tech.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import html
import io
import os
import random
import re
import tempfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.utils.data import Dataset, Sampler

from . import LABEL_NAMES
from .errors import UserError
from .hub import hub_reachable

HUB_DATASET = "fancyzhx/ag_news"  # the canonical id of "ag_news" on the hub
EMBEDDED_DIR = Path(__file__).parent / "assets" / "ag_news_sample"
SOURCES = ("auto", "hub", "embedded", "synthetic")
SYNTHETIC_NOTE = "SYNTHETIC AG-News-shaped data generated offline (not real news; accuracy says nothing about AG News)"
KAGGLE_HEADER = ["class index", "title", "description"]


@dataclass
class TextSplits:
    """Raw texts and 0-based labels for train and test, and where they came from."""

    train_texts: list
    train_labels: list
    test_texts: list
    test_labels: list
    source: str                  # "hub", "folder", "embedded" or "synthetic"
    detail: str                  # human-readable: hub id, folder path, or the synthetic warning
    is_synthetic: bool = False
    full_sizes: dict = field(default_factory=dict)

    def describe(self) -> str:
        return (f"data: {self.source} ({self.detail}); train {len(self.train_texts)} rows, "
                f"test {len(self.test_texts)} rows")

    @property
    def title(self) -> str:
        """A short name for plot titles and summaries: 'AG News (embedded sample)', 'SYNTHETIC data'..."""
        return {"hub": "AG News (hub)", "folder": f"AG News ({Path(self.detail.split(' + ')[0]).parent.name or 'folder'})",
                "embedded": "AG News (embedded real sample)", "synthetic": "SYNTHETIC data"}.get(self.source, self.source)

    def fingerprint(self) -> str:
        """A short hash of every text and label: two ranks with the same fingerprint train on the same data."""
        h = hashlib.sha256()
        for texts, labels in ((self.train_texts, self.train_labels), (self.test_texts, self.test_labels)):
            for t, y in zip(texts, labels):
                h.update(f"{y}\x00{t}\x01".encode("utf-8", "replace"))
            h.update(b"\x02")
        return h.hexdigest()[:16]


# --------------------------------------------------------------------------- reading CSV files

# AG News lost the '&' of its HTML escapes: " #39;" is "&#39;", " quot;" is "&quot;".
_BARE_ENTITY = re.compile(r"(?<!&) ?(#\d+|quot|amp|lt|gt);")


def clean_text(title: str, description: str) -> str:
    """Title and description as one string; undo AG News' quirks (`\\` line breaks, ` #39;` escapes)."""
    text = f"{title.strip()}. {description.strip()}" if title.strip() else description.strip()
    text = text.replace("\\", " ")
    text = _BARE_ENTITY.sub(lambda m: html.unescape(f"&{m.group(1)};"), text)
    return " ".join(html.unescape(text).split())


def _open_text(path: Path):
    # utf-8-sig: a CSV saved by Excel starts with an invisible byte-order mark; read it as UTF-8 without it.
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8-sig", newline="")
    return open(path, encoding="utf-8-sig", newline="")


def read_agnews_csv(path: str | os.PathLike) -> tuple[list, list]:
    """(texts, labels 0..3) from one AG News CSV, with or without the Kaggle header."""
    path = Path(path)
    texts, labels = [], []
    try:
        with _open_text(path) as f:
            for lineno, row in enumerate(csv.reader(f), start=1):
                if lineno == 1 and [c.strip().lower() for c in row] == KAGGLE_HEADER:
                    continue
                if not row or (len(row) == 1 and not row[0].strip()):
                    continue
                if len(row) != 3:
                    raise UserError(
                        f"{path}, line {lineno}: expected 3 fields (class, title, description), found {len(row)}. "
                        "AG News rows look like \"3\",\"Title\",\"Description\"; fix or remove that row."
                    )
                try:
                    label = int(row[0])
                except ValueError:
                    raise UserError(f"{path}, line {lineno}: the class '{row[0][:30]}' is not a number 1..4 "
                                    "(1 World, 2 Sports, 3 Business, 4 Sci/Tech).") from None
                if not 1 <= label <= 4:
                    raise UserError(f"{path}, line {lineno}: class {label} is outside 1..4 "
                                    "(1 World, 2 Sports, 3 Business, 4 Sci/Tech). Fix the label or drop the row.")
                texts.append(clean_text(row[1], row[2]))
                labels.append(label - 1)
    except (UnicodeDecodeError, gzip.BadGzipFile, EOFError, csv.Error, zlib.error) as err:
        raise UserError(f"{path} could not be read as a UTF-8 CSV ({type(err).__name__}: {err}). A damaged download? "
                        "Fetch it again; is it really AG News (ag_news_csv or the Kaggle CSV)?") from None
    except OSError as err:  # a folder named like the file, a broken symbolic link, no permission...
        raise UserError(f"{path} could not be opened ({err.strerror or type(err).__name__}). Point --data at a folder "
                        "whose train/test files are readable CSV files.") from None
    if not texts:
        raise UserError(f"{path} holds no rows.")
    return texts, labels


def find_split_file(folder: Path, split: str) -> Path:
    """train.csv / train.csv.gz, else the one train*.csv[.gz] (e.g. train_subset_12000.csv.gz)."""
    for name in (f"{split}.csv", f"{split}.csv.gz"):
        candidate = folder / name
        if candidate.is_symlink() and not candidate.exists():
            raise UserError(f"data folder {folder}: {name} is a broken symbolic link (to {os.readlink(candidate)}). "
                            "Fix the link or copy the file there.")
        if candidate.is_dir():
            raise UserError(f"data folder {folder}: {name} is a folder, not a file. Expected the {split} split as a CSV file.")
        if candidate.is_file():
            return candidate
    found = sorted(p for p in folder.glob(f"{split}*.csv*") if p.suffix in (".csv", ".gz") and p.is_file())
    if len(found) == 1:
        return found[0]
    what = "several files: " + ", ".join(p.name for p in found) if found else "no file"
    raise UserError(f"data folder {folder}: looking for the {split} split, found {what}. Expected {split}.csv or "
                    f"{split}.csv.gz (the original ag_news_csv layout or the Kaggle CSV).")


def load_folder(folder: str | os.PathLike) -> TextSplits:
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise UserError(f"data folder {folder} does not exist. Pass a folder holding train.csv and test.csv "
                        "(ag_news_csv or the Kaggle AG News CSV), or use --data synthetic / --data hub.")
    train_file, test_file = find_split_file(folder, "train"), find_split_file(folder, "test")
    tr_x, tr_y = read_agnews_csv(train_file)
    te_x, te_y = read_agnews_csv(test_file)
    return TextSplits(tr_x, tr_y, te_x, te_y, "folder", f"{train_file} + {test_file.name}",
                      full_sizes={"train": len(tr_x), "test": len(te_x)})


def load_embedded() -> TextSplits:
    """The real AG News sample inside the package: offline, and real news (see assets/ag_news_sample/README.md)."""
    splits = load_folder(EMBEDDED_DIR)
    splits.source, splits.detail = "embedded", "real AG News sample shipped in distrinews_lib/assets/ag_news_sample"
    return splits


def load_hub(name: str = HUB_DATASET) -> TextSplits:
    if not hub_reachable():
        raise UserError("--data hub: the Hugging Face hub is not reachable from this machine. Switch internet on "
                        "(on Kaggle: Settings > Internet), or use --data embedded (a real sample, offline) or --data <folder>.")
    from datasets import load_dataset

    try:
        ds = load_dataset(name)
    except Exception as err:  # network errors, renamed datasets... all are the user's environment
        raise UserError(f"could not load '{name}' from the Hugging Face hub ({type(err).__name__}: "
                        f"{str(err).splitlines()[0][:200]}). Use --data embedded or --data <folder>.") from None
    tr, te = ds["train"], ds["test"]
    return TextSplits([clean_text("", t) for t in tr["text"]], list(tr["label"]),
                      [clean_text("", t) for t in te["text"]], list(te["label"]), "hub", name,
                      full_sizes={"train": len(tr), "test": len(te)})


# --------------------------------------------------------------------------- synthetic data

_TOPIC_WORDS = {
    0: "government minister election troops president parliament embassy rebels ceasefire talks diplomats "
       "refugees military capital sanctions treaty protest border nuclear united nations iraq envoy".split(),
    1: "team season coach match championship league player scored goal victory tournament olympic "
       "cup final striker inning quarterback title medal race defeat squad".split(),
    2: "shares profit quarterly earnings market stocks investors bank oil prices revenue merger "
       "company economy dollar sales billion analysts deal retail forecast".split(),
    3: "software internet computer technology researchers space scientists microsoft google launch "
       "users wireless chip network online device nasa data study web".split(),
}
_COMMON = ("the a new on in after over with for to as says report week year first said will after "
           "could amid more than two three monday tuesday wednesday thursday friday").split()


def synthetic_agnews(n_train: int = 10_000, n_test: int = 2_000, seed: int = 1234) -> TextSplits:
    """Headlines built from per-class topic words, common words, and some off-topic words.

    About one word in five comes from another class, so the task is learnable but not trivial.
    """
    rng = random.Random(seed)

    def make(n):
        texts, labels = [], []
        for i in range(n):
            label = i % 4
            words = []
            for _ in range(rng.randint(12, 40)):
                r = rng.random()
                if r < 0.35:
                    words.append(rng.choice(_TOPIC_WORDS[label]))
                elif r < 0.45:
                    words.append(rng.choice(_TOPIC_WORDS[rng.randrange(4)]))
                else:
                    words.append(rng.choice(_COMMON))
            cut = rng.randint(4, 8)
            texts.append(" ".join(words[:cut]).capitalize() + ". " + " ".join(words[cut:]) + ".")
            labels.append(label)
        order = list(range(n))
        rng.shuffle(order)
        return [texts[j] for j in order], [labels[j] for j in order]

    tr_x, tr_y = make(n_train)
    te_x, te_y = make(n_test)
    return TextSplits(tr_x, tr_y, te_x, te_y, "synthetic", SYNTHETIC_NOTE, is_synthetic=True,
                      full_sizes={"train": n_train, "test": n_test})


# --------------------------------------------------------------------------- choosing the source

def balanced_subset(labels: list, n: int, seed: int) -> list:
    """Indices of a class-balanced random subset of size n (remainders go to the first classes)."""
    if n >= len(labels):
        return list(range(len(labels)))
    rng = random.Random(seed)
    by_class: dict[int, list] = {}
    for i, y in enumerate(labels):
        by_class.setdefault(y, []).append(i)
    classes = sorted(by_class)
    picked = []
    for k, c in enumerate(classes):
        want = n // len(classes) + (1 if k < n % len(classes) else 0)
        idx = by_class[c][:]
        rng.shuffle(idx)
        picked += idx[:want]
    rng.shuffle(picked)
    return picked


def resolve_source(source: str) -> str:
    """What `auto` means on this machine: hub, else $DISTRINEWS_DATA_DIR, else the embedded real sample.
    Under DDP only rank 0 asks (plan.decide); every rank then loads what it decided."""
    if source != "auto":
        return source
    if hub_reachable():
        return "hub"
    env_dir = os.environ.get("DISTRINEWS_DATA_DIR")
    if env_dir:
        if not Path(env_dir).expanduser().is_dir():
            raise UserError(f"DISTRINEWS_DATA_DIR={env_dir} is not a folder. Point it at a folder holding "
                            "train.csv and test.csv (or unset it to use the embedded real sample offline).")
        return str(Path(env_dir).expanduser())
    return "embedded"


def load_agnews(source: str, num_samples: int | None = None, eval_samples: int | None = None,
                seed: int = 0) -> TextSplits:
    """Load AG News from a resolved `source` (hub, embedded, synthetic or a folder; see resolve_source for
    auto), then take class-balanced subsets of train (num_samples) and test (eval_samples)."""
    resolved = resolve_source(source)
    if resolved == "hub":
        splits = load_hub()
    elif resolved == "embedded":
        splits = load_embedded()
    elif resolved == "synthetic":
        splits = synthetic_agnews()
    else:
        splits = load_folder(resolved)
    for attr, n in (("train", num_samples), ("test", eval_samples)):
        if n:
            x, y = getattr(splits, f"{attr}_texts"), getattr(splits, f"{attr}_labels")
            idx = balanced_subset(y, n, seed)
            setattr(splits, f"{attr}_texts", [x[i] for i in idx])
            setattr(splits, f"{attr}_labels", [y[i] for i in idx])
    return splits


# --------------------------------------------------------------------------- tokenize once, cache

def cache_dir() -> Path:
    return Path(os.environ.get("DISTRINEWS_CACHE", Path.home() / ".cache" / "distrinews")) / "tokenized"


def _cache_key(texts: list, tokenizer, max_length: int) -> str:
    h = hashlib.sha256()
    h.update(f"{type(tokenizer).__name__}|{tokenizer.name_or_path}|{len(tokenizer)}|{max_length}|".encode())
    h.update(str(tokenizer.convert_tokens_to_ids(["the", "news", "[SEP]"])).encode())
    for t in texts:
        h.update(t.encode("utf-8", "replace"))
        h.update(b"\x00")
    return h.hexdigest()[:32]


def tokenize_texts(texts: list, tokenizer, max_length: int, use_cache: bool = True) -> list:
    """Token ids (unpadded lists) for each text; cached on disk so every rank and rerun reuses them."""
    path = cache_dir() / f"{_cache_key(texts, tokenizer, max_length)}.pt"
    if use_cache and path.is_file():
        try:
            return torch.load(path, weights_only=True)
        except Exception:
            pass  # a damaged cache file is simply rebuilt
    ids = tokenizer(texts, truncation=True, max_length=max_length)["input_ids"]
    if use_cache:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
            with os.fdopen(fd, "wb") as f:
                torch.save(ids, f)
            os.replace(tmp, path)  # atomic: ranks tokenizing at the same time can't corrupt it
        except OSError:
            pass  # a read-only home is no reason to stop training
    return ids


class TokenizedDataset(Dataset):
    """Pre-tokenized examples; each item remembers its index so DDP evaluation can drop duplicates."""

    def __init__(self, input_ids: list, labels: list):
        assert len(input_ids) == len(labels)
        self.input_ids = input_ids
        self.labels = labels
        self.lengths = [len(x) for x in input_ids]

    def __len__(self):
        return len(self.input_ids)

    def __getitem__(self, i):
        return {"index": i, "input_ids": self.input_ids[i], "label": self.labels[i]}


def tokenize_splits(splits: TextSplits, tokenizer, max_length: int) -> tuple[TokenizedDataset, TokenizedDataset]:
    return (TokenizedDataset(tokenize_texts(splits.train_texts, tokenizer, max_length), splits.train_labels),
            TokenizedDataset(tokenize_texts(splits.test_texts, tokenizer, max_length), splits.test_labels))


class PadCollator:
    """Dynamic padding: pad each batch to its own longest sequence, rounded up to a multiple of 8
    (tensor cores like multiples of 8; on CPU it costs a few pad tokens)."""

    def __init__(self, pad_id: int = 0, pad_to_multiple_of: int | None = 8):
        self.pad_id = pad_id
        self.multiple = pad_to_multiple_of or 1

    def __call__(self, items):
        longest = max(len(it["input_ids"]) for it in items)
        width = -(-longest // self.multiple) * self.multiple
        ids = torch.full((len(items), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(items), width), dtype=torch.long)
        for r, it in enumerate(items):
            n = len(it["input_ids"])
            ids[r, :n] = torch.tensor(it["input_ids"], dtype=torch.long)
            mask[r, :n] = 1
        return {
            "input_ids": ids,
            "attention_mask": mask,
            "labels": torch.tensor([it["label"] for it in items], dtype=torch.long),
            "index": torch.tensor([it["index"] for it in items], dtype=torch.long),
        }


class LengthGroupedBatchSampler(Sampler):
    """Batches of similar length, drawn from whatever `sampler` yields (e.g. a DistributedSampler shard).

    The sampler's order is cut into chunks of `batch_size * chunk_batches` indices; each chunk is sorted
    by length and cut into batches; the batch order is then shuffled. Every rank regroups only its own
    shard, so sharding stays disjoint, and each rank gets the same number of batches.
    """

    def __init__(self, sampler, lengths, batch_size: int, chunk_batches: int = 50, seed: int = 0, drop_last: bool = False):
        self.sampler, self.lengths, self.batch_size = sampler, lengths, batch_size
        self.chunk = batch_size * chunk_batches
        self.seed, self.drop_last, self.epoch = seed, drop_last, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    def __iter__(self):
        epoch = getattr(self.sampler, "epoch", self.epoch)  # follow DistributedSampler.set_epoch
        order = list(self.sampler)
        batches = []
        for s in range(0, len(order), self.chunk):
            chunk = sorted(order[s:s + self.chunk], key=lambda i: self.lengths[i])
            batches += [chunk[b:b + self.batch_size] for b in range(0, len(chunk), self.batch_size)]
        if self.drop_last and batches and len(batches[-1]) < self.batch_size:
            batches.pop()
        random.Random(self.seed * 1_000_003 + epoch).shuffle(batches)
        return iter(batches)

    def __len__(self):
        n = len(self.sampler)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)


class ShuffleSampler(Sampler):
    """A random order that depends only on (seed, epoch): call set_epoch(epoch) before each epoch.

    The single-process script's sampler. Like DistributedSampler with one replica, so a resumed run
    replays the same order without storing any random state.
    """

    def __init__(self, dataset, seed: int = 0):
        self.n, self.seed, self.epoch = len(dataset), seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        return iter(torch.randperm(self.n, generator=g).tolist())

    def __len__(self):
        return self.n


def loader_options(cfg, pad_id: int | None, device) -> dict:
    """DataLoader options from the fast-path flags (pinned memory only helps host-to-GPU copies)."""
    on_cuda = device.type == "cuda"
    pin = on_cuda if cfg.pin_memory is None else bool(cfg.pin_memory) and on_cuda
    # Multiples of 8 feed tensor cores; a CPU has none, so there they are only extra pad tokens (4-8% more CPU time per sample).
    multiple = (8 if on_cuda else None) if cfg.pad_multiple is None else (cfg.pad_multiple or None)
    return dict(pad_id=pad_id or 0, pad_to_multiple_of=multiple, pin_memory=pin)


def make_loader(dataset: TokenizedDataset, batch_size: int, sampler=None, *, shuffle: bool = False, seed: int = 0,
                group_by_length: bool = False, pad_id: int = 0, pad_to_multiple_of: int | None = 8,
                pin_memory: bool = False, num_workers: int = 0):
    """A DataLoader with dynamic padding; with group_by_length, batches of similar length (less padding)."""
    from torch.utils.data import DataLoader, RandomSampler, SequentialSampler

    if sampler is None:
        g = torch.Generator().manual_seed(seed)
        sampler = RandomSampler(dataset, generator=g) if shuffle else SequentialSampler(dataset)
    collate = PadCollator(pad_id, pad_to_multiple_of)
    # Its own generator: creating an iterator then leaves the global torch RNG (dropout) untouched,
    # which a resumed run needs to replay the same random numbers.
    common = dict(collate_fn=collate, pin_memory=pin_memory, num_workers=num_workers,
                  persistent_workers=num_workers > 0, generator=torch.Generator().manual_seed(seed))
    if group_by_length:
        batch_sampler = LengthGroupedBatchSampler(sampler, dataset.lengths, batch_size, seed=seed)
        return DataLoader(dataset, batch_sampler=batch_sampler, **common)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, **common)
