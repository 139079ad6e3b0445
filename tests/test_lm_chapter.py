"""Chapter 11's machinery: the claims it checks (distrinews_course.lm_claims) hold on the real thing and fail on a wrong
figure; its exercise checkers (lm_exercises) pass the reference answers and name every wrong one in one line."""

import functools
import hashlib
import importlib.util
import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from distrinews_course import lm_claims as claims
from distrinews_course import lm_exercises as lx
from distrinews_course.attempt import grade
from distrinews_lib.data import sources, tokenization
from distrinews_lib.data.tokenization import tiny_tokenizer
from distrinews_lib.lm import data as lm
from distrinews_lib.lm.task import CLM, MLM

from .helpers import ROOT

spec = importlib.util.spec_from_file_location(
    "answers_11_test", ROOT / "notebooks" / "answers" / "11_language_modelling.py"
)
answers = importlib.util.module_from_spec(spec)
spec.loader.exec_module(answers)


@pytest.fixture(scope="module")
def vocab():
    wp = tiny_tokenizer()
    ids = [
        x[1:-1] for x in tokenization.tokenize_texts(sources.load_embedded().train_texts[:300], wp, 64, use_cache=False)
    ]
    voc = lm.VocabSubset.from_corpus(wp, ids, 512)
    return voc, lm.pack([voc.encode(x) for x in ids], 16, voc.sep_token_id)


@pytest.fixture(scope="module")
def tiny_gpt(vocab):
    voc, _ = vocab
    model, _ = CLM.build_model(voc, 16, seed=0)
    return model.eval()


# the script ---------------------------------------------------------------------------------------------------


def test_the_objective_enters_train_ddp_in_two_places_and_a_branch_would_show(tmp_path):
    objective, ddp = claims.script_lines()
    assert claims.objective_enters_twice(objective).holds
    assert any(x.startswith("out = model(") and x.endswith('labels=batch["labels"])') for x in objective)  # whole
    assert "dist.barrier()" in [x.split("  #")[0] for x in ddp]
    assert any("DDP(model" in x for x in ddp) and any("set_epoch" in x for x in ddp)
    branched = tmp_path / "train.py"
    branched.write_text((ROOT / "scripts" / "train_ddp.py").read_text() + '\nif run.task == "clm":\n    pass\n')
    assert not claims.objective_enters_twice(claims.script_lines(branched)[0]).holds
    branched.write_text((ROOT / "scripts" / "train_ddp.py").read_text() + "\nif cfg.clm:  # a branch\n    pass\n")
    assert not claims.objective_enters_twice(claims.script_lines(branched)[0]).holds
    listing = claims.script_listing(objective, ddp, width=40)
    assert all(len(line) <= 42 for line in listing.splitlines() if line.startswith("  "))
    cut = claims.script_listing(["val = evaluate(model)  # resumed at the end"], [], width=30).splitlines()[1]
    assert cut == "  val = evaluate(model)"  # the comment dropped whole, not cut mid-word


# knowing nothing ---------------------------------------------------------------------------------------------


def _loader(blocks, n=24):
    ds = lm.BlockDataset(blocks[:n], CLM, None, evaluation=True)
    return torch.utils.data.DataLoader(ds, batch_size=8, collate_fn=ds.collator_for(None))


class Guessing(torch.nn.Module):
    """A model that knows nothing by construction: logits drawn at random, whatever the input."""

    def __init__(self, vocab_size):
        super().__init__()
        self.vocab_size = vocab_size

    def forward(self, input_ids, attention_mask=None):
        g = torch.Generator().manual_seed(int(input_ids.sum()))
        return SimpleNamespace(logits=0.3 * torch.randn(*input_ids.shape, self.vocab_size, generator=g))


class Peeking(Guessing):
    """A model that knows the next token: its real loss is far below a random token's."""

    def forward(self, input_ids, attention_mask=None):
        logits = torch.zeros(*input_ids.shape, self.vocab_size)
        logits.scatter_(2, torch.roll(input_ids, -1, 1).unsqueeze(-1), 5.0)
        return SimpleNamespace(logits=logits)


