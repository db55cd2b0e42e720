"""Tail averaging: the weights a run hands back are the mean of the hub's weights after each of
its last updates (Polyak and Juditsky's averaging, over the tail of the run only).

Asynchronous pushes land on weights that moved since they were read, so where the last few
happen to leave the weights scatters from run to run: two async workers on a Fashion-MNIST MLP
with `SGD(0.1, momentum=0.9)` ended 0.75-0.83, where the mean of their last 10% of updates
ended 0.814-0.816 on every seed (docs/performance.md, "Parity with model.fit"). The hub keeps
the running sum in one float32 buffer the size of its shard, one in-place add per update, and
only over the tail.
"""

from __future__ import annotations

import numpy as np

TAIL_DEFAULT = 0.1  # the share of the run's samples whose updates are averaged


def tail_start(fraction: float, epochs: int, num_samples: int | None) -> int | None:
    """The number of samples after which updates are averaged, or None (no averaging: a
    fraction of 0, or a run whose length is not known, e.g. a stream without an epoch size).

    Example:
        >>> tail_start(0.1, 2, 12000), tail_start(0.0, 2, 12000), tail_start(0.1, 2, None)
        (21600, None, None)
    """
    if not fraction or not num_samples:
        return None
    return round((1.0 - fraction) * epochs * num_samples)


class TailAverage:
    """The running sum of a shard's weights after each update past `start` samples.

    Example:
        >>> tail = TailAverage(start=100)
        >>> w = np.zeros(2, np.float32)
        >>> for step, batch in enumerate([64, 64, 64], 1):   # 64 and 128 samples: 128 > 100
        ...     w[:] = step
        ...     tail.add(w, batch)
        >>> tail.count, tail.result(w).tolist()              # the mean of steps 2 and 3
        (2, [2.5, 2.5])
    """

    def __init__(self, start: int):
        self.start = start
        self.samples = 0  # samples behind the updates so far
        self.count = 0  # updates averaged
        self._sum: np.ndarray | None = None

    def add(self, weights: np.ndarray, samples: int) -> None:
        """One update, of `samples` samples, left the shard at `weights`."""
        self.samples += samples
        if self.samples <= self.start:
            return
        if self._sum is None:
            self._sum = np.array(weights, dtype=np.float32, copy=True)
        else:
            np.add(self._sum, weights, out=self._sum)
        self.count += 1

    def state(self) -> dict:
        """What a checkpoint keeps (numbers, and the sum once the tail started), so that a
        resumed run, or a shard taken over, averages the same updates as an unbroken run."""
        state = {"samples": self.samples, "count": self.count}
        if self._sum is not None:
            state["sum"] = self._sum.copy()
        return state

    def restore(self, state: dict) -> None:
        """Take back what `state()` gave (a checkpoint from before averaging: nothing)."""
        total = state.get("sum")
        self.samples = int(state.get("samples", 0))
        self._sum = None if total is None else np.array(total, dtype=np.float32, copy=True)
        self.count = int(state.get("count", 0)) if total is not None else 0

    def result(self, weights: np.ndarray) -> np.ndarray:
        """A new array: the mean of the averaged updates, or a copy of `weights` (the shard's
        now) before the tail starts."""
        if not self.count:
            return np.array(weights, dtype=np.float32, copy=True)
        return np.multiply(self._sum, np.float32(1.0 / self.count), dtype=np.float32)
