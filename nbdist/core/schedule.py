"""Global epochs handed out in chunks: every sample once per epoch across all workers.

Pure bookkeeping, no I/O. The hub gives each worker the next `[start, stop)` slice of the
epoch's permutation when it asks for work; the worker trains on exactly that slice and
reports it done with its push. A fast worker simply asks more often, so it takes more
samples (allocation by performance). The permutation itself is never sent: workers derive it
from `(seed, epoch)` with `epoch_permutation`, as the hub would.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from nbdist.wire.messages import Chunk


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
            raise ValueError(f"need num_samples >= 1 and epochs >= 1 (Received: {num_samples}, "
                             f"{epochs})")
        self.num_samples = num_samples
        self.epochs = epochs
        self._epoch = 0
        self._cursor = 0
        self._next_id = 0
        self._outstanding: dict[int, Chunk] = {}
        self._requeued: deque[Chunk] = deque()
        self._remaining = [num_samples] * epochs  # samples not yet trained on, per epoch
        self._done = 0  # samples trained on over all epochs (a running count: read every push)

    def next_chunk(self, size: int, max_epoch: int | None = None) -> Chunk | None:
        """The next slice of at most `size` samples, or None when every slice is handed out (or,
        with `max_epoch`, every slice of the epochs up to it: an epoch gate)."""
        if size < 1:
            raise ValueError(f"chunk size must be >= 1 (Received: {size})")
        if self._requeued:
            chunk = self._requeued.popleft()
        elif self._epoch >= self.epochs or (max_epoch is not None and self._epoch > max_epoch):
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
            raise KeyError(f"chunk {chunk_id} is not outstanding (completed twice, or never "
                           "handed out)")
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

    def samples_left(self, max_epoch: int | None = None) -> int:
        """Samples not yet handed out, over the remaining epochs (up to `max_epoch`, if given)."""
        last = self.epochs - 1 if max_epoch is None else min(self.epochs - 1, max_epoch)
        requeued = sum(c.size for c in self._requeued)
        if self._epoch > last:
            return requeued
        return (last - self._epoch) * self.num_samples + self.num_samples - self._cursor + requeued

    @property
    def samples_per_epoch(self) -> list[int]:
        """Samples trained on so far in each epoch (each reaches num_samples exactly once)."""
        return [self.num_samples - left for left in self._remaining]

    @property
    def samples_per_begun_epoch(self) -> list[int]:
        """`samples_per_epoch` up to the last epoch begun: what the kernel polls, a few times a
        second, stays small in a run of 10^5 epochs ("train until I click Stop")."""
        begun = min(self.epochs, self._epoch + 1)  # handed out from (requeued: earlier ones)
        return [self.num_samples - left for left in self._remaining[:begun]]

    @property
    def epochs_done(self) -> float:
        """Progress in epochs, counting only completed samples (e.g. 1.5)."""
        return self._done / self.num_samples

    @property
    def first_unfinished_epoch(self) -> int:
        """The first epoch with samples not yet trained on (== epochs once all are)."""
        return next((e for e, left in enumerate(self._remaining) if left), self.epochs)

    @property
    def current_epoch(self) -> int:
        """The epoch that chunks are being handed out from (== epochs when all are handed out)."""
        return self._epoch

    # -- checkpoints ------------------------------------------------------------------------

    def state(self) -> dict:
        """The data position as plain JSON: chunks handed out but not completed (in flight or
        requeued) count as not done, so a resumed run trains on each of them once."""
        pending = sorted([c.epoch, c.start, c.stop]
                         for c in (*self._outstanding.values(), *self._requeued))
        return {"num_samples": self.num_samples, "epochs": self.epochs, "epoch": self._epoch,
                "cursor": self._cursor, "remaining": _trimmed(self._remaining, self.num_samples),
                "done": self._done, "pending": pending}

    @classmethod
    def from_state(cls, state: dict, epochs: int | None = None) -> EpochSchedule:
        """The schedule `state()` describes, optionally extended to more `epochs`.

        Raises ValueError if the state is not self-consistent (every epoch's remaining count
        must equal its pending chunks plus what is not handed out yet).

        Example:
            >>> s = EpochSchedule(num_samples=4, epochs=1)
            >>> a, b = s.next_chunk(2), s.next_chunk(2)
            >>> _ = s.complete(a.id)
            >>> r = EpochSchedule.from_state(s.state(), epochs=2)
            >>> r.next_chunk(9).to_list(), r.next_chunk(9).to_list(), r.epochs_done
            ([0, 0, 2, 4], [1, 1, 0, 4], 0.5)
        """
        try:
            n, saved_epochs = int(state["num_samples"]), int(state["epochs"])
            epoch, cursor, done = int(state["epoch"]), int(state["cursor"]), int(state["done"])
            remaining = remaining_per_epoch(state)
            pending = [tuple(int(v) for v in p) for p in state["pending"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed data position: {exc!r}") from None
        epochs = saved_epochs if epochs is None else epochs
        if epochs < saved_epochs:
            raise ValueError(f"the checkpoint's run has {saved_epochs} epochs; cannot shorten it "
                             f"to {epochs}")
        s = cls(n, epochs)
        unissued = [n if e > epoch else (n - cursor if e == epoch else 0)
                    for e in range(saved_epochs)]
        for e, start, stop in pending:
            if not (0 <= e < saved_epochs and 0 <= start < stop <= n):
                raise ValueError(f"pending chunk {[e, start, stop]} lies outside the data")
            unissued[e] += stop - start
        ok = (len(remaining) == saved_epochs and 0 <= epoch <= saved_epochs and 0 <= cursor < n
              and (cursor == 0 or epoch < saved_epochs) and unissued == remaining
              and done == saved_epochs * n - sum(remaining))
        if not ok:
            raise ValueError("inconsistent data position: the remaining samples per epoch do not "
                             "match the chunks handed out")
        s._epoch, s._cursor, s._done = epoch, cursor, done
        s._remaining = remaining + [n] * (epochs - saved_epochs)
        for e, start, stop in pending:
            s._requeued.append(Chunk(s._next_id, e, start, stop))
            s._next_id += 1
        return s


def schedule_state(num_samples: int, epochs: int, epoch: int, offset: int) -> dict:
    """(epoch, samples done in it) as an `EpochSchedule.state()` with nothing in flight.

    Example:
        >>> schedule_state(10, 3, 1, 4)["remaining"]
        [0, 6]
    """
    if offset >= num_samples:
        epoch, offset = epoch + 1, 0
    remaining = [0 if e < epoch else (num_samples - offset if e == epoch else num_samples)
                 for e in range(min(epoch + 1, epochs))]
    return {"num_samples": num_samples, "epochs": epochs, "epoch": epoch, "cursor": offset,
            "remaining": _trimmed(remaining, num_samples), "done": epoch * num_samples + offset,
            "pending": []}


def remaining_per_epoch(state: dict) -> list[int]:
    """Samples not yet trained on in each epoch of a `state()`: its `remaining` lists the
    epochs up to the last one begun, and every epoch after those has all its samples left
    (so a run of 10^5 epochs stopped early has a short state, which fits a message header).

    Example:
        >>> remaining_per_epoch({"num_samples": 10, "epochs": 4, "remaining": [0, 6]})
        [0, 6, 10, 10]
    """
    listed = [int(r) for r in state["remaining"]]
    epochs = int(state["epochs"])
    if len(listed) > epochs:
        raise ValueError(f"{len(listed)} epochs' remaining samples listed, for {epochs} epochs")
    return listed + [int(state["num_samples"])] * (epochs - len(listed))


def _trimmed(remaining: list[int], num_samples: int) -> list[int]:
    """`remaining` without the untouched epochs at its end (`remaining_per_epoch` adds them)."""
    end = len(remaining)
    while end and remaining[end - 1] == num_samples:
        end -= 1
    return list(remaining[:end])