def test_a_model_that_knows_nothing_passes_and_one_that_peeks_is_caught(vocab):
    voc, blocks = vocab
    from distrinews_lib.training import evaluation

    loader = _loader(blocks, n=64)
    initial = evaluation.evaluate(Guessing(len(voc)), loader, device=torch.device("cpu"), task=CLM)
    guess = claims.blind_guess(Guessing(len(voc)), loader, len(voc))
    assert all(c.holds for c in guess.claims(initial.loss)), guess
    assert "perplexity 512" in guess.table()
    assert not guess.claims(initial.loss + 0.01)[0].holds  # a loss that is not the evaluation's
    peek = claims.blind_guess(Peeking(len(voc)), loader, len(voc))
    assert peek.real < peek.blind - 1
    assert not peek.claims(peek.real)[1].holds


def test_the_recomputed_loss_is_independent_and_catches_an_evaluation_without_the_shift(vocab, tiny_gpt):
    """blind_guess recomputes the next-token loss itself: an evaluation that forgot to shift (each position scored
    against its own token) gives another loss, and the claim fails on it."""
    from distrinews_lib.lm.task import CausalLM
    from distrinews_lib.training import evaluation

    class Unshifted(CausalLM):
        def predicting(self, logits, labels):
            return logits, labels

    voc, blocks = vocab
    loader = _loader(blocks)
    guess = claims.blind_guess(tiny_gpt, loader, len(voc))
    right = evaluation.evaluate(tiny_gpt, loader, device=torch.device("cpu"), task=CLM)
    wrong = evaluation.evaluate(tiny_gpt, loader, device=torch.device("cpu"), task=Unshifted())
    assert guess.claims(right.loss)[0].holds
    assert abs(wrong.loss - right.loss) > 1e-4
    assert not guess.claims(wrong.loss)[0].holds


# training ----------------------------------------------------------------------------------------------------


def test_perplexity_must_fall_every_epoch_by_five_times_with_the_ranks_agreeing():
    ok = "parameters identical on all 2 ranks: True (max difference 0)"
    assert all(c.holds for c in claims.perplexity_fell(ok, [4207, 335, 266], 2))
    assert not all(c.holds for c in claims.perplexity_fell(ok, [4207, 266, 335], 2))  # a rise
    assert not all(c.holds for c in claims.perplexity_fell(ok, [4207, 1500, 900], 2))  # under 5x
    assert not all(c.holds for c in claims.perplexity_fell(ok.replace("True", "False"), [4207, 335, 266], 2))
    initial = SimpleNamespace(loss=8.344, perplexity=4206.7)
    table = claims.epoch_table(
        initial,
        [
            {
                "epoch": 1,
                "optimizer_steps": 201,
                "train_loss": 6.3,
                "val_loss": 5.8,
                "val_perplexity": 335.4,
                "epoch_time_s": 14.6,
            }
        ],
    )
    assert table.splitlines()[1].split() == ["0", "8.344", "4206.7"] and "335.4" in table
    assert table.splitlines()[0].split()[1] == "steps" and table.splitlines()[2].split()[:2] == ["1", "201"]


def test_the_ddp_evaluation_must_equal_one_process_on_every_block():
    """The in-process evaluation of the saved model and the DDP run's figure: equal within 1e-5 nats on as many
    blocks; a loss off by 1e-4 (a shard alone, a duplicate counted) or a block count off fails."""
    one = SimpleNamespace(loss=5.6178617, perplexity=math.exp(5.6178617), n=794)
    epoch = {"val_loss": 5.617862, "val_perplexity": 275.3001, "val_examples": 794}
    assert claims.ddp_evaluation_exact(one, epoch).holds
    assert not claims.ddp_evaluation_exact(one, {**epoch, "val_loss": 5.617962}).holds
    assert not claims.ddp_evaluation_exact(one, {**epoch, "val_examples": 795}).holds
    assert "0 padded duplicates" in claims.validation_split(794, 2)
    assert "1 padded duplicate in" in claims.validation_split(795, 2)
    assert "2 padded duplicates" in claims.validation_split(794, 4)


