"""bench_train's arithmetic over rounds: contenders alternate round after round, and a ratio is the median of the
per-round ratios (the rounds in which no other process shared the CPU are quoted apart, as "clean")."""

from __future__ import annotations

from . import timing

CLEAN_CORES = 0.25  # a window is "clean" when other processes used at most this many cores during it


def rotate(items: list, r: int) -> list:
    k = r % len(items)
    return items[k:] + items[:k]


def _clean(res: dict) -> bool:
    f = res.get("foreign_cores")
    return f is not None and f <= CLEAN_CORES


def paired(a: list, b: list, key: str = "samples_per_s") -> dict:
    """a/b round by round. 'clean' keeps the rounds where neither window shared the CPU with other processes."""
    per_round = [x[key] / y[key] for x, y in zip(a, b) if x.get(key) and y.get(key)]
    clean = [x[key] / y[key] for x, y in zip(a, b) if x.get(key) and y.get(key) and _clean(x) and _clean(y)]
    med_a = timing.summary(x.get(key) for x in a)["median"]
    med_b = timing.summary(y.get(key) for y in b)["median"]
    return {
        "median_of_rounds": timing.summary(per_round)["median"],
        "ratio_of_medians": timing.ratio(med_a, med_b),
        "per_round": per_round,
        "metric": key,
        "clean_rounds": len(clean),
        "median_of_clean_rounds": timing.summary(clean)["median"] if clean else None,
    }


def paired_ratios(results: dict, base: str, others: list) -> dict:
    """ours / X for every other contender X: > 1 means ours is faster than X (what that option buys).
    samples/s is the figure; model FLOP/s counts each text's real length (fair when the windows saw different
    lengths); per CPU-second is the cross-check that neighbours' load cannot move (1-thread contenders)."""
    out = {}
    for o in others:
        out[f"{base} / {o}"] = {
            **paired(results[base], results[o]),
            "by_model_flops": paired(results[base], results[o], "model_tflops"),
            "per_cpu_second": paired(results[base], results[o], "samples_per_cpu_s"),
        }
    return out


def summarise(
    rs: list,
    keys=(
        "samples_per_s",
        "tokens_per_s",
        "samples_per_cpu_s",
        "model_tflops",
        "padding_fraction",
        "cpu_share",
        "foreign_cores",
    ),
) -> dict:
    out = {k: timing.summary(r.get(k) for r in rs) for k in keys}
    out["mfu"] = timing.summary(r.get("mfu") for r in rs) if any(r.get("mfu") for r in rs) else None
    return out


def line(name: str, res: dict) -> str:
    fc = res.get("foreign_cores")
    return (
        f"  {name:34s} "
        f"{timing.format_rate(res['samples_per_s'], res['tokens_per_s'], res.get('model_tflops'), res.get('mfu'))}"
        f" | pad {100 * (res.get('padding_fraction') or 0):.0f}% | others {'?' if fc is None else round(fc, 2)} cores"
    )


def headline_ratio(section: dict, key: str):
    rr = section["ratios"].get(key)
    if not rr:
        return None
    return (
        rr["median_of_rounds"]
        if section.get("headline_metric", "samples_per_s") == "samples_per_s"
        else rr["by_model_flops"]["median_of_rounds"]
    )


def fmt(x, digits: int = 2) -> str:
    return "?" if x is None else f"{x:.{digits}f}"
