"""The verdict rule of reproduce.py: paired comparisons, an exact sign test, effect sizes. Pure.

A claim "A beats B on metric m" is tested per regime over every (setting, seed) pair where
both runs exist: the pair is a win when A's value is better, a loss when worse, a tie
otherwise (ties are dropped, as a sign test does). A diverged run, or a run that never reached
the target accuracy, counts as the worst value. With n wins+losses:

    HOLDS          P(X >= wins) < 0.05 for X ~ Binomial(n, 1/2)   (one-sided sign test)
    CONTRARY       P(X >= losses) < 0.05: B is reliably better than A
    NOT SHOWN      neither: the difference is within the spread of seeds and settings

The effect size is the mean paired difference (positive = in the claim's direction) over the
pairs where both values are finite, with its standard deviation and 10-90% range, and the
same relative to B's value.
"""

from __future__ import annotations

import math
from collections import defaultdict

ALPHA = 0.05


def sign_test(wins: int, losses: int) -> tuple[float, float]:
    """One-sided exact p-values (for the claim, against it) of a sign test.

    Example:
        >>> sign_test(5, 0)
        (0.03125, 1.0)
    """
    n = wins + losses

    def tail(k: int) -> float:
        return sum(math.comb(n, i) for i in range(k, n + 1)) / 2 ** n if n else 1.0
    return tail(wins), tail(losses)


def target_of(rows: list[dict], regime: str, epochs: int = 3) -> float:
    """The regime's target accuracy: what sequential SGD (1 worker) reached after its first
    epoch, the mean over seeds. Reachable by every reasonable rule within the study's epochs,
    so the time to reach it separates fast from slow rather than finished from unfinished."""
    seq = []
    for r in rows:
        if r["regime"] == regime and r["algo"] == "sgd" and r.get("curve"):
            first = r["end_time"] / epochs * (1 + 1e-9)
            seq.append([acc for t, acc, *_ in r["curve"] if t <= first][-1])
    return round(sum(seq) / len(seq), 3) if seq else math.nan


def time_to(row: dict, target: float) -> float:
    """First virtual time the run's validation accuracy reached `target` (NaN: never)."""
    return next((t for t, acc, *_ in row.get("curve", []) if acc >= target), math.nan)


def metric(row: dict, key: str, target: float) -> float:
    return time_to(row, target) if key == "t_target" else row.get(key, math.nan)


def _percentile(values: list[float], q: float) -> float:
    v = sorted(values)
    pos = (len(v) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def compare(rows: list[dict], regime: str, better: str, than: str, key: str, lower: bool,
            profiles: list[str], target: float) -> dict:
    """Paired (setting, seed) comparison of `better` against `than` in one regime."""
    runs = {(r["profile"], r["algo"], r["seed"]): r for r in rows if r["regime"] == regime}
    worst = math.inf if lower else -math.inf
    wins = losses = ties = 0
    diffs, rel, per_setting = [], [], defaultdict(lambda: [0, 0])
    for (profile, algo, seed), a in sorted(runs.items()):
        b = runs.get((profile, than, seed))
        if algo != better or profile not in profiles or b is None:
            continue
        va, vb = (worst if r["diverged"] or math.isnan(metric(r, key, target))
                  else metric(r, key, target)
                  for r in (a, b))
        if va == vb:
            ties += 1
            continue
        good = (va < vb) == lower
        wins, losses = wins + good, losses + (not good)
        per_setting[profile][0 if good else 1] += 1
        if math.isfinite(va) and math.isfinite(vb):
            d = (vb - va) if lower else (va - vb)
            diffs.append(d)
            if vb:
                rel.append(d / abs(vb))
    p_for, p_against = sign_test(wins, losses)
    word = ("NOT TESTED" if wins + losses + ties == 0 else "HOLDS" if p_for < ALPHA
            else "CONTRARY" if p_against < ALPHA else "NOT SHOWN")
    return {"verdict": word, "wins": wins, "losses": losses, "ties": ties, "p_for": p_for,
            "p_against": p_against, "diffs": diffs, "rel": rel, "per_setting": dict(per_setting)}


def summary(values: list[float], digits: int = 3, percent: bool = False) -> str:
    """'mean (sd s; 10-90% lo..hi; n)' of paired differences."""
    if not values:
        return "no pair where both runs finished"
    n = len(values)
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
    scale, unit = (100.0, "%") if percent else (1.0, "")
    lo, hi = _percentile(values, 0.1), _percentile(values, 0.9)
    return (f"{mean * scale:+.{digits}f}{unit} (sd {sd * scale:.{digits}f}{unit}; 10-90% "
            f"{lo * scale:+.{digits}f}..{hi * scale:+.{digits}f}{unit}; n={n})")


def mean_sd(values: list[float], digits: int = 3) -> str:
    v = [x for x in values if not math.isnan(x)]
    if not v:
        return "-"
    mean = sum(v) / len(v)
    sd = math.sqrt(sum((x - mean) ** 2 for x in v) / (len(v) - 1)) if len(v) > 1 else 0.0
    return f"{mean:.{digits}f} ±{sd:.{digits}f}"
