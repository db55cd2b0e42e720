"""Bounded per-worker time series for long runs, kept by the hub next to `stats.RunStats`.

Responsible for:
- `Timeline`: one row of fixed numeric columns per append and worker, in a preallocated
  float64 buffer of `capacity` rows that is down-sampled when full, so a run of any length
  costs the same memory and stays represented from its first step at uniform resolution.
- `DelayWindow`: the staleness τ of each worker's recent pushes (mean, p95, max) and a
  bounded histogram of every delay seen.

Pure: standard library and NumPy. Missing values are NaN inside, `None` in what is returned
as dicts (JSON has no NaN).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from nbdist.errors import ConfigError

__all__ = ["DEFAULT_COLUMNS", "DelayWindow", "Timeline"]

DEFAULT_COLUMNS = ("time", "samples_per_s", "compute_s", "comm_s", "wait_s", "batch_size",
                   "delay_mean", "delay_p95", "delay_max", "loss", "slowdown", "group")
LAST_COLUMNS = ("time", "group")  # a merged row keeps the later value: a time stamp, a label


def _json(v: float) -> float | None:
    return None if math.isnan(v) else float(v)


@dataclass
class _Series:
    data: np.ndarray  # (capacity, columns) float64; rows [0, n) closed
    weight: np.ndarray  # (capacity,) appends merged into each closed row
    last: list[float]  # the latest appended row, exactly
    n: int = 0
    stride: int = 1  # appends per closed row
    open: list[float] | None = None  # the open row (Python floats until it closes: cheap per push)
    open_weight: int = 0  # appends merged into it


class Timeline:
    """Per-worker rows of numeric `columns`, at most `capacity` rows per worker.

    Down-sampling, exactly: while fewer than `capacity` rows are closed, appends are merged
    into an open row until it holds `stride` appends, then it closes. When an append finds
    all `capacity` rows closed, adjacent pairs (0,1), (2,3), ... are merged into
    `capacity/2` rows and `stride` doubles. So every closed row stands for exactly `stride`
    consecutive appends and the whole run is kept, coarser as it grows. Merging takes, per
    column, the mean weighted by appends (a missing side, NaN, is ignored), except the later
    value for "time" and "group", the max for `*_max` and the min for `*_min` columns.
    `latest()` is always the last appended row itself.

    Example:
        >>> t = Timeline(("time", "loss", "delay_max"), capacity=4)
        >>> for i in range(1, 7):
        ...     t.append(0, {"time": i, "loss": i, "delay_max": 7 - i})
        >>> t.rows(0).tolist()
        [[2.0, 1.5, 6.0], [4.0, 3.5, 4.0], [6.0, 5.5, 2.0]]
        >>> t.latest(0)
        {'time': 6.0, 'loss': 6.0, 'delay_max': 1.0}
    """

    def __init__(self, columns: Sequence[str] = DEFAULT_COLUMNS, capacity: int = 1024) -> None:
        columns = tuple(columns)
        if "time" not in columns or len(set(columns)) != len(columns):
            raise ConfigError(f"Timeline columns must be unique and include 'time' (rows are "
                              f"merged and filtered by it). Received: {columns}.")
        if capacity < 2 or capacity % 2:
            raise ConfigError(f"Timeline capacity must be an even number >= 2 (rows are merged in "
                              f"pairs). Received: capacity={capacity}.")
        self.columns, self.capacity = columns, capacity
        self._index = {c: i for i, c in enumerate(columns)}
        self._time = self._index["time"]
        self._kinds = ["last" if c in LAST_COLUMNS else "max" if c.endswith("_max")
                       else "min" if c.endswith("_min") else "mean" for c in columns]
        self._means = [i for i, k in enumerate(self._kinds) if k == "mean"]
        self._lasts = [i for i, k in enumerate(self._kinds) if k == "last"]
        self._extremes = [(i, max if k == "max" else min) for i, k in enumerate(self._kinds)
                          if k in ("max", "min")]
        kinds = np.array(self._kinds)
        self._is_last, self._is_max, self._is_min = kinds == "last", kinds == "max", kinds == "min"
        self._series: dict[int, _Series] = {}

    @property
    def workers(self) -> list[int]:
        return sorted(self._series)

    @property
    def nbytes(self) -> int:
        """Memory held by the buffers: fixed per worker from its first append on."""
        return sum(s.data.nbytes + s.weight.nbytes + 8 * len(s.last) for s in self._series.values())

    def stride(self, worker: int) -> int:
        """How many appends each closed row of `worker` stands for (doubles at each merge)."""
        s = self._series.get(worker)
        return s.stride if s else 1

    def _as_row(self, row: Mapping[str, float | None] | Sequence[float | None]) -> list[float]:
        if isinstance(row, Mapping):
            x, index = [math.nan] * len(self.columns), self._index
            try:
                for k, v in row.items():
                    x[index[k]] = math.nan if v is None else float(v)
            except KeyError:
                unknown = sorted(row.keys() - index.keys())
                raise ConfigError(f"Unknown timeline column(s) {unknown}. Expected some of "
                                  f"{list(self.columns)}; add them when creating the "
                                  "Timeline.") from None
            return x
        if len(row) != len(self.columns):
            raise ConfigError(f"A timeline row needs {len(self.columns)} values "
                              f"{list(self.columns)}. Received {len(row)}.")
        return [math.nan if v is None else float(v) for v in row]

    def _merge(self, a: np.ndarray, wa: np.ndarray, b: np.ndarray, wb: np.ndarray) -> np.ndarray:
        """Merge rows `a` (weights `wa`, shape (k, 1)) with the later rows `b`: pair merges."""
        ok_a, ok_b = ~np.isnan(a), ~np.isnan(b)
        with np.errstate(invalid="ignore"):
            mean = (a * wa + b * wb) / (wa + wb)
        out = np.where(ok_a & ok_b, mean, np.where(ok_a, a, b))  # a missing side is ignored
        out = np.where(self._is_max, np.fmax(a, b), out)
        out = np.where(self._is_min, np.fmin(a, b), out)
        return np.where(self._is_last, np.where(ok_b, b, a), out)

    def _fold(self, a: list[float], wa: int, b: list[float]) -> None:
        """`_merge` into one row `a` of weight `wa` (in place) of one new row `b` (weight 1),
        on Python floats: 12 scalars are several times faster than a dozen NumPy calls, per push."""
        w1 = wa + 1
        for i in self._means:
            v = b[i]
            if v == v:  # else NaN: b is missing
                u = a[i]
                a[i] = v if u != u else (u * wa + v) / w1
        for i in self._lasts:
            v = b[i]
            if v == v:
                a[i] = v
        for i, pick in self._extremes:
            v, u = b[i], a[i]
            if v == v:
                a[i] = v if u != u else pick(u, v)

    def append(self, worker: int, row: Mapping[str, float | None] | Sequence[float | None]) -> None:
        """Add one row for `worker`: a dict (missing columns are NaN) or all values in order."""
        self.append_floats(worker, self._as_row(row))

    def append_floats(self, worker: int, x: list[float]) -> None:
        """`append` of a fresh list of every column's value in order, as floats (NaN: missing),
        which the timeline keeps (the hub's per-push path: no conversion)."""
        s = self._series.get(worker)
        if s is None:
            s = self._series[worker] = _Series(
                data=np.full((self.capacity, len(self.columns)), np.nan),
                weight=np.zeros(self.capacity, dtype=np.int64), last=x)
        s.last = x
        if s.n == self.capacity:  # all closed: merge pairs, halving the rows
            half = self.capacity // 2
            pairs, w = s.data.reshape(half, 2, -1), s.weight.reshape(half, 2)
            merged = self._merge(pairs[:, 0], w[:, :1], pairs[:, 1], w[:, 1:])
            s.data[:half], s.data[half:] = merged, np.nan
            s.weight[:half], s.weight[half:] = w.sum(axis=1), 0
            s.n, s.stride = half, s.stride * 2
        if s.open_weight == 0:
            s.open = x.copy()
        else:
            self._fold(s.open, s.open_weight, x)
        s.open_weight += 1
        if s.open_weight == s.stride:
            s.data[s.n], s.weight[s.n] = s.open, s.stride
            s.n, s.open, s.open_weight = s.n + 1, None, 0

    def rows(self, worker: int, since_time: float | None = None,
             include_open: bool = False) -> np.ndarray:
        """A copy of `worker`'s rows, shape (k, columns), oldest first; only rows with
        time > `since_time` if given. Closed rows do not change until the next pair merge
        (`stride` doubles); the open row (at most `stride - 1` appends) only if asked for."""
        s = self._series.get(worker)
        if s is None:
            return np.empty((0, len(self.columns)))
        out = s.data[:s.n]
        if include_open and s.open_weight:
            out = np.vstack([out, np.array(s.open, dtype=np.float64)[None]])
        if since_time is not None:
            out = out[out[:, self._time] > since_time]
        return out.copy()

    def latest(self, worker: int) -> dict[str, float | None]:
        """The last row appended for `worker`, unmerged ({} if it never appended)."""
        s = self._series.get(worker)
        return {} if s is None else dict(zip(self.columns, map(_json, s.last), strict=True))

    def to_records(self, include_open: bool = False) -> list[dict[str, float | int | None]]:
        """Every worker's rows as JSON-able dicts with a "worker" key, by worker then time."""
        return [{"worker": w, **dict(zip(self.columns, map(_json, r), strict=True))}
                for w in self.workers for r in self.rows(w, include_open=include_open)]


def _p95_sorted(x: list[int]) -> float:
    """`numpy.percentile(x, 95, method="linear")` of sorted `x`, on Python floats with NumPy's
    own interpolation (the same number; a percentile call costs ~0.2 ms on a hub's hot path).

    Example:
        >>> _p95_sorted([0, 1, 1, 2, 10]) == float(np.percentile([0, 1, 1, 2, 10], 95))
        True
    """
    h = (len(x) - 1) * 0.95
    lo = math.floor(h)
    t = h - lo
    a, b = float(x[lo]), float(x[min(lo + 1, len(x) - 1)])
    diff = b - a
    return b - diff * (1 - t) if t >= 0.5 else a + diff * t


class DelayWindow:
    """Per worker: the delays τ of the last `window` pushes, and counts of all delays seen.

    `stats()` gives the window's mean, max and p95; p95 is `numpy.percentile(..., 95,
    method="linear")`: sorted x_0..x_{n-1}, h = 0.95 (n - 1), x_⌊h⌋ + (h − ⌊h⌋)(x_⌊h⌋+1 − x_⌊h⌋).
    The histogram has one bin per delay 0..cap-1 and a last bin, keyed `cap`, for delays >= cap.

    Example:
        >>> d = DelayWindow(window=256, cap=8)
        >>> for tau in [0, 1, 1, 2, 10]:
        ...     d.add(0, tau)
        >>> {k: round(v, 9) for k, v in d.stats(0).items()}
        {'delay_mean': 2.8, 'delay_p95': 8.4, 'delay_max': 10.0}
        >>> d.histogram(0)
        {0: 1, 1: 2, 2: 1, 8: 1}
    """

    def __init__(self, window: int = 256, cap: int = 64) -> None:
        if window < 1 or cap < 1:
            raise ConfigError(f"DelayWindow needs window >= 1 and cap >= 1. Received: "
                              f"window={window}, cap={cap}.")
        self.window, self.cap = window, cap
        self._recent: dict[int, np.ndarray] = {}
        self._count: dict[int, int] = {}
        self._hist: dict[int, np.ndarray] = {}

    def add(self, worker: int, delay: int) -> None:
        """Record the delay of one push by `worker`."""
        if delay < 0:
            raise ConfigError(f"A push delay is a version difference, >= 0. Received: {delay} "
                              f"from worker {worker}.")
        if worker not in self._recent:
            self._recent[worker] = np.zeros(self.window, dtype=np.int64)
            self._hist[worker] = np.zeros(self.cap + 1, dtype=np.int64)
            self._count[worker] = 0
        self._recent[worker][self._count[worker] % self.window] = delay
        self._count[worker] += 1
        self._hist[worker][min(int(delay), self.cap)] += 1

    def recent(self, worker: int) -> np.ndarray:
        """The delays in the window, oldest first."""
        if worker not in self._recent:
            return np.empty(0, dtype=np.int64)
        n, buf = self._count[worker], self._recent[worker]
        return buf[:n].copy() if n <= self.window else np.roll(buf, -(n % self.window))

    def stats(self, worker: int) -> dict[str, float]:
        """Mean, p95 and max of the window, named as the Timeline columns (NaN if no pushes)."""
        n = min(self._count.get(worker, 0), self.window)
        if not n:
            return {"delay_mean": math.nan, "delay_p95": math.nan, "delay_max": math.nan}
        x = np.sort(self._recent[worker][:n])  # the order in the window does not matter here
        return {"delay_mean": float(np.mean(x)), "delay_p95": _p95_sorted(x.tolist()),
                "delay_max": float(x[-1])}

    def histogram(self, worker: int) -> dict[int, int]:
        """Counts of every delay seen, non-zero bins only; the key `cap` counts delays >= cap."""
        h = self._hist.get(worker)
        return {} if h is None else {int(d): int(h[d]) for d in np.flatnonzero(h)}
