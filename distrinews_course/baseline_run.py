"""Chapter 01's run, read back: the table of what train_single.py recorded in metrics.json, the claims the chapter
makes about it, the sentence on its throughput, and the checks on the checkpoint it saved.

    m = load_metrics("outputs/single")
    print(run_table(m)); settle(run_claims(m, epochs_asked=EPOCHS))
    Markdown(throughput_note(m))
"""

from __future__ import annotations

from .claims import Claim
from .notebook import accuracy_floor

FIRST_EPOCH_SLOWER = 0.95  # the first epoch counts as slower when under 95% of the later epochs' slowest
RELOAD_POINTS = 0.005  # the reloaded checkpoint's accuracy may differ from the run's by half a point (see below)


def run_table(m: dict) -> str:
    """The data, the model and one line per epoch."""
    held_out, test_split = m["data"]["test_size"], m["data"]["full_sizes"]["test"]
    which = (
        "the whole test split"
        if held_out == test_split
        else f"a class-balanced sample of the test split's {test_split:,}"
    )
    lines = [
        f"data : {m['data']['title']}: {m['data']['train_size']:,} training texts; evaluated on {held_out:,} held-out "
        f"texts, {which}",
        f"model: {m['model']['resolved']} ({m['model']['num_parameters'] / 1e6:.1f}M parameters)",
        padding_line(m),
        "",
        f"{'epoch':>5} {'train loss':>11} {'val loss':>9} {'val acc':>8} {'seconds':>8} {'samples/s':>10}",
    ]
    for e in m["epochs"]:
        lines.append(
            f"{e['epoch']:>5} {e['train_loss']:>11.4f} {e['val_loss']:>9.4f} {100 * e['val_accuracy']:>7.2f}% "
            f"{e['epoch_time_s']:>8.1f} {e['samples_per_s']:>10.0f}"
        )
    return "\n".join(lines)


def padding_line(m: dict) -> str:
    """How long the texts were (mean and spread of the tokens per text, over the last epoch, and where they are cut)
    and what share of the tokens the batches carried was padding: what exercise 2 reasons from."""
    e, cfg = m["epochs"][-1], m["config"]
    mean = e["train_tokens"] / e["train_samples"]
    spread = max(e["sum_sq_len"] / e["train_samples"] - mean**2, 0.0) ** 0.5
    how = "grouped by length" if cfg.get("group_by_length") else "in random batches"
    return (
        f"texts: {mean:.1f} tokens on average (spread {spread:.1f}, cut at {cfg['max_length']}); "
        f"{100 * m['aggregates']['padding_fraction']:.2f}% of the tokens in the batches of {cfg['batch_size']} "
        f"({how}) were padding"
    )


def padding_guess_ok(predicted_percent, measured_fraction: float) -> bool:
    """Exercise 2: a prediction of the padding share of random (not length-grouped) batches, in percent, is right
    within 2/3 to 3/2 of what the run measured. The estimate the table supports, 1 - mean / cut (each random batch of
    32 is padded to its longest text, nearly always the cut: (64 - 50) / 64 = 22% on cpu_smoke), falls inside; the
    grouped figure (under 1%) and "half the tokens" do not."""
    if predicted_percent is None or measured_fraction <= 0:
        return False
    return 2 / 3 < predicted_percent / (100 * measured_fraction) < 3 / 2


def run_claims(m: dict, epochs_asked: int | None = None, preset: str | None = None) -> list[Claim]:
    """What the chapter says about its run: every epoch asked for recorded (epochs_asked, else the preset file's
    epochs: not the record's own config, which a run that dropped the flag would agree with), real AG News, the
    held-out texts the preset file asks for (eval_samples, read from the file for the same reason), an accuracy
    floor (accuracy_floor: 80% from random weights, 90% pretrained; chance is 25%), and a training loss that went
    down."""
    from distrinews_lib.training.config import read_preset

    epochs = m["epochs"]
    preset = preset or m["config"]["preset"]
    preset_values = read_preset(preset)[1]
    want = epochs_asked or preset_values["epochs"]
    asked_by = "asked for" if epochs_asked else f"the {preset} preset asks for"
    held_out, test_split = m["data"]["test_size"], m["data"]["full_sizes"]["test"]
    asked = min(preset_values.get("eval_samples") or test_split, test_split)
    acc, floor = m["aggregates"]["final_val_accuracy"], accuracy_floor(m)
    return [
        Claim(
            f"metrics.json holds all {want} epochs {asked_by}", [e["epoch"] for e in epochs] == list(range(1, want + 1))
        ),
        Claim(
            f"it trained on real AG News ({m['data']['title']})",
            not m["data"]["is_synthetic"] and m["data"]["source"] in ("embedded", "folder", "hub"),
        ),
        Claim(
            f"every epoch was evaluated on the {held_out:,} held-out texts the {preset} preset asks for (of the test "
            f"split's {test_split:,})",
            held_out == asked and all(e["val_examples"] == held_out for e in epochs),
        ),
        Claim(f"accuracy {100 * acc:.1f}% on those texts, at least {100 * floor:.0f}% (chance is 25%)", acc >= floor),
        Claim(
            "the training loss went down from the first epoch to the last",
            epochs[-1]["train_loss"] < epochs[0]["train_loss"],
        ),
    ]