def test_the_seen_prompt_shows_a_word_outside_the_vocabulary_as_unk(vocab):
    voc, _ = vocab
    seen = claims.seen_prompt(voc, "the zyzzyvas")
    assert seen.startswith("the") and "[UNK]" in seen
    assert "[UNK]" not in claims.seen_prompt(voc, "the")


def test_the_recomputed_loss_message_does_not_give_exercise_1_away():
    text = claims.BlindGuess(8.3444, 8.3435, 0.0018, 4096).claims(8.3444)[0].text
    assert "8.3444" in text and ":-1" not in text and "1:]" not in text and "cross_entropy" not in text


def test_real_text_must_be_likelier_for_every_text_and_the_median_over_five_times(vocab, tiny_gpt):
    voc, _ = vocab
    assert claims.real_text_likelier([(4000, 300), (4100, 200), (3900, 800)]).holds
    assert not claims.real_text_likelier([(4000, 300), (4100, 200), (3900, 4000)]).holds  # one text not likelier
    assert not claims.real_text_likelier([(4000, 1000), (4100, 1000), (3900, 900)]).holds  # the median 4x
    untrained = claims.text_perplexity(tiny_gpt, voc, "Oil prices rise as stocks fall on Wall Street", 16)
    assert 100 < untrained < 5 * len(voc)  # a random model: about the vocabulary's size


# masking -----------------------------------------------------------------------------------------------------


def test_masking_claims_hold_for_the_collator_and_fail_for_a_wrong_one(vocab):
    voc, blocks = vocab
    first, again = claims.first_masks(blocks[:64], voc, seed=42)
    share = claims.mask_share(blocks[:64], voc, seed=42)
    alike = claims.masks_alike(blocks[:64], voc, seed=42)
    by_epoch = claims.same_blocks_by_epoch(blocks[:64], voc, seed=42)
    assert all(c.holds for c in claims.masking_claims(first, again, share, alike, by_epoch)), (share, alike)
    special = [voc.cls_token_id, voc.sep_token_id, voc.pad_token_id]
    for choose in (no_epoch, no_index):  # exercise 2's mutants, as the collator's mask_block: every block alike

        def blind(ids, vocab, seed, epoch, index, choose=choose):
            chosen = choose(ids, seed, epoch, index, special)
            return ids, torch.where(chosen, ids, torch.full_like(ids, lm.IGNORE))

        wrong = claims.masks_alike(blocks[:64], voc, seed=42, mask=blind)
        assert not claims.masking_claims(first, again, share, wrong, by_epoch)[1].holds, (choose.__name__, wrong)
    _, again_other_epoch = claims.first_masks(blocks[:64], voc, seed=42, epochs=(2, 3))
    assert not claims.masking_claims(first, again_other_epoch, share, alike, by_epoch)[0].holds
    assert not claims.masking_claims(first, again, (0.25, share[1]), alike, by_epoch)[2].holds
    alike_batches = {k: {**b, "labels": first[min(first)]["labels"]} for k, b in first.items()}
    assert not claims.masking_claims(alike_batches, again, share, alike, by_epoch)[
        3
    ].holds  # one mask for every rank and epoch
    for rate in (0.13, 0.17):  # a collator 2 points off the 15% fails: the margin is counted over 40 epochs
        wrong = claims.mask_share(blocks[:64], voc, seed=42, mask=functools.partial(lm.mask_block, probability=rate))
        assert not claims.masking_claims(first, again, wrong, alike, by_epoch)[2].holds, (rate, wrong)
    shown = claims.shown_block(first[1, 0], voc)
    assert shown.count("<") == int((first[1, 0]["labels"][0] != lm.IGNORE).sum())


