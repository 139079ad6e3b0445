"""Chapter 00's checkpoint script keeps its measuring half in distrinews_course.checkpoint_watch: a rank's report must
say when the loaded weights are not the trained ones, where they landed, and how far the ranks were apart, so that a
wrong figure there makes section 6's checks (concept_runs.checkpoint_claims) fail."""

import copy

import torch

from distrinews_course import checkpoint_watch as W
from distrinews_course import concept_runs as R
from distrinews_course.demo import Ctx

OUTPUT = "[rank 0] saved outputs/concepts/04_checkpoint.pt\n"


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def _ranks(loaded_shift=0.0, restore_optimizer=True):
    """Two ranks' reports built by rank_report, as the script builds them (one process here: no group, so apart is 0
    and before_wrap is set as a 2-rank run measures it)."""
    trained = _model()
    opt = torch.optim.AdamW(trained.parameters(), lr=1e-2)
    start = copy.deepcopy(trained.state_dict())
    W.train_a_little(trained, opt, steps=3)
    moved = max((trained.state_dict()[k] - v).abs().max().item() for k, v in start.items())
    ckpt = {"model": copy.deepcopy(trained.state_dict()), "optimizer": opt.state_dict(), "epoch": 1}
    loaded = _model()
    loaded.load_state_dict(ckpt["model"])
    with torch.no_grad():
        loaded[0].weight[0, 0] += loaded_shift
    restored = torch.optim.AdamW(loaded.parameters(), lr=1e-2)
    if restore_optimizer:
        restored.load_state_dict(ckpt["optimizer"])
    apart = W.Apart()
    for name in ("at_wrap", "loaded_apart"):
        assert apart(name, loaded) == 0.0  # a world of one: every rank is rank 0
    apart.seen["before_wrap"] = 0.3
    ranks = [
        W.rank_report(Ctx(r, r, 2, "gloo", torch.device("cpu")), ckpt, apart, trained, loaded, (opt, restored))
        for r in (0, 1)
    ]
    ddp_keys = list(torch.nn.DataParallel(trained).state_dict())  # a wrapper's keys, prefixed as DDP's are
    writer = {"rank": 0, "pid": ranks[0]["pid"]}
    return moved, {"keys": list(ckpt["model"]), "epoch": 1, "writer": writer, "ranks": ranks, "ddp_keys": ddp_keys}


def test_the_report_supports_every_claim_and_training_moved_the_weights():
    moved, ck = _ranks()
    assert moved > 1e-3
    assert [c.text for c in R.checkpoint_claims(OUTPUT, ck, 2) if c.checked and not c.holds] == []
    assert ck["ranks"][0]["loaded_on"] == "cpu" and ck["ranks"][0]["identical"] is True


def test_loaded_weights_that_differ_from_the_trained_ones_fail_the_check():
    _, ck = _ranks(loaded_shift=1e-3)
    failing = [c.text for c in R.checkpoint_claims(OUTPUT, ck, 2) if c.checked and not c.holds]
    assert failing and "exactly the trained weights" in failing[0]


def test_an_optimizer_left_unrestored_fails_the_check():
    """The script once restored the optimizer into an AdamW it threw away: the kept one then has no state."""
    _, ck = _ranks()
    assert ck["ranks"][0]["opt_restored_steps"] == ck["ranks"][0]["opt_trained_steps"] == 3
    _, ck = _ranks(restore_optimizer=False)
    assert ck["ranks"][0]["opt_restored_steps"] == 0 and ck["ranks"][0]["opt_same"] is False
    failing = [c.text for c in R.checkpoint_claims(OUTPUT, ck, 2) if c.checked and not c.holds]
    assert len(failing) == 1 and "resumed optimizer" in failing[0], failing


def test_an_optimizer_with_other_moments_is_not_the_same():
    trained = _model()
    opt = torch.optim.AdamW(trained.parameters(), lr=1e-2)
    W.train_a_little(trained, opt, steps=3)
    restored = torch.optim.AdamW(trained.parameters(), lr=1e-2)
    restored.load_state_dict(copy.deepcopy(opt.state_dict()))
    assert W.optimizer_state(opt, restored)["opt_same"] is True
    next(iter(restored.state.values()))["exp_avg"].add_(1e-3)
    assert W.optimizer_state(opt, restored) == {"opt_trained_steps": 3, "opt_restored_steps": 3, "opt_same": False}
