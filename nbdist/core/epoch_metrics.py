"""Per-epoch sums of the metric increments workers push (`nbdist.engine.step_metrics` makes
them; the kernel turns an epoch's sum into Keras's logs). Pure NumPy: the coordinator keeps
one, and counts, for synchronous ranks, which ranks have finished each epoch."""

from __future__ import annotations

from collections.abc import Collection

import numpy as np


class EpochSums:
    """Per-epoch sums of metric increments (pure NumPy; the coordinator keeps one).

    Example:
        >>> sums = EpochSums()
        >>> sums.add({"0": [1.0, 2.0]}); sums.add({"0": [0.5, 1.0], "1": [1.0, 1.0]})
        >>> sums.to_wire()
        {'0': [1.5, 3.0], '1': [1.0, 1.0]}
    """

    def __init__(self) -> None:
        self.sums: dict[int, np.ndarray] = {}
        self._ended: dict[int, set[int]] = {}  # sync: epoch -> ranks that finished it

    def add(self, per_epoch: dict) -> None:
        """Add a push's increments, `{epoch: [floats]}` (epochs as JSON keys, strings); every
        push of a run has the same number of floats (the model's metric variables)."""
        for epoch, values in per_epoch.items():
            values = np.asarray(values, dtype=np.float64)
            total = self.sums.get(int(epoch))
            if total is None:
                self.sums[int(epoch)] = values.copy()
            elif total.size == values.size:
                total += values
            else:
                raise ValueError(f"metric increments of {values.size} floats for epoch {epoch}, "
                                 f"which has {total.size}")

    def rank_ended(self, epoch: int, rank: int, ranks: Collection[int]) -> bool:
        """Note that `rank` finished `epoch`; True once every one of `ranks` (the run's ranks
        now: after a restart on the ranks left, a lost rank's report no longer counts, and is
        no longer awaited) has (the epoch's end).

        Example:
            >>> sums = EpochSums()
            >>> sums.rank_ended(0, 1, {0, 1, 2}), sums.rank_ended(0, 0, {0, 2})  # 1 was lost
            (False, False)
            >>> sums.rank_ended(0, 2, {0, 2})
            True
        """
        ended = self._ended.setdefault(int(epoch), set())
        ended.add(int(rank))
        if ended >= set(ranks):
            del self._ended[int(epoch)]
            return True
        return False

    def ended_by(self, ranks: Collection[int]) -> list[int]:
        """The epochs every one of `ranks` has ended, not yet counted as ended (a rank that had
        not said so was lost), now counted.

        Example:
            >>> sums = EpochSums(); sums.rank_ended(3, 0, {0, 1})
            False
            >>> sums.ended_by({0}), sums.ended_by({0})
            ([3], [])
        """
        done = sorted(e for e, ended in self._ended.items() if ended >= set(ranks))
        for epoch in done:
            del self._ended[epoch]
        return done

    def to_wire(self) -> dict[str, list[float]]:
        return {str(e): v.tolist() for e, v in sorted(self.sums.items())}