def test_a_collator_blind_to_the_samplers_epoch_fails_the_collator_check(vocab, monkeypatch):
    """The first batches of two epochs hold other blocks, so they mask otherwise even when the collator never reads
    the sampler's epoch; the same blocks across set_epoch(1) and set_epoch(2) catch that wiring."""
    voc, blocks = vocab
    first, again = claims.first_masks(blocks[:64], voc, seed=42)
    share, alike = claims.mask_share(blocks[:64], voc, seed=42), claims.masks_alike(blocks[:64], voc, seed=42)
    right = claims.same_blocks_by_epoch(blocks[:64], voc, seed=42)
    assert claims.masking_claims(first, again, share, alike, right)[3].holds
    monkeypatch.setattr(
        lm.BlockDataset, "collator_for", lambda self, sampler=None, **_: lm.LMCollator(self.task, self.vocab, self.seed)
    )  # the sampler dropped: every epoch masks as epoch 0
    blind = claims.same_blocks_by_epoch(blocks[:64], voc, seed=42)
    assert not claims.masking_claims(first, again, share, alike, blind)[3].holds
    blind_first, _ = claims.first_masks(blocks[:64], voc, seed=42)
    assert lm.all_masks_differ([b["labels"] for b in blind_first.values()])  # why first batches alone cannot tell


def test_a_collator_that_draws_from_the_global_generator_fails_the_resumed_check(vocab):
    """first_masks rebuilds the batch as a resumed process would: new objects, torch's generator elsewhere. Masks
    drawn from the global generator then differ, and the check says so."""
    from distrinews_lib.lm.task import MaskedLM

    class GlobalMasking(MaskedLM):
        def inputs_and_labels(self, ids, index, collator):
            chosen = torch.rand(ids.shape) < 0.15
            return ids, torch.where(chosen, ids, torch.full_like(ids, lm.IGNORE))

    voc, blocks = vocab
    share, alike = claims.mask_share(blocks[:64], voc, seed=42), claims.masks_alike(blocks[:64], voc, seed=42)
    by_epoch = claims.same_blocks_by_epoch(blocks[:64], voc, seed=42)
    first, again = claims.first_masks(blocks[:64], voc, seed=42, task=GlobalMasking())
    assert not claims.masking_claims(first, again, share, alike, by_epoch)[0].holds
    before = torch.random.get_rng_state()
    claims.first_masks(blocks[:64], voc, seed=42)
    assert torch.equal(before, torch.random.get_rng_state())  # the notebook's generator is left alone


def test_the_figures_draw(vocab, tmp_path):
    from distrinews_course import lm_figures

    voc, blocks = vocab
    first, again = claims.first_masks(blocks[:64], voc, seed=42)
    lm_figures.perplexity_per_epoch([4207, 335, 266], 2, "AG News", 4096, save_to=tmp_path / "a.png")
    lm_figures.text_surprise([(4000, 300), (4100, 200)], save_to=tmp_path / "b.png")
    fig = lm_figures.masks(first, again, save_to=tmp_path / "c.png")
    assert len(fig.axes[0].get_yticklabels()) == len(first) + 1
    assert all((tmp_path / f"{n}.png").stat().st_size > 5000 for n in "abc")


# exercise 1: the next-token loss ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def loss_cases(vocab, tiny_gpt):
    _, blocks = vocab
    ids = torch.tensor(blocks[:4])
    return lambda: lx.next_token_cases({"untrained": tiny_gpt}, ids)


def _flat(logits, ids):
    return logits.reshape(-1, logits.shape[-1]), ids.reshape(-1)


def no_shift(logits, ids):
    return F.cross_entropy(*_flat(logits, ids))


def reversed_shift(logits, ids):
    return F.cross_entropy(*_flat(logits[:, 1:], ids[:, :-1]))


def summed(logits, ids):
    return F.cross_entropy(*_flat(logits[:, :-1], ids[:, 1:]), reduction="sum")


def rolled(logits, ids):
    return F.cross_entropy(*_flat(logits, torch.roll(ids, -1, 1)))


