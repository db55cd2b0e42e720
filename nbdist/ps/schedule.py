"""Global epochs handed out in chunks: every sample once per epoch across all workers.

Pure bookkeeping, no I/O. The hub gives each worker the next `[start, stop)` slice of the
epoch's permutation when it asks for work; the worker trains on exactly that slice and
reports it done with its push. A fast worker simply asks more often, so it takes more
samples (allocation by performance). The permutation itself is never sent: workers derive it
from `(seed, epoch)` with `epoch_permutation`, as the hub would.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Chunk:
    """One batch worth of an epoch: positions `[start, stop)` of that epoch's permutation."""

    id: int
    epoch: int
    start: int
    stop: int

    @property
    def size(self) -> int:
        return self.stop - self.start

    def to_list(self) -> list[int]:
        return [self.id, self.epoch, self.start, self.stop]


def epoch_permutation(num_samples: int, seed: int, epoch: int) -> np.ndarray:
    """The sample order of `epoch`: the same on the hub and on every worker."""
    return np.random.default_rng([seed, epoch]).permutation(num_samples).astype(np.int64)


class EpochSchedule:
    """Hands out chunks and notices when an epoch has been fully trained on.

    Example:
        >>> s = EpochSchedule(num_samples=5, epochs=1)
        >>> a, b = s.next_chunk(3), s.next_chunk(3)
        >>> (a.start, a.stop, b.start, b.stop), s.next_chunk(3)
        ((0, 3, 3, 5), None)
        >>> s.complete(a.id), s.complete(b.id), s.finished
        (None, 0, True)
    """

    def __init__(self, num_samples: int, epochs: int):
        if num_samples < 1 or epochs < 1:
            raise ValueError(f"need num_samples >= 1 and epochs >= 1 (Received: {num_samples}, {epochs})")
        self.num_samples = num_samples
        self.epochs = epochs
        self._epoch = 0
        self._cursor = 0
        self._next_id = 0
        self._outstanding: dict[int, Chunk] = {}
        self._requeued: deque[Chunk] = deque()
        self._remaining = [num_samples] * epochs  # samples not yet trained on, per epoch
        self._done = 0  # samples trained on over all epochs (a running count: read every push)

    def next_chunk(self, size: int) -> Chunk | None:
        """The next slice of at most `size` samples, or None when every slice is handed out."""
        if size < 1:
            raise ValueError(f"chunk size must be >= 1 (Received: {size})")
        if self._requeued:
            chunk = self._requeued.popleft()
        elif self._epoch >= self.epochs:
            return None
        else:
            stop = min(self._cursor + size, self.num_samples)
            chunk = Chunk(self._next_id, self._epoch, self._cursor, stop)
            self._next_id += 1
            self._cursor = stop
            if stop == self.num_samples:
                self._epoch, self._cursor = self._epoch + 1, 0
        self._outstanding[chunk.id] = chunk
        return chunk

    def complete(self, chunk_id: int) -> int | None:
        """Mark a chunk trained on; returns the epoch this completes, if it completes one."""
        chunk = self._outstanding.pop(chunk_id, None)
        if chunk is None:
            raise KeyError(f"chunk {chunk_id} is not outstanding (completed twice, or never handed out)")
        self._remaining[chunk.epoch] -= chunk.size
        self._done += chunk.size
        return chunk.epoch if self._remaining[chunk.epoch] == 0 else None

    def requeue(self, chunk_id: int) -> None:
        """Give an unfinished chunk back (its worker stopped), so another worker trains on it."""
        chunk = self._outstanding.pop(chunk_id, None)
        if chunk is not None:
            self._requeued.append(chunk)

    @property
    def finished(self) -> bool:
        """True once every sample of every epoch has been trained on."""
        return not any(self._remaining) and not self._outstanding and not self._requeued

    @property
    def samples_left(self) -> int:
        """Samples not yet handed out, over all remaining epochs."""
        if self._epoch >= self.epochs:
            return sum(c.size for c in self._requeued)
        later = (self.epochs - self._epoch - 1) * self.num_samples
        return later + self.num_samples - self._cursor + sum(c.size for c in self._requeued)

    @property
    def samples_per_epoch(self) -> list[int]:
        """Samples trained on so far in each epoch (each reaches num_samples exactly once)."""
        return [self.num_samples - left for left in self._remaining]

    @property
    def epochs_done(self) -> float:
        """Progress in epochs, counting only completed samples (e.g. 1.5)."""
        return self._done / self.num_samples

    @property
    def current_epoch(self) -> int:
        """The epoch that chunks are being handed out from (== epochs when all are handed out)."""
        return self._epoch
