"""An AG-News-shaped dataset generated offline, only when asked for (--data synthetic). Every log, metrics
file, checkpoint and plot says SYNTHETIC: it is never mistaken for news."""

from __future__ import annotations

import random

from .texts import TextSplits

SYNTHETIC_NOTE = "SYNTHETIC AG-News-shaped data generated offline (not real news; accuracy says nothing about AG News)"


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
_COMMON = (
    "the a new on in after over with for to as says report week year first said will after "
    "could amid more than two three monday tuesday wednesday thursday friday"
).split()


def synthetic_agnews(n_train: int = 10_000, n_test: int = 2_000, seed: int = 1234) -> TextSplits:
    """Headlines of per-class topic words, common words and, one word in five, another class's words."""
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
    return TextSplits(
        tr_x,
        tr_y,
        te_x,
        te_y,
        "synthetic",
        SYNTHETIC_NOTE,
        is_synthetic=True,
        full_sizes={"train": n_train, "test": n_test},
    )