def a_float(logits, ids):
    return float(F.cross_entropy(*_flat(logits[:, :-1], ids[:, 1:])))


def per_token(logits, ids):
    return F.cross_entropy(*_flat(logits[:, :-1], ids[:, 1:]), reduction="none")


@pytest.mark.parametrize(
    "fn, words",
    [
        (no_shift, "(no shift)"),
        (reversed_shift, "shifted the wrong way"),
        (summed, "the sum over"),
        (rolled, "torch.roll wraps around"),
        (a_float, "return one number as a 0-dim"),
        (per_token, "0-dim tensor"),
    ],
    ids=lambda x: getattr(x, "__name__", ""),
)
def test_next_token_loss_mutants_each_named(loss_cases, fn, words):
    failed = grade(fn, loss_cases, quiet=True).failed
    assert failed and words in failed and "\n" not in failed, failed


def test_next_token_loss_reference_passes(loss_cases):
    assert grade(answers.next_token_loss, loss_cases, quiet=True).ok


# exercise 2: masking ---------------------------------------------------------------------------------------------


def _gen(*key):
    return torch.Generator().manual_seed(hash(key) & (2**62 - 1))


def _choose(ids, g, special, rate=0.15, one_at_least=True):
    text = ~torch.isin(ids, torch.tensor(special))
    chosen = (torch.rand(ids.shape, generator=g) < rate) & text
    if one_at_least and text.any() and not chosen.any():
        chosen[text.nonzero()[0]] = True
    return chosen


def global_rng(ids, seed, epoch, index, special, rate=0.15):
    return (torch.rand(ids.shape) < rate) & ~torch.isin(ids, torch.tensor(special))


def reseeds_global(ids, seed, epoch, index, special, rate=0.15):
    torch.manual_seed(hash((seed, epoch, index)) & (2**62 - 1))
    return _choose(ids, None, special)


def no_epoch(ids, seed, epoch, index, special, rate=0.15):
    return _choose(ids, _gen(seed, index), special)


def no_index(ids, seed, epoch, index, special, rate=0.15):
    return _choose(ids, _gen(seed, epoch), special)


def no_seed(ids, seed, epoch, index, special, rate=0.15):
    return _choose(ids, _gen(epoch, index), special)


def added(ids, seed, epoch, index, special, rate=0.15):
    return _choose(ids, torch.Generator().manual_seed(seed + epoch + index), special)


def specials_too(ids, seed, epoch, index, special, rate=0.15):
    return torch.rand(ids.shape, generator=_gen(seed, epoch, index)) < rate


def most_tokens(ids, seed, epoch, index, special, rate=0.15):
    return _choose(ids, _gen(seed, epoch, index), special, rate=1 - rate)


def may_predict_nothing(ids, seed, epoch, index, special, rate=0.15):
    return _choose(ids, _gen(seed, epoch, index), special, one_at_least=False)


def a_list(ids, seed, epoch, index, special, rate=0.15):
    return _choose(ids, _gen(seed, epoch, index), special).tolist()


@pytest.mark.parametrize(
    "fn, words",
    [
        (global_rng, "moved torch's global generator"),
        (reseeds_global, "moved torch's global generator"),
        (no_epoch, "the same in epochs 1 and 2"),
        (no_index, "without the block's index"),
        (no_seed, "the run's seed must enter it"),
        (added, "seed + epoch + index collide"),
        (specials_too, "chose a special token"),
        (most_tokens, "rate=0.15 asks for about 15%"),
        (may_predict_nothing, "had nothing to predict"),
        (a_list, "return a tensor of (32,) booleans"),
    ],
    ids=lambda x: getattr(x, "__name__", ""),
)
def test_mask_positions_mutants_each_named(fn, words):
    failed = grade(fn, lx.mask_cases(fn), quiet=True).failed
    assert failed and words in failed and "\n" not in failed, failed


