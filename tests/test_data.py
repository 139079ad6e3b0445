"""The AG News loaders: file formats, bad rows, sources, subsets, tokenization cache."""

import gzip
import re
from collections import Counter

import pytest

from distrinews_course.bench.train_setup import offline_source
from distrinews_lib.data import hub_data, readers, sources, texts, tokenization
from distrinews_lib.data.texts import AG_NEWS_LABELS
from distrinews_lib.errors import UserError
from distrinews_lib.models.build import build_model
from distrinews_lib.training.config import RunConfig

from .helpers import AG_NEWS, ROOT


def write(path, text, gz=False):
    if gz:
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


ORIGINAL = (
    '"3","Wall St. Bears Claw Back","Reuters - Short-sellers are seeing green again."\n'
    '"4","New chip #39;s speed","Intel\\\\said quot;fast quot; &lt;b&gt;today&lt;/b&gt;"\n'
)
KAGGLE = "Class Index,Title,Description\n1,Peace talks,Diplomats met in Geneva\n2,Cup final,The team scored twice\n"


def test_reads_original_layout_gzipped_and_cleans_text(tmp_path):
    texts, labels = readers.read_zhang_csv(write(tmp_path / "train.csv.gz", ORIGINAL, gz=True), AG_NEWS_LABELS)
    assert labels == [2, 3]
    assert texts[0] == "Wall St. Bears Claw Back. Reuters - Short-sellers are seeing green again."
    assert "chip's" in texts[1] and "\\" not in texts[1] and "#39;" not in texts[1] and "quot;" not in texts[1]


def test_reads_kaggle_csv_with_header(tmp_path):
    texts, labels = readers.read_zhang_csv(write(tmp_path / "train.csv", KAGGLE), AG_NEWS_LABELS)
    assert labels == [0, 1]
    assert texts[0].startswith("Peace talks")


def test_folder_finds_split_files(tmp_path):
    write(tmp_path / "train_subset_9.csv.gz", ORIGINAL, gz=True)
    write(tmp_path / "test.csv", KAGGLE)
    splits = readers.load_folder(tmp_path)
    assert (len(splits.train_texts), len(splits.test_texts), splits.source) == (2, 2, "folder")


def test_malformed_row_names_file_and_line(tmp_path):
    bad = write(tmp_path / "train.csv", ORIGINAL + '"1","only two fields"\n')
    with pytest.raises(UserError, match=r"train\.csv, line 3: expected 3 fields"):
        readers.read_zhang_csv(bad, AG_NEWS_LABELS)


def test_label_outside_1_to_4_is_refused(tmp_path):
    bad = write(tmp_path / "test.csv", '"5","Title","Desc"\n')
    with pytest.raises(UserError, match=r"line 1: class 5 is outside 1..4"):
        readers.read_zhang_csv(bad, AG_NEWS_LABELS)


def test_missing_folder_says_what_to_do(tmp_path):
    with pytest.raises(UserError, match="does not exist.*--data"):
        readers.load_folder(tmp_path / "nope")


def test_synthetic_data_is_labelled_as_such():
    s = sources.load_agnews("synthetic", num_samples=40, eval_samples=12)
    assert s.is_synthetic and s.source == "synthetic" and "SYNTHETIC" in s.describe()
    assert Counter(s.train_labels) == {0: 10, 1: 10, 2: 10, 3: 10}
    assert Counter(s.test_labels) == {0: 3, 1: 3, 2: 3, 3: 3}