def throughput_note(m: dict) -> str:
    """A Markdown paragraph on the run's samples/s and accuracy, in the run's own numbers."""
    sps = [e["samples_per_s"] for e in m["epochs"]]
    acc = m["aggregates"]["final_val_accuracy"]
    warm_up = (
        "A first epoch can pay for warming up (memory allocation, caches, on a GPU kernel selection), so the course "
        "compares the later, steady epochs."
    )
    if len(sps) < 2:
        speed = "one epoch only, so there is no later epoch to compare it with."
    elif sps[0] < FIRST_EPOCH_SLOWER * min(sps[1:]):
        speed = f"the first epoch was the slowest. {warm_up}"
    else:
        speed = f"the first epoch was within {100 * (1 - FIRST_EPOCH_SLOWER):.0f}% of the later ones here. {warm_up}"
    text = (
        f"**Throughput** (samples/s) is the number DDP is meant to raise. Here it went "
        f"{' -> '.join(f'{x:.0f}' for x in sps)} samples/s over the epochs: {speed}\n\n"
        f"**Accuracy**: {100 * acc:.1f}% after {len(sps)} epoch(s) of a "
        f"{m['model']['num_parameters'] / 1e6:.1f}M-parameter model"
    )
    if m["model"]["pretrained"]:
        return text + " fine-tuned from pretrained weights (the check above holds it to at least 90%)."
    return text + (" trained from random weights: even a tiny model learns real news categories (chance is 25%).")


def headline_table(headlines: dict, probs, label_names) -> tuple[str, int]:
    """One line per headline: the predicted class, its probability and the class it belongs to; and how many right."""
    lines, right = [], 0
    for (text, truth), p in zip(headlines.items(), probs):
        label = label_names[int(p.argmax())]
        right += label == truth
        lines.append(f"{label:>9} {100 * float(p.max()):5.1f}%  (expected {truth:<8})  {text}")
    return "\n".join(lines), right


def checkpoint_claims(probs, right: int) -> list[Claim]:
    """The saved model gets at least 3 of the 4 new headlines right (one miss allowed: four texts are few). That the
    file is this run's is claims.written_by_launch's (the file's date and recorded settings against the notebook's).
    (No claim on the shape of `probs`: one column per class of the checkpoint's own head holds by construction.)"""
    n = len(probs)
    return [
        Claim(
            f"the trained model gets at least {n - 1} of these {n} new headlines right ({right}/{n})", right >= n - 1
        ),
    ]


def reload_claims(fingerprint: str, reloaded_acc: float, m: dict) -> list[Claim]:
    """The reloaded checkpoint, on the very texts the run evaluated on, gives the accuracy the run reported, within
    half a point: the run evaluated in batches of its own size, and padding a text with others of other lengths can
    move a logit in its last bits, flipping a near-tie (one text in 2,000 is 0.05 points). Texts rebuilt with another
    fingerprint are not a claim that fails but a comparison that means nothing: ValueError."""
    acc = m["aggregates"]["final_val_accuracy"]
    if fingerprint != m["data"]["fingerprint"]:
        raise ValueError(f"the texts rebuilt here ({fingerprint}) are not the run's ({m['data']['fingerprint']})")
    return [
        Claim(
            f"the reloaded checkpoint reproduces the run's accuracy on its own texts (fingerprint {fingerprint}): "
            f"{100 * reloaded_acc:.2f}% against {100 * acc:.2f}%, within {100 * RELOAD_POINTS:.1f} points",
            abs(reloaded_acc - acc) <= RELOAD_POINTS,
        ),
    ]


def confusion(pred, labels, n_classes: int) -> list[list[int]]:
    """counts[true][predicted] over the held-out texts."""
    counts = [[0] * n_classes for _ in range(n_classes)]
    for t, p in zip(labels, pred):
        counts[int(t)][int(p)] += 1
    return counts


def confusion_claims(counts) -> list[Claim]:
    """The matrix is the accuracy taken apart by class: every class is recognised in more than half of its texts
    (chance is a quarter: a class the model had not learned would sit near it). That its diagonal over its total is
    the accuracy is not claimed: both come from the same predictions, so such a check could not fail."""
    per_class = [row[i] / max(1, sum(row)) for i, row in enumerate(counts)]
    return [
        Claim(
            f"every class is recognised in more than half of its texts, twice chance (the weakest: "
            f"{100 * min(per_class):.0f}%)",
            min(per_class) > 0.5,
        ),
    ]