def test_mask_positions_reference_passes_and_matches_the_library_rule():
    assert grade(answers.mask_positions, lx.mask_cases(answers.mask_positions), quiet=True).ok

    def stub(ids, seed, epoch, index, special_ids, rate=0.15):
        raise NotImplementedError

    assert not grade(stub, lx.mask_cases(stub), quiet=True).attempted
    # the library's collator seeds its generator from the same (seed, epoch, block) digest
    key = hashlib.blake2b(b"0:1:0", digest_size=8).digest()
    assert int.from_bytes(key, "little") > 0


# predictions ---------------------------------------------------------------------------------------------------


def test_the_untrained_perplexity_prediction_names_the_quantity_confused():
    assert lx.untrained_perplexity_prediction(4096, 4207, 4096) is None
    assert lx.untrained_perplexity_prediction(3000, 4207, 4096) is None  # within a factor of 2
    assert "is the loss" in lx.untrained_perplexity_prediction(math.log(4096), 4207, 4096)
    assert "its inverse" in lx.untrained_perplexity_prediction(1 / 4096, 4207, 4096)
    assert "but the run gave 4207" in lx.untrained_perplexity_prediction(100, 4207, 4096)
    assert "no prediction" in lx.untrained_perplexity_prediction(None, 4207, 4096)
    assert "write a number" in lx.untrained_perplexity_prediction("4096", 4207, 4096)
    assert lx.untrained_perplexity_prediction(answers.PREDICTED_UNTRAINED_PERPLEXITY, 4207, 4096) is None


def test_the_lm_blocks_and_vocab_predictions_name_each_mistake():
    assert lx.lm_prediction("lower", clm=300, mlm=100) is None
    assert "both sides" in lx.lm_prediction("higher", clm=300, mlm=100)
    assert "15% of the tokens" in lx.lm_prediction("lower", clm=100, mlm=300)
    assert "write 'lower' or 'higher'" in lx.lm_prediction("less", 300, 100)
    assert "fill in" in lx.lm_prediction(None, 300, 100)
    assert lx.blocks_prediction({"blocks": 3212, "steps": 101}, 6424, 3212, 201, 101) is None
    assert "half as many" in lx.blocks_prediction({"blocks": 12848, "steps": 402}, 6424, 3212, 201, 101)
    assert "twice the tokens" in lx.blocks_prediction({"blocks": 3212, "steps": 201}, 6424, 3212, 201, 101)
    assert "fill in" in lx.blocks_prediction({"blocks": None, "steps": 101}, 6424, 3212, 201, 101)
    assert answers.predict_blocks(6424, 201) == {"blocks": 3212, "steps": 101}
    small, big = {"coverage": 0.889, "output_weights": 524288}, {"coverage": 0.964, "output_weights": 1048576}
    assert lx.vocab_prediction({"coverage_percent": 96, "output_layer_times": 2}, small, big) is None
    assert "rare ones" in lx.vocab_prediction({"coverage_percent": 100, "output_layer_times": 2}, small, big)
    assert "vocabulary x width" in lx.vocab_prediction({"coverage_percent": 96, "output_layer_times": 4}, small, big)
    assert lx.vocab_prediction(answers.predict_vocab(88.9), small, big) is None


def test_the_prediction_runs_claims_hold_and_fail_on_a_wrong_figure():
    cfg = SimpleNamespace(batch_size=16)
    run = SimpleNamespace(train_ds=[0] * 6424, tokenizer=[0] * 4096)
    ex = lx.PredictionRuns(cfg, run, [], 60, 2, steps_per_epoch=201)
    ex.done = {
        3: {"clm": 350.0, "mlm": 120.0},
        4: {"short": 6424, "long": 3212, "steps_short": ex._steps(6424), "steps_long": ex._steps(3212)},
        5: {
            4096: {"coverage": 0.889, "output_weights": 524288, "parameters": 1000000},
            8192: {"coverage": 0.964, "output_weights": 1048576, "parameters": 1500000},
        },
    }
    assert ex._steps(6424) == 201 and ex._steps(3212) == 101
    assert all(c.holds for c in ex.claims())
    assert ex.grade(4, {"blocks": 3212, "steps": 101}) is None and "3212" in ex.line(4)
    ex.done[4] = {**ex.done[4], "long": 4000}
    assert not ex.claims()[1].holds
    ex.done[3] = {"clm": 350.0, "mlm": 2000.0}
    assert not ex.claims()[0].holds
    ex.done[5][8192]["coverage"] = 0.999
    assert not ex.claims()[3].holds