def test_auto_uses_data_dir_offline_then_the_embedded_real_sample(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    write(tmp_path / "train.csv", KAGGLE)
    write(tmp_path / "test.csv", KAGGLE)
    monkeypatch.setenv("DISTRINEWS_DATA_DIR", str(tmp_path))
    assert sources.resolve_source("auto") == str(tmp_path)
    monkeypatch.delenv("DISTRINEWS_DATA_DIR")
    assert sources.resolve_source("auto") == "embedded"  # real news offline; synthetic only when asked for
    s = sources.load_agnews("auto", num_samples=40, eval_samples=12)
    assert s.source == "embedded" and not s.is_synthetic and s.title == "AG News (embedded real sample)"


def test_the_data_folder_has_one_rule_in_one_function(tmp_path, monkeypatch):
    """sources.data_dir is THE rule (README: --data auto is $DISTRINEWS_DATA_DIR, else the embedded sample): a
    folder on the command line wins over $DISTRINEWS_DATA_DIR, which wins over the caller's default (None); an empty
    variable is unset; a folder named either way that is not there stops with where it came from, never a fallback."""
    flag_dir, env_dir = tmp_path / "flag", tmp_path / "env"
    flag_dir.mkdir()
    env_dir.mkdir()
    monkeypatch.setenv("DISTRINEWS_DATA_DIR", str(env_dir))
    assert sources.data_dir(str(flag_dir)) == str(flag_dir)
    assert sources.data_dir() == str(env_dir)
    assert offline_source("auto") == str(env_dir) and offline_source("embedded") == "embedded"
    monkeypatch.setenv("DISTRINEWS_DATA_DIR", "")
    assert sources.data_dir() is None and offline_source("auto") == "embedded"
    monkeypatch.setenv("DISTRINEWS_DATA_DIR", str(tmp_path / "gone"))
    with pytest.raises(UserError, match="DISTRINEWS_DATA_DIR=.*no such folder.*does not exist"):
        sources.data_dir()
    with pytest.raises(UserError, match="--data-dir .*nope: no such folder"):
        sources.data_dir(str(tmp_path / "nope"), "--data-dir")
    (tmp_path / "file.csv").write_text("x")
    with pytest.raises(UserError, match="is not a folder"):
        offline_source(str(tmp_path / "file.csv"))


def test_no_script_reads_the_data_folder_variable_itself():
    """Every script and module that needs the data folder asks sources.data_dir (run_course.py only sets the
    variable for the notebooks, and the notebooks' setup only shows it)."""
    reads = re.compile(r"environ(\.get\(|\[)\s*[\"']DISTRINEWS_DATA_DIR")
    files = [p for folder in ("scripts", "distrinews_lib", "distrinews_course") for p in (ROOT / folder).rglob("*.py")]
    readers_ = {p.relative_to(ROOT).as_posix() for p in files if reads.search(p.read_text(encoding="utf-8"))}
    assert readers_ <= {"scripts/run_course.py", "distrinews_course/notebook.py"}, readers_
    assert "os.environ.get(DATA_DIR_ENV)" in (ROOT / "distrinews_lib" / "data" / "sources.py").read_text()


def test_the_embedded_sample_is_real_balanced_small_and_documented():
    import hashlib

    s = sources.load_embedded()
    assert (len(s.train_texts), len(s.test_texts)) == (8000, 7600)
    assert Counter(s.train_labels) == {0: 2000, 1: 2000, 2: 2000, 3: 2000}
    assert Counter(s.test_labels) == {0: 1900, 1: 1900, 2: 1900, 3: 1900}
    assert not set(s.train_texts) & set(s.test_texts), "no test row may be in the training sample"
    files = [sources.EMBEDDED_DIR / n for n in ("train.csv.gz", "test.csv.gz")]
    assert sum(f.stat().st_size for f in files) <= 2 * 2**20
    readme = (sources.EMBEDDED_DIR / "README.md").read_text()
    for f in files:  # the README's checksums are the files' own
        assert hashlib.sha256(f.read_bytes()).hexdigest() in readme
    assert "non-commercial" in readme and "train_subset_12000" in readme
    with gzip.open(files[1], "rb") as f:  # the canonical test set, byte for byte (torchtext's MD5)
        assert hashlib.md5(f.read()).hexdigest() == "d52ea96a97a2d943681189a97654912d"


@pytest.mark.skipif(not AG_NEWS.is_dir(), reason=f"real AG News not present at {AG_NEWS}")
def test_the_embedded_training_rows_come_from_the_train_subset():
    train = set(readers.load_folder(AG_NEWS).train_texts)
    assert set(sources.load_embedded().train_texts) <= train


def test_corrupt_or_odd_files_get_a_clear_message(tmp_path):
    good = gzip.compress(
        ("\n".join(f'"1","Title {i}","Some description number {i} here"' for i in range(3000))).encode()
    )
    for where in range(20, len(good) - 20, len(good) // 25):  # a flipped byte mid-stream, not just a bad CRC
        flipped = bytearray(good)
        flipped[where] ^= 0xFF
        (tmp_path / "bad.csv.gz").write_bytes(bytes(flipped))
        with pytest.raises(UserError, match="bad.csv.gz"):  # a message naming the file, never a traceback
            readers.read_zhang_csv(tmp_path / "bad.csv.gz", AG_NEWS_LABELS)
    folder = tmp_path / "f"
    folder.mkdir()
    write(folder / "train.csv", KAGGLE)
    (folder / "test.csv").mkdir()
    with pytest.raises(UserError, match="test.csv is a folder"):
        readers.load_folder(folder)
    (folder / "test.csv").rmdir()
    (folder / "test.csv").symlink_to(tmp_path / "gone.csv")
    with pytest.raises(UserError, match="broken symbolic link"):
        readers.load_folder(folder)


def test_a_csv_with_a_byte_order_mark_is_read(tmp_path):
    bom = tmp_path / "train.csv"
    bom.write_bytes("\ufeff".encode() + KAGGLE.encode())  # as Excel saves "CSV UTF-8"
    texts, labels = readers.read_zhang_csv(bom, AG_NEWS_LABELS)
    assert labels == [0, 1] and texts[0].startswith("Peace talks")


def test_hub_offline_fails_fast_with_advice(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UserError, match="not reachable.*--data embedded"):
        hub_data.load_hub()


def test_hub_probe_answers_within_seconds(monkeypatch):
    """A server that accepts the connection but never answers must not hang the run."""
    import socket
    import time

    from distrinews_lib import hub

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setattr(hub, "_cached", None)
    with socket.socket() as silent:  # loopback only: listens, never replies
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        monkeypatch.setenv("DISTRINEWS_HUB_URL", f"https://127.0.0.1:{silent.getsockname()[1]}/api")
        t = time.time()
        assert hub.hub_reachable(timeout=1.0) is False
        assert time.time() - t < 3


def test_balanced_subset_is_balanced_and_deterministic():
    labels = [i % 4 for i in range(1000)]
    a = texts.balanced_subset(labels, 101, seed=1)
    assert a == texts.balanced_subset(labels, 101, seed=1)
    assert sorted(Counter(labels[i] for i in a).values()) == [25, 25, 25, 26]


def test_a_folder_s_rows_are_cleaned_only_when_a_run_keeps_them(tmp_path):
    rows = "".join(f'"{1 + i % 4}","Title {i} #39;s","Body quot;{i} quot;"\n' for i in range(40))
    path = write(tmp_path / "train.csv", rows)
    eager, labels = readers.read_zhang_csv(path, AG_NEWS_LABELS)
    cleaned = []

    def counting(*parts):
        cleaned.append(parts)
        return texts.clean_news(*parts)

    lazy, lazy_labels = readers.read_zhang_csv(path, AG_NEWS_LABELS, clean=counting, lazy=True)
    assert (len(lazy), lazy_labels, cleaned) == (40, labels, [])  # every row read and checked, none cleaned yet
    splits = texts.TextSplits(lazy, lazy_labels, eager[:4], labels[:4], "folder", str(path))
    texts.take_subsets(splits, 8, None, seed=0)
    idx = texts.subset_index(labels, 8, 0)
    assert splits.train_texts == [eager[i] for i in idx] and "'s" in splits.train_texts[0]
    assert len(cleaned) == 8  # the 8 rows the run keeps, not the 40
    splits = texts.TextSplits(eager[:4], labels[:4], lazy, lazy_labels, "folder", str(path))
    texts.take_subsets(splits, 8, None, seed=0)
    assert type(splits.test_texts) is list and splits.test_texts == eager  # every row kept: all cleaned, a plain list
    assert lazy[1:3] == eager[1:3]


def test_a_bench_launch_reads_each_folder_once_and_every_run_gets_its_own_lists(tmp_path):
    from distrinews_course.bench import harness

    write(tmp_path / "train.csv", ORIGINAL)
    write(tmp_path / "test.csv", ORIGINAL)
    reads = []

    def load(folder, *args):
        reads.append(folder)
        return readers.load_folder(folder, *args)

    once = harness._read_once(load)
    a, b = once(tmp_path), once(tmp_path)
    assert len(reads) == 1 and a is not b and a.train_labels is not b.train_labels
    a.train_labels.append(9)
    a.source = "embedded"
    assert b.train_labels == [2, 3] and b.source == "folder" and list(b.train_texts) == list(a.train_texts)
    once(tmp_path, texts.DATASETS["ag_news"])
    assert len(reads) == 2  # other arguments: read again


def test_tokenize_once_and_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DISTRINEWS_CACHE", str(tmp_path))
    _, tok, _ = build_model(RunConfig(model="tiny"), AG_NEWS_LABELS)
    texts = ["Stocks fall as oil rises", "Team wins the cup"]
    ids = tokenization.tokenize_texts(texts, tok, 16)
    assert len(list((tmp_path / "tokenized").glob("*.pt"))) == 1
    assert tokenization.tokenize_texts(texts, tok, 16) == ids
    assert ids == tokenization.tokenize_texts(texts, tok, 16, use_cache=False)  # the cache returns what encoding gives
    (cached,) = (tmp_path / "tokenized").glob("*.pt")
    cached.write_bytes(b"not a torch file")  # a damaged cache file is rebuilt, not an error
    assert tokenization.tokenize_texts(texts, tok, 16) == ids
    assert tok.unk_token_id not in ids[0], "the tiny tokenizer must know DistilBERT's vocabulary"
    assert ids[0][0] == tok.cls_token_id and ids[0][-1] == tok.sep_token_id


@pytest.mark.skipif(not AG_NEWS.is_dir(), reason=f"real AG News not present at {AG_NEWS}")
def test_real_ag_news_files():
    s = readers.load_folder(AG_NEWS)
    assert len(s.test_texts) == 7600
    assert Counter(s.test_labels) == {0: 1900, 1: 1900, 2: 1900, 3: 1900}
    assert len(s.train_texts) == 12000
    assert Counter(s.train_labels) == {0: 2967, 1: 3044, 2: 3027, 3: 2962}
