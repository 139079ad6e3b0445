"""The vocabulary-free hash tokenizer: the same ids in every process and on every machine, files that rebuild
it, and head+tail truncation (for it and for WordPiece)."""

from __future__ import annotations

import json
import subprocess
import sys

from distrinews_lib import checkpoint
from distrinews_lib.data.hash_tokenizer import HashTokenizer, stable_hash
from distrinews_lib.data.tokenization import cut, encode_texts, set_truncation, tiny_tokenizer

from .helpers import ROOT

TEXTS = ["Stocks RALLY, as tech shares surge!", "Ce film était magnifique... 10/10", "", "don't  stop\tbelieving"]


def test_lowercase_split_on_whitespace_and_punctuation():
    tok = HashTokenizer(1024)
    assert tok.tokenize("Stocks RALLY, as tech!") == ["stocks", "rally", ",", "as", "tech", "!"]
    assert tok.tokenize("don't") == ["don", "'", "t"]
    ids = tok("Stocks RALLY, as tech!")["input_ids"]
    assert ids[0] == tok.cls_token_id and ids[-1] == tok.sep_token_id and len(ids) == 8
    assert all(3 <= i < 1024 for i in ids[1:-1]), "words never take the special ids 0-2"
    assert tok("STOCKS")["input_ids"] == tok("stocks")["input_ids"]


def test_ids_are_pinned_so_every_machine_and_python_agrees():
    # blake2b of the UTF-8 bytes, modulo the buckets: fixed forever. If this changes, every checkpoint trained
    # with the hash tokenizer silently reads different words.
    tok = HashTokenizer(32768)
    assert tok("The news: stocks rally!")["input_ids"] == [1, 14608, 15995, 18465, 5820, 2377, 11592, 2]
    assert tok.convert_tokens_to_ids(["the", "news", "[SEP]"]) == [3 + stable_hash("the") % 32765, 15995, 2]


def test_the_same_ids_in_other_processes_whatever_their_hash_seed():
    """Python salts hash(str) per process (PYTHONHASHSEED): two DDP ranks would disagree. blake2b never does."""
    code = (
        "import json, sys; from distrinews_lib.data.hash_tokenizer import HashTokenizer; "
        "print(json.dumps([HashTokenizer(32768)(json.loads(sys.argv[1]), max_length=16)['input_ids'], hash('news')]))"
    )
    here = HashTokenizer(32768)(TEXTS, max_length=16)["input_ids"]
    answers = []
    for seed in ("1", "2", "random"):
        out = subprocess.run(
            [sys.executable, "-c", code, json.dumps(TEXTS)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env={"PYTHONHASHSEED": seed, "PATH": "/usr/bin:/bin"},
            timeout=60,
            check=True,
        )
        answers.append(json.loads(out.stdout))
    assert all(ids == here for ids, _ in answers)
    assert len({salted for _, salted in answers}) > 1, "Python's own hash() does differ between these processes"


def test_padding_tensors_and_files_round_trip(tmp_path):
    tok = HashTokenizer(4096, "head_tail")
    enc = tok(TEXTS, truncation=True, max_length=6, padding=True, return_tensors="pt")
    assert enc["input_ids"].shape == enc["attention_mask"].shape == (4, 6)
    assert enc["attention_mask"][2].tolist() == [1, 1, 0, 0, 0, 0]  # the empty text: [CLS] [SEP]
    files = checkpoint.tokenizer_files(tok)
    again = checkpoint.tokenizer_from_files(files)
    assert isinstance(again, HashTokenizer) and again.buckets == 4096 and again.truncation == "head_tail"
    assert again(TEXTS, max_length=6)["input_ids"] == tok(TEXTS, max_length=6)["input_ids"]


def test_head_tail_keeps_the_start_and_the_end():
    assert cut(list(range(20)), 8, "head") == list(range(8))
    assert cut(list(range(20)), 8, "head_tail") == [0, 1, 14, 15, 16, 17, 18, 19]
    words = " ".join(f"w{i}" for i in range(100))
    tok = HashTokenizer(1 << 20, "head_tail")
    ids = tok(words, max_length=10)["input_ids"]
    assert ids[1:-1] == [tok.token_id(f"w{i}") for i in (0, 1, 94, 95, 96, 97, 98, 99)]
    wp = tiny_tokenizer()
    set_truncation(wp, "head_tail")
    (wp_ids,) = encode_texts(wp, [words], 10)
    assert len(wp_ids) == 10 and wp_ids[0] == wp.cls_token_id and wp_ids[-1] == wp.sep_token_id
    kept = wp.decode(wp_ids[1:-1])
    assert kept.startswith("w0") and kept.endswith("w99") and "w50" not in kept, kept