def test_mlm_masks_through_the_task_as_the_collator_does(vocab):
    voc, blocks = vocab
    ds = lm.BlockDataset(blocks[:8], MLM, voc, seed=3)
    batch = ds.collator_for(None)([ds[i] for i in range(4)])
    assert bool((batch["labels"] != lm.IGNORE).any())


def _masked_lm_showing(p_mask: float, p_random: float):
    """A masked LM choosing 15% as BERT does, showing them p_mask as [MASK] and p_random as another token."""

    def mask(ids, tok, seed, epoch, index):
        g = torch.Generator().manual_seed(hash((seed, epoch, index)) & (2**63 - 1))
        special = torch.tensor([tok.cls_token_id, tok.sep_token_id, tok.pad_token_id])
        chosen = (torch.rand(ids.shape, generator=g) < 0.15) & ~torch.isin(ids, special)
        roll, inputs = torch.rand(ids.shape, generator=g), ids.clone()
        inputs[chosen & (roll < p_mask)] = tok.mask_token_id
        swap = chosen & (roll >= p_mask) & (roll < p_mask + p_random)
        inputs[swap] = torch.randint(len(tok), ids.shape, generator=g)[swap]
        return inputs, torch.where(chosen, ids, torch.full_like(ids, lm.IGNORE))

    def inputs_and_labels(ids, index, collator):
        pairs = [mask(row, collator.tokenizer, collator.seed, collator.epoch, int(i)) for row, i in zip(ids, index)]
        return torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])

    return SimpleNamespace(inputs_and_labels=inputs_and_labels)


def test_the_80_10_10_split_holds_for_the_collator_and_fails_for_a_wrong_split(vocab):
    voc, blocks = vocab
    split = claims.mask_split(blocks[:128], voc, seed=42)
    assert split["chosen"] > 10_000  # 4 standard errors of 80% under 1.6 points
    assert claims.split_claim(split).holds, split
    assert abs(split["mask"] + split["random"] + split["kept"] - 1) < 1e-9
    assert claims.split_claim(claims.mask_split(blocks[:128], voc, 42, task=_masked_lm_showing(0.8, 0.1))).holds
    for p_mask, p_random in ((0.75, 0.125), (0.72, 0.14), (0.8, 0.05), (1.0, 0.0)):  # 75/12.5/12.5, ..., all [MASK]
        wrong = claims.mask_split(blocks[:128], voc, 42, task=_masked_lm_showing(p_mask, p_random))
        assert not claims.split_claim(wrong).holds, (p_mask, p_random, wrong)
    assert not claims.split_claim({**split, "mask": 0.7, "kept": 0.2}).holds  # 70/10/20


def test_the_idea_picture_deals_blocks_as_distributed_sampler_and_marks_each_repeat_once(tmp_path):
    from distrinews_course import lm_figures

    assert lm_figures.validation_deal(7, 2) == {0: [0, 2, 4, 6], 1: [1, 3, 5, 0]}  # block 0 repeated on rank 1
    assert lm_figures.validation_deal(9, 4)[3] == [3, 7, 2]  # 3 repeats, 0 1 2: the list starts again
    words = "oil prices rise as storm [SEP] stocks".split()

    def texts(fig):
        return [t.get_text() for ax in fig.axes for t in ax.texts]

    fig = lm_figures.lm_idea(words, 7, 2, save_to=tmp_path / "idea.png")
    shown = texts(fig)
    assert sum("again" in t for t in shown) == 1 and any(t.startswith("block 0 again") for t in shown)
    assert "the 1 repeat dropped" in fig.axes[1].get_xlabel()
    assert shown.count("(none)") == 1 and shown.count("stocks") == 2  # input at the end, target one to its left
    assert (tmp_path / "idea.png").stat().st_size > 5000
    even = lm_figures.lm_idea(words, 8, 2)
    assert not any("again" in t for t in texts(even)) and "the 0 repeats" in even.axes[1].get_xlabel()


