"""DBS-SGD: performance-aware dynamic batch sizes, so heterogeneous workers finish steps together.

Responsible for:
- `allocate`: split a global batch B over workers in proportion to their speeds, within
  bounds, summing to B exactly (water-filling for the bounds, largest-remainder rounding).
- `BatchSizer`: the hub's stateful allocator (speed moving averages, periodic re-balancing
  with hysteresis, the `fixed` policy, workers leaving).

Pure standard library: the split is computed on `fractions.Fraction`, so it is exact
(70 · 1/7 is 10, not 9.999...) and does not depend on float rounding.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from fractions import Fraction

from nbdist.errors import ConfigError

__all__ = ["POLICIES", "BatchSizer", "allocate"]

POLICIES = ("dbs", "fixed")


def _known_speeds(speeds: Sequence[float | None]) -> list[Fraction]:
    """Speeds as exact fractions; 0, None and NaN (not measured yet) become the mean of the
    measured ones, so a new worker starts with an average share; all unknown: equal split."""
    out: list[Fraction | None] = []
    for i, v in enumerate(speeds):
        f = math.nan if v is None else float(v)
        if f == 0 or math.isnan(f):
            out.append(None)
        elif f < 0 or math.isinf(f):
            raise ConfigError(f"Worker speeds must be finite samples/s >= 0. Received: speeds[{i}]"
                              f"={v!r}. Pass 0 or None for a worker not measured yet.")
        else:
            out.append(Fraction(f))
    known = [v for v in out if v is not None]
    fill = sum(known, Fraction(0)) / len(known) if known else Fraction(1)
    return [fill if v is None else v for v in out]


def _water_fill(v: list[Fraction], total: int, lo: int, hi: int | None) -> list[Fraction]:
    """Exact shares x_i = clip(λ v_i, lo, hi) with Σ x_i = total.

    Each round splits what is left over the free workers in proportion to speed; if clipping
    would add mass (lows outweigh highs) the lows are pinned at `lo`, otherwise the highs at
    `hi` — the pinned ones are clipped in the exact solution too, so this ends in ≤ M rounds.
    """
    x: list[Fraction] = [Fraction(0)] * len(v)
    free, left = list(range(len(v))), Fraction(total)
    while free:
        sv = sum((v[i] for i in free), Fraction(0))
        share = {i: left * v[i] / sv for i in free}
        low = [i for i in free if share[i] < lo]
        high = [i for i in free if hi is not None and share[i] > hi]
        if not low and not high:
            for i in free:
                x[i] = share[i]
            break
        cap = Fraction(hi if hi is not None else 0)
        gain = sum((lo - share[i] for i in low), Fraction(0)) - sum(
            (share[i] - cap for i in high), Fraction(0))
        pinned = low if gain > 0 else high if gain < 0 else low + high
        for i in pinned:
            x[i] = Fraction(lo) if i in low else cap
            left -= x[i]
        free = [i for i in free if i not in pinned]
    return x


def allocate(speeds: Sequence[float | None], total: int, b_min: int = 1,
             b_max: int | None = None) -> list[int]:
    """Batch sizes proportional to `speeds`, each in [b_min, b_max], summing to `total`.

    Shares beyond a bound are clipped and the excess/deficit is re-split over the other
    workers by speed; the exact shares are then rounded by largest remainder (floors, then
    +1 to the largest fractional parts; ties go to the lower worker index). A faster worker
    never gets a smaller batch than a slower one.

    Example:
        >>> allocate([1, 2, 4], 64)
        [9, 18, 37]
        >>> allocate([1, 1, 10], 30, b_min=5)
        [5, 5, 20]
    """
    m = len(speeds)
    if m == 0:
        raise ConfigError("allocate() needs at least one worker. Received: speeds=[].")
    if b_min < 1 or (b_max is not None and b_max < b_min):
        raise ConfigError(f"Batch bounds must satisfy 1 <= b_min <= b_max. Received: "
                          f"b_min={b_min}, b_max={b_max}. Use b_min >= 1 (a worker needs one "
                          "sample per step).")
    if total < m * b_min or (b_max is not None and total > m * b_max):
        raise ConfigError(
            f"Cannot split a global batch of {total} over {m} workers within [{b_min}, {b_max}]. "
            f"Expected {m} * b_min <= total <= {m} * b_max. Lower b_min, raise b_max, or change "
            "the base batch size.")
    shares = _water_fill(_known_speeds(speeds), total, b_min, b_max)
    sizes = [math.floor(s) for s in shares]
    short = total - sum(sizes)  # an integer below the number of non-zero remainders
    by_remainder = sorted(range(m), key=lambda i: (-(shares[i] - sizes[i]), i))
    for i in by_remainder[:short]:
        sizes[i] += 1
    return sizes


STEP_HISTORY = 32  # recent (batch, step time) pairs per worker used to fit its time model


def fit_step_time(points: Sequence[tuple[int, float]]) -> tuple[float, float] | None:
    """Fit a worker's step time as `T(b) = c + s·b` (fixed overhead c, seconds per sample s).

    Least squares once the recent batches differ enough to tell c from s; None when they do
    not (one batch size seen) or the fit is not physical (negative c or s): then the caller
    uses the moving-average samples/s, i.e. c = 0.

    Example:
        >>> fit_step_time([(10, 0.002), (30, 0.004)])
        (0.001, 0.0001)
        >>> fit_step_time([(10, 0.002), (10, 0.003)]) is None
        True
    """
    if len(points) < 2:
        return None
    b = [float(p[0]) for p in points]
    t = [float(p[1]) for p in points]
    mb, mt = sum(b) / len(b), sum(t) / len(t)
    spread = sum((x - mb) ** 2 for x in b)
    if spread <= (0.1 * mb) ** 2 * len(b):
        return None
    slope = sum((x - mb) * (y - mt) for x, y in zip(b, t, strict=True)) / spread
    intercept = mt - slope * mb
    slope, intercept = round(slope, 12), round(intercept, 12)  # a flat fit's 1e-17 noise is 0
    if slope <= 0 or intercept < 0:
        return None
    return intercept, slope


def equal_time_weights(fits: Sequence[tuple[float, float]], total: int) -> list[float]:
    """Batch weights that give every worker the same predicted step time T*.

    With `T_i(b) = c_i + s_i b` and `Σ b_i = total`: `T* = (total + Σ c_i/s_i) / Σ 1/s_i`
    and `b_i = (T* − c_i) / s_i`. With every c_i = 0 this is `b_i ∝ 1/s_i`, the proportional
    rule of DBS-SGD; the overhead term is nbdist's addition, because on small models the fixed
    cost per step dominates and samples/s then falls with the batch itself, which would let a
    slow worker's batch shrink step after step to the minimum. A worker too slow to finish
    even an empty batch by T* gets a tiny weight (then `allocate` gives it b_min).

    Example:
        >>> [round(w, 1) for w in equal_time_weights([(0.001, 1 / 30000)] * 2
        ...                                          + [(0.003, 1 / 10000)], 192)]
        [90.9, 90.9, 10.3]
    """
    t_star = (total + sum(c / s for c, s in fits)) / sum(1 / s for _, s in fits)
    return [max((t_star - c) / s, 1e-6) for c, s in fits]


class BatchSizer:
    """The hub's per-worker batch sizes under DBS-SGD (or fixed), kept summing to the global batch.

    `observe` after each step feeds a moving average of compute-only samples/s (shown to the
    user) and a short history of (batch, step time) from which each worker's time model
    `T = c + s·b` is fitted (`fit_step_time`); `maybe_rebalance` after each push re-splits
    B = active workers · base_batch so predicted step times are equal (`equal_time_weights`),
    every `rebalance_every` pushes
    (counted over all workers). Hysteresis is all-or-nothing so Σ b_i stays B: the new split
    is adopted whole if any worker's batch moves by more than `hysteresis` of its current
    size, otherwise the old split is kept whole (adopting only the big movers would break
    the sum).

    Example:
        >>> s = BatchSizer(num_workers=3, base_batch=10, rebalance_every=1)
        >>> for w, rate in enumerate([100.0, 200.0, 400.0]):
        ...     s.observe(w, samples=10, compute_s=10 / rate)
        >>> s.maybe_rebalance(), s.batches
        (True, [4, 9, 17])
        >>> s.drop(2); s.batches
        [7, 13, 0]
    """

    def __init__(self, num_workers: int, base_batch: int, b_min: int = 1, b_max: int | None = None,
                 ema: float = 0.2, rebalance_every: int = 10, hysteresis: float = 0.10,
                 policy: str = "dbs", warmup: int = 0) -> None:
        if num_workers < 1 or base_batch < 1:
            raise ConfigError(f"BatchSizer needs num_workers >= 1 and base_batch >= 1. Received: "
                              f"num_workers={num_workers}, base_batch={base_batch}.")
        if base_batch < b_min or (b_max is not None and base_batch > b_max):
            raise ConfigError(f"base_batch must lie in [b_min, b_max] so any set of workers can "
                              f"share the global batch. Received: base_batch={base_batch}, "
                              f"b_min={b_min}, b_max={b_max}. Widen the bounds.")
        allocate([1.0], base_batch, b_min, b_max)  # validates b_min and b_max
        if not 0 < ema <= 1 or rebalance_every < 0 or hysteresis < 0:
            raise ConfigError(f"Expected 0 < ema <= 1, rebalance_every >= 0 (0: only explicit "
                              f"rebalance()), hysteresis >= 0. Received: ema={ema}, "
                              f"rebalance_every={rebalance_every}, hysteresis={hysteresis}.")
        self.num_workers, self.base_batch = num_workers, base_batch
        self.b_min, self.b_max = b_min, b_max
        self.ema, self.rebalance_every, self.hysteresis = ema, rebalance_every, hysteresis
        self._speeds = [0.0] * num_workers
        self._steps: list[deque[tuple[int, float]]] = [deque(maxlen=STEP_HISTORY)
                                                       for _ in range(num_workers)]
        self._seen = [0] * num_workers
        self.warmup = warmup  # first steps per worker not measured (cold caches, first calls)
        self._batches = [base_batch] * num_workers
        self._active = list(range(num_workers))
        self._pushes = 0
        self._policy = "fixed"
        self.set_policy(policy)

    @property
    def policy(self) -> str:
        return self._policy

    @property
    def speeds(self) -> list[float]:
        """Moving-average samples/s per worker id (0.0: not measured yet)."""
        return list(self._speeds)

    @property
    def batches(self) -> list[int]:
        """Current batch per worker id (0 for a dropped worker)."""
        return list(self._batches)

    @property
    def active(self) -> list[int]:
        return list(self._active)

    @property
    def total(self) -> int:
        """The global batch B shared by the active workers."""
        return len(self._active) * self.base_batch

    def _check(self, worker: int) -> None:
        if not 0 <= worker < self.num_workers:
            raise ConfigError(f"Unknown worker {worker}. Expected 0 <= worker < "
                              f"{self.num_workers}.")

    def observe(self, worker: int, samples: int, compute_s: float) -> None:
        """Fold one step's compute-only rate into the worker's moving average (the first
        measurement seeds it). Steps without time or samples, and dropped workers, are ignored."""
        self._check(worker)
        if samples <= 0 or compute_s <= 0 or worker not in self._active:
            return
        self._seen[worker] += 1
        if self._seen[worker] <= self.warmup:
            return
        rate = samples / compute_s
        self._steps[worker].append((samples, compute_s))
        old = self._speeds[worker]
        self._speeds[worker] = rate if old == 0 else (1 - self.ema) * old + self.ema * rate

    def reshare(self, workers: list[int], base_batch: int) -> None:
        """Only `workers` go on, each with `base_batch` under the fixed policy (B = len(workers)
        · base_batch; DBS splits that by speed): a sync run restarted on the ranks left, which
        keeps its global batch by giving each rank more.

        Example:
            >>> s = BatchSizer(num_workers=3, base_batch=16, policy="fixed")
            >>> s.reshare([0, 2], 24); s.batches, s.total
            ([24, 0, 24], 48)
        """
        for w in workers:
            self._check(w)
        if not workers or base_batch < self.b_min or (self.b_max is not None
                                                      and base_batch > self.b_max):
            raise ConfigError(f"A reshare needs workers and a batch in [b_min, b_max]. Received: "
                              f"workers={list(workers)}, base_batch={base_batch}, "
                              f"b_min={self.b_min}, b_max={self.b_max}.")
        self.base_batch = base_batch
        self._active = sorted(set(workers))
        self._batches = self._split()

    def batch_for(self, worker: int) -> int:
        self._check(worker)
        if worker not in self._active:
            raise ConfigError(f"Worker {worker} was dropped; it has no batch. Active: "
                              f"{self._active}.")
        return self._batches[worker]

    def _split(self) -> list[int]:
        """A full new allocation over worker ids (0 for dropped) under the current policy."""
        out = [0] * self.num_workers
        if not self._active:
            return out
        if self._policy == "fixed":
            sizes = [self.base_batch] * len(self._active)
        else:
            measured = [w for w in self._active if self._steps[w]]
            weights: list[float | None] = [None] * len(self._active)  # None: not measured yet
            if measured:
                fits = [fit_step_time(self._steps[w]) or (0.0, 1.0 / self._speeds[w])
                        for w in measured]
                fitted = equal_time_weights(fits, self.total)
                for w, weight in zip(measured, fitted, strict=True):
                    weights[self._active.index(w)] = weight
            sizes = allocate(weights, self.total, self.b_min, self.b_max)
        for w, b in zip(self._active, sizes, strict=True):
            out[w] = b
        return out

    def rebalance(self) -> bool:
        """Re-split now, subject to hysteresis; True if the batches changed."""
        if self._policy == "fixed" or not all(self._steps[w] for w in self._active):
            return False  # every worker measured first: a partial view gives extreme splits
        new = self._split()
        if any(abs(new[w] - self._batches[w]) > self.hysteresis * self._batches[w]
               for w in self._active):
            self._batches = new
            return True
        return False

    def maybe_rebalance(self) -> bool:
        """Call after every push; re-balances on every `rebalance_every`-th. True if changed."""
        self._pushes += 1
        if self.rebalance_every and self._pushes % self.rebalance_every == 0:
            return self.rebalance()
        return False

    def set_policy(self, policy: str) -> None:
        """Switch policy; applied at once, without hysteresis (the user asked for it)."""
        if policy not in POLICIES:
            raise ConfigError(f"Unknown batch policy {policy!r}. Expected one of {list(POLICIES)}.")
        self._policy = policy
        self._batches = self._split()

    def add(self, worker: int) -> None:
        """A worker joins mid-run with the next id: it starts at `base_batch`, and the global
        batch grows by as much (B = active · base_batch), so Σ b_i stays B while the others
        keep their batches; the next rebalance waits until the newcomer is measured.

        Example:
            >>> s = BatchSizer(num_workers=2, base_batch=10, rebalance_every=1)
            >>> s.add(2); s.batches, s.total
            ([10, 10, 10], 30)
        """
        if worker != self.num_workers:
            raise ConfigError(f"A worker added mid-run takes the next id. Received: {worker}; "
                              f"expected {self.num_workers}.")
        self.num_workers += 1
        self._speeds.append(0.0)
        self._steps.append(deque(maxlen=STEP_HISTORY))
        self._seen.append(0)
        self._batches.append(self.base_batch)
        self._active.append(worker)

    def drop(self, worker: int) -> None:
        """A worker left: its share goes to the rest (B' = remaining · base_batch), at once.
        Dropping a worker twice is a no-op (a loss may be reported more than once)."""
        self._check(worker)
        if worker in self._active:
            self._active.remove(worker)
            self._batches = self._split()
