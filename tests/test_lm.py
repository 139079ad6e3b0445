"""Language modelling on the DDP plumbing: reproducible masking, exact perplexity under DDP."""

import json

import pytest
import torch

from distrinews_course.launch import torchrun
from distrinews_lib.data import sources, tokenization
from distrinews_lib.data.tokenization import tiny_tokenizer
from distrinews_lib.lm import data as lm

from .helpers import ROOT


@pytest.fixture(scope="module")
def vocab():
    wp = tiny_tokenizer()
    ids = [
        x[1:-1] for x in tokenization.tokenize_texts(sources.load_embedded().train_texts[:500], wp, 64, use_cache=False)
    ]
    return lm.VocabSubset.from_corpus(wp, ids, 1024), ids


def test_the_vocabulary_subset_encodes_and_decodes(vocab):
    voc, ids = vocab
    assert len(voc) == 1024 and voc.ids[:5] == voc.tokenizer.convert_tokens_to_ids(list(lm.VocabSubset.SPECIALS))
    encoded = voc.encode(ids[0])
    assert max(encoded) < 1024 and voc.coverage(ids) > 0.7  # 1,024 of ~30,000 WordPieces keep most of the text
    kept = [t for t in ids[0] if t in voc.index]
    assert voc.decode(voc.encode(kept)) == voc.tokenizer.decode(kept)


def test_masking_is_reproducible_and_differs_by_epoch_and_block(vocab):
    voc, ids = vocab
    block = torch.tensor(voc.encode(ids[0] + ids[1] + ids[2])[:64])
    a = lm.mask_block(block, voc, seed=1, epoch=3, index=7)
    b = lm.mask_block(block, voc, seed=1, epoch=3, index=7)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]), "the same (seed, epoch, block) masks the same way"
    others = [lm.mask_block(block, voc, seed=1, epoch=e, index=i)[1] for e, i in ((4, 7), (3, 8), (5, 9))]
    assert lm.all_masks_differ([a[1], *others])


def test_masking_follows_bert_80_10_10(vocab):
    voc, ids = vocab
    flat = torch.tensor([t for x in ids for t in voc.encode(x)][:20000])
    inputs, labels = lm.mask_block(flat, voc, seed=0, epoch=0, index=0)
    chosen = labels != lm.IGNORE
    share = float(chosen.float().mean())
    masked = float((inputs[chosen] == voc.mask_token_id).float().mean())
    kept = float((inputs[chosen] == flat[chosen]).float().mean())
    assert 0.14 < share < 0.16 and 0.77 < masked < 0.83 and 0.08 < kept < 0.13, (share, masked, kept)
    assert torch.equal(labels[chosen], flat[chosen]), "the labels are the original tokens"