def test_the_plain_mean_of_the_ranks_counts_the_samplers_repeat_twice_and_the_check_tells_it():
    """3 blocks on 2 ranks: DistributedSampler deals rank 0 blocks 0 and 2, rank 1 block 1 and block 0 again. The
    gathered loss is (1 + 1 + 4) / 3 = 2; a plain mean of the ranks' own losses is ((1 + 4) / 2 + (1 + 1) / 2) / 2 =
    1.75. A DDP figure equal to the plain mean fails the check; the text says the check would catch it."""
    one = claims.OneProcess(torch.tensor([31.0, 31.0, 124.0], dtype=torch.float64), torch.tensor([31, 31, 31]))
    assert one.n == 3 and one.loss == 2.0 and one.rank_means(2) == [2.5, 1.0]
    epoch = {"val_loss": 2.0, "val_perplexity": math.exp(2.0), "val_examples": 3}
    right = claims.ddp_evaluation_exact(one, epoch, 2)
    assert right.holds and "gives 1.750000" in right.text and "1 repeated block counted" in right.text
    assert "this check would catch it" in right.text
    assert not claims.ddp_evaluation_exact(one, {**epoch, "val_loss": 1.75}, 2).holds  # the plain mean: caught
    even = claims.OneProcess(torch.tensor([31.0, 62.0], dtype=torch.float64), torch.tensor([31, 31]))
    assert "with no repeated block" in claims.ddp_evaluation_exact(even, {**epoch, "val_loss": 1.5}, 2).text
    blind = claims.OneProcess(torch.tensor([62.0, 31.0, 93.0], dtype=torch.float64), torch.tensor([31, 31, 31]))
    assert "too close for this check to tell" in claims.ddp_evaluation_exact(blind, {**epoch, "val_loss": 2.0}, 2).text


def test_one_process_validation_sums_every_block_once_in_block_order(vocab, tiny_gpt):
    from distrinews_lib.lm.task import token_losses

    voc, blocks = vocab
    ds = lm.BlockDataset(blocks[:40], CLM, voc, 0, evaluation=True)
    sampler = list(reversed(range(len(ds))))  # the loader's order must not matter
    loader = torch.utils.data.DataLoader(ds, batch_size=5, sampler=sampler, collate_fn=ds.collator_for(None))
    one = claims.one_process_validation(tiny_gpt, loader, CLM)
    batch = ds.collator_for(None)([ds[0]])
    s, c = token_losses(tiny_gpt.eval(), batch, CLM)
    assert one.n == len(ds) and torch.allclose(one.sums[0], s[0]) and int(one.counts[0]) == int(c[0])


def test_exercise_5_reads_the_output_layer_from_the_built_models():
    """The output layer's size is counted on the run's own model at each vocabulary, not computed by a formula."""
    cfg = SimpleNamespace(batch_size=16, block_size=32, seed=0)
    run = SimpleNamespace(splits=SimpleNamespace(train_texts=sources.load_embedded().train_texts[:300]), task=CLM)
    found = lx.PredictionRuns(cfg, run, [], 60, 2, steps_per_epoch=1).result(5)
    for size, r in found.items():  # 300 texts hold fewer distinct tokens than 4,096: the vocabulary is what they hold
        assert r["output_weights"] == r["tokens"] * 128 < r["parameters"] and r["tokens"] <= size, (size, r)
    small, big = found[4096], found[8192]
    assert big["parameters"] - small["parameters"] == big["output_weights"] - small["output_weights"]  # tied: once
