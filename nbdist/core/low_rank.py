"""PowerSGD (Vogels et al. 2019, `--compression powersgd:RANK`): the matrices of a slice travel
as rank-r factors, the rest of the slice dense.

For each matrix M (rows x cols) of the slice, one power iteration warm-started from the
sender's last Q (cols x r):

    P = M Q;   P <- orthonormal columns of P (QR);   Q <- M^T P;   M is received as P Q^T.

A frame of a slice is float32 `[P_1, Q_1, ..., P_j, Q_j, the other floats in order]`, so
4 (sum_i (rows_i + cols_i) r + others) bytes. A Keras weight of shape (..., out) is the matrix
(prod(...), out), as a Dense kernel (in, out) is; a weight whose factors would take as many
bytes as itself, a 1-D one (biases, BatchNorm), or one that a hub shard's boundary cuts goes
dense. What a frame leaves out of M is the sender's error feedback
(`nbdist.core.compression.PushEncoder`), so it is sent later, never lost.

Pure NumPy: the first Q (and a column that became zero, which would stay zero) is drawn from
the `numpy.random.Generator` the sender is given, so a frame is exact against a reference given
the same stream (tests/unit/test_low_rank.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

Matrix = tuple[int, int, int]  # (where it starts in the slice, rows, cols)


def matrices_in(shapes: Sequence[Sequence[int]], lo: int, hi: int, rank: int) -> tuple[Matrix, ...]:
    """The matrices that `rank`-r factors send in fewer bytes, among the variables `shapes` (in
    the flat vector's order) that lie wholly in the slice `[lo, hi)`; starts are relative to `lo`.

    Example:
        >>> matrices_in([(784, 256), (256,), (256, 10), (10,)], 0, 203530, 4)
        ((0, 784, 256), (200960, 256, 10))
        >>> matrices_in([(784, 256), (256,)], 100, 200960, 4)  # the kernel is cut: dense
        ()
    """
    found, start = [], 0
    for shape in shapes:
        size = math.prod(shape)
        if len(shape) >= 2 and lo <= start and start + size <= hi:
            cols = int(shape[-1])
            rows = size // cols
            if (rows + cols) * rank < size:
                found.append((start - lo, rows, cols))
        start += size
    return tuple(found)


def frame_floats(count: int, matrices: Sequence[Matrix], rank: int) -> int:
    """The float32 values a frame of a `count`-float slice holds.

    Example:
        >>> frame_floats(203530, ((0, 784, 256), (200960, 256, 10)), 4)  # of 203,530
        5490
    """
    return count - sum((rows * cols) - (rows + cols) * rank for _, rows, cols in matrices)


def _others(count: int, matrices: Sequence[Matrix]) -> np.ndarray:
    """The indices of the slice's floats that go dense (in order)."""
    dense = np.ones(count, dtype=bool)
    for start, rows, cols in matrices:
        dense[start:start + rows * cols] = False
    return np.flatnonzero(dense)


def _revive(q: np.ndarray, rng: np.random.Generator) -> None:
    """Draw again, in place, each column of Q that is zero (M^T P = 0): warm-started from it,
    the next P would be zero too, and the column would stay zero for ever."""
    dead = ~np.any(q, axis=0)
    if dead.any():
        q[:, dead] = rng.standard_normal((q.shape[0], int(dead.sum())), dtype=np.float32)


class LowRankSender:
    """One sender's frames of one slice, each matrix's Q warm-started from its last frame.

    Example:
        >>> sender = LowRankSender(((0, 2, 3),), 1, 7, np.random.default_rng(0))
        >>> m = np.array([1, 2, 3, 2, 4, 6, 9], dtype=np.float32)  # a rank-1 matrix, then 9
        >>> out = np.empty(7, dtype=np.float32)
        >>> LowRankReceiver(((0, 2, 3),), 1, 7).decode_into(sender.encode(m), out)
        >>> np.allclose(out, m)
        True
    """

    def __init__(self, matrices: Sequence[Matrix], rank: int, count: int,
                 rng: np.random.Generator):
        self.matrices, self.rank, self.count, self.rng = tuple(matrices), rank, count, rng
        self.others = _others(count, self.matrices)
        self.q = [rng.standard_normal((cols, rank), dtype=np.float32)
                  for _, _, cols in self.matrices]
        self.size = frame_floats(count, self.matrices, rank)

    def encode(self, values: np.ndarray) -> np.ndarray:
        """The frame (bytes) of float32 `values`; the Qs move on to this frame's."""
        frame = np.empty(self.size, dtype=np.float32)
        at, r = 0, self.rank
        for (start, rows, cols), q in zip(self.matrices, self.q, strict=True):
            m = values[start:start + rows * cols].reshape(rows, cols)
            p = frame[at:at + rows * r].reshape(rows, r)
            p[:] = np.linalg.qr(m @ q)[0]
            at += rows * r
            q_next = frame[at:at + cols * r].reshape(cols, r)
            np.matmul(m.T, p, out=q_next)
            at += cols * r
            q[:] = q_next
            _revive(q, self.rng)
        np.take(values, self.others, out=frame[at:])
        return frame.view(np.uint8)


class LowRankReceiver:
    """A receiver's decoding of one slice's frames (no state of its own: P and Q both travel)."""

    def __init__(self, matrices: Sequence[Matrix], rank: int, count: int):
        self.matrices, self.rank, self.count = tuple(matrices), rank, count
        self.others = _others(count, self.matrices)

    def decode_into(self, frame: np.ndarray, out: np.ndarray) -> None:
        """Write the values frame `frame` (bytes, its length checked by the caller) stands for
        into float32 `out`."""
        values = frame.view("<f4")
        at, r = 0, self.rank
        for start, rows, cols in self.matrices:
            p = values[at:at + rows * r].reshape(rows, r)
            at += rows * r
            q = values[at:at + cols * r].reshape(cols, r)
            at += cols * r
            np.matmul(p, q.T, out=out[start:start + rows * cols].reshape(rows, cols))
        out[self.others] = values[at:]


class LowRankReducer:
    """One rank's PowerSGD over an allreduce (Vogels et al. 2019, Algorithm 1), for sync mode:
    every rank runs the same steps, and two sums over the ranks make everyone's frame one.

    With M_i this rank's weighted gradient plus its error feedback e_i, for each matrix:
    `first`: P_i = M_i Q (Q the same on every rank), then the ranks sum P (with the slice's
    other floats and the caller's `extra` in the same buffer); `second`: P <- orthonormal
    columns of the sum, Q_i = M_i^T P, e_i = M_i - P Q_i^T, then the ranks sum Q; `finish`:
    the step's gradient is P Q^T (Q the sum), the other floats their sum, and Q warm-starts the
    next step, equal on every rank. `reduce` runs the three around a caller's in-place sum.

    Example:
        >>> r = LowRankReducer(((0, 2, 3),), 1, 6, seed=0)
        >>> g = np.array([1, 2, 3, 2, 4, 6], dtype=np.float32)  # rank 1: arrives whole
        >>> alone = lambda buffer: None  # one rank: its sums are its own buffers
        >>> out, _ = r.reduce(g, np.zeros(0, np.float32), alone, alone)
        >>> np.allclose(out, g)
        True
    """

    def __init__(self, matrices: Sequence[Matrix], rank: int, count: int, seed: int):
        self.matrices, self.rank, self.count = tuple(matrices), rank, count
        self.rng = np.random.default_rng(seed)  # the same stream on every rank
        self.others = _others(count, self.matrices)
        self.q = [self.rng.standard_normal((cols, rank), dtype=np.float32)
                  for _, _, cols in self.matrices]
        self.residual = np.zeros(count, dtype=np.float32)  # e_i
        self._p_floats = sum(rows * rank for _, rows, _ in self.matrices)
        self._q_sum = np.empty(sum(cols * rank for _, _, cols in self.matrices), np.float32)
        largest = max((rows * cols for _, rows, cols in self.matrices), default=0)
        self._product = np.empty(largest, dtype=np.float32)  # P Q^T of one matrix
        self.out = np.empty(count, dtype=np.float32)
        self._first = np.empty(0, dtype=np.float32)

    def first(self, gradient: np.ndarray, extra: np.ndarray) -> np.ndarray:
        """The buffer the ranks sum first: every P_i, then the other floats, then `extra`."""
        size = self._p_floats + self.others.size + extra.size
        if self._first.size != size:
            self._first = np.empty(size, dtype=np.float32)
        buffer = self._first
        self.residual += gradient  # M_i
        at, r = 0, self.rank
        for (start, rows, cols), q in zip(self.matrices, self.q, strict=True):
            m = self.residual[start:start + rows * cols].reshape(rows, cols)
            np.matmul(m, q, out=buffer[at:at + rows * r].reshape(rows, r))
            at += rows * r
        np.take(self.residual, self.others, out=buffer[at:at + self.others.size])
        buffer[at + self.others.size:] = extra
        return buffer

    def second(self, summed_first: np.ndarray) -> np.ndarray:
        """The buffer the ranks sum next: every Q_i = M_i^T P; this rank's e_i is left."""
        at, at_q, r = 0, 0, self.rank
        for start, rows, cols in self.matrices:
            p = summed_first[at:at + rows * r].reshape(rows, r)
            p[:] = np.linalg.qr(p)[0]
            at += rows * r
            m = self.residual[start:start + rows * cols].reshape(rows, cols)
            q_local = self._q_sum[at_q:at_q + cols * r].reshape(cols, r)
            np.matmul(m.T, p, out=q_local)
            at_q += cols * r
            product = self._product[:rows * cols].reshape(rows, cols)
            np.matmul(p, q_local.T, out=product)
            m -= product  # e_i = M_i - P Q_i^T
        self.residual[self.others] = 0  # the other floats are sent whole
        return self._q_sum

    def finish(self, summed_first: np.ndarray, summed_second: np.ndarray) -> tuple[np.ndarray,
                                                                                   np.ndarray]:
        """The step's gradient (every rank the same) and the summed `extra`."""
        at, at_q, r = 0, 0, self.rank
        for (start, rows, cols), q in zip(self.matrices, self.q, strict=True):
            p = summed_first[at:at + rows * r].reshape(rows, r)
            at += rows * r
            q[:] = summed_second[at_q:at_q + cols * r].reshape(cols, r)
            at_q += cols * r
            np.matmul(p, q.T, out=self.out[start:start + rows * cols].reshape(rows, cols))
            _revive(q, self.rng)  # the same columns on every rank: Q is the same sum
        self.out[self.others] = summed_first[at:at + self.others.size]
        return self.out, summed_first[at + self.others.size:]

    def reduce(self, gradient: np.ndarray, extra: np.ndarray,
               sum_p: Callable[[np.ndarray], object],
               sum_q: Callable[[np.ndarray], object]) -> tuple[np.ndarray, np.ndarray]:
        """`first`, `second` and `finish`, with `sum_p(buffer)` and `sum_q(buffer)` each summing
        a buffer over the ranks in place (two allreduces, which Horovod tells apart by name)."""
        first = self.first(gradient, extra)
        sum_p(first)
        second = self.second(first)
        sum_q(second)
        return self.finish(first, second)