@pytest.mark.slow
def test_perplexity_is_exact_under_ddp_and_ranks_never_mask_alike(tmp_path):
    out = tmp_path / "lm.json"
    torchrun(ROOT / "tests" / "workers" / "lm_checks.py", 2, [out], timeout=180, echo=False)
    r = json.loads(out.read_text())
    for task in ("clm", "mlm"):
        ddp, single = r[task]["ddp"], r[task]["single"]
        assert ddp["n"] == single["n"] == r["blocks"] == 101, "the sampler's padding is dropped"
        assert ddp["tokens"] == single["tokens"]
        assert ddp["perplexity"] == pytest.approx(single["perplexity"], rel=1e-9), task
    rank0, rank1 = r["masks"]
    assert len(rank0) == len(rank1) > 4
    for (i0, m0), (i1, m1) in zip(rank0, rank1):
        assert not set(i0) & set(i1), "the ranks hold different blocks at the same step"
        assert m0 != m1, "... and mask them differently"
    assert rank0[0][1] != rank0[len(rank0) // 2][1] or rank0[0][0] != rank0[len(rank0) // 2][0], "epoch 2 masks anew"


@pytest.mark.slow
def test_a_killed_language_model_run_resumes_bit_identical(tmp_path):
    from distrinews_course import faults

    from .helpers import SCRIPTS

    for task in ("mlm",):  # masking is the state that must come back exactly
        args = [
            "--config",
            "cpu_smoke",
            "--task",
            task,
            "--epochs",
            2,
            "--num_samples",
            320,  # 10 steps an epoch: killed in the first, resumed from its step-5 snapshot, through the second
            "--eval_samples",
            100,
            "--batch_size",
            16,
            "--lr",
            3e-3,
            "--snapshot_every",
            5,
            "--resume",
            "auto",
            "--no-progress",
        ]
        a, b = tmp_path / f"{task}_a", tmp_path / f"{task}_b"
        torchrun(
            SCRIPTS / "train_ddp.py", 2, [*args, "--output", a, "--checkpoint", a / "m.pt"], timeout=240, echo=False
        )
        res = torchrun(
            faults.WRAPPER,
            2,
            ["kill:rank=1:step=7", SCRIPTS / "train_ddp.py", *args, "--output", b, "--checkpoint", b / "m.pt"],
            timeout=300,
            echo=False,
            torchrun_args=["--max-restarts=1"],
        )
        assert "injected fault: kill after step 7" in res.output and "resumed from" in res.output
        sa = torch.load(a / "m.pt", weights_only=True)["state_dict"]
        sb = torch.load(b / "m.pt", weights_only=True)["state_dict"]
        assert all(torch.equal(sa[k], sb[k]) for k in sa), "the resumed LM run must end with the same weights"
        ma, mb = (json.loads((d / "metrics.json").read_text())["epochs"] for d in (a, b))
        assert [e["val_perplexity"] for e in ma] == [e["val_perplexity"] for e in mb]


def test_the_plan_chooses_each_task_once_and_ranks_receive_the_same_object():
    import dataclasses
    import pickle

    from distrinews_lib import tasks
    from distrinews_lib.errors import UserError
    from distrinews_lib.training.classify import CLASSIFY
    from distrinews_lib.training.config import RunConfig

    choices = next(f.metadata["choices"] for f in dataclasses.fields(RunConfig) if f.name == "task")
    assert set(tasks.registered()) == set(choices)  # --task offers exactly the registered tasks
    with pytest.raises(UserError, match="unknown --task 'translate': choose one of classify, clm, mlm"):
        tasks.choose_task("translate")
    for name in ("classify", "clm", "mlm"):
        task = tasks.choose_task(name)
        assert task.name == name and tasks.choose_task(name) is task
        assert pickle.loads(pickle.dumps(task)) is task, "rank 0's broadcast plan must carry the task, not a copy"
    assert tasks.choose_task("classify") is CLASSIFY


def test_the_core_never_imports_the_language_models():
    import subprocess
    import sys

    code = (
        "import sys, runpy; sys.argv = ['train_ddp.py', '--help']\n"
        "try: runpy.run_path('scripts/train_ddp.py', run_name='x')\nexcept SystemExit: pass\n"
        "print(sorted(m for m in sys.modules if m.startswith('distrinews_lib.lm')))"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip().splitlines()[-1] == "[]", r.stdout + r.stderr


def test_the_accelerate_script_refuses_a_language_model_task(tmp_path):
    from .helpers import SCRIPTS, run_script

    r = run_script(
        [
            SCRIPTS / "train_accelerate.py",
            "--config",
            "cpu_smoke",
            "--task",
            "clm",
            "--output",
            tmp_path,
            "--checkpoint",
            tmp_path / "m.pt",
        ],
        timeout=120,
    )
    assert r.returncode == 2 and "train_ddp.py" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.bench
@pytest.mark.slow
def test_the_lm_benchmark_runs(tmp_path):
    from .helpers import SCRIPTS, run_script

    r = run_script([SCRIPTS / "bench_lm.py", "--quick", "--tasks", "clm", "--out", tmp_path / "lm.json"], timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    run = json.loads((tmp_path / "lm.json").read_text())["runs"]["clm"]
    assert run["perplexity_by_epoch"][-1] < run["perplexity_by_epoch"][0] and run["processes"] == 2
