"""Sync under a codec whose frames an allreduce cannot sum (int8, qsgd, topk, randomk): every
rank gathers every rank's frame (an allgather), decodes each and sums them in rank order, so
that every rank applies the same gradient.

A rank's message is its frame (`nbdist.core.compression`, with its error feedback for topk and
randomk and its own random stream for randomk and qsgd) followed by the step's float32 extra
values (the sync control), which the ranks sum with the gradient. Each message has the same
length on every rank: a frame's length depends only on the codec and the number of floats.

A ring allgather moves (ranks - 1) frames into and out of every rank, where a ring allreduce
moves 2 (ranks - 1) / ranks of the float32 buffer: a codec saves bytes in sync while its frame
is under 2 / ranks of float32's (topk:0.01, 2% of them, below 100 ranks; int8 and qsgd, 25%,
below 8).
"""

from __future__ import annotations

import numpy as np

from nbdist.core.compression import Codec, PushEncoder, decode_add

FLOAT32 = 4  # bytes


class GatheredFrames:
    """One rank's side of a gathered sync step, for the whole run (its error feedback lives
    from step to step).

    Example:
        >>> frames = GatheredFrames("int8", 4, np.random.default_rng(0))
        >>> gradient = np.array([127, -127, 0, 64], np.float32)  # int8's scale: 1
        >>> message = frames.message(gradient, np.ones(1, np.float32))
        >>> total, extra = frames.sum(np.stack([message, message]))  # two ranks, one message
        >>> total.tolist(), extra.tolist()
        ([254.0, -254.0, 0.0, 128.0], [2.0])
    """

    def __init__(self, codec: str | Codec, count: int, rng: np.random.Generator):
        self.push = PushEncoder(codec, count, rng)
        self.codec, self.count = self.push.codec, count
        self.frame_bytes = self.codec.wire_bytes(count)
        self.total = np.empty(count, dtype=np.float32)
        self._message = np.empty(0, dtype=np.uint8)

    def message(self, gradient: np.ndarray, extra: np.ndarray) -> np.ndarray:
        """This rank's bytes for the allgather: its frame of `gradient`, then `extra`."""
        size = self.frame_bytes + FLOAT32 * extra.size
        if self._message.size != size:
            self._message = np.empty(size, dtype=np.uint8)
        self._message[:self.frame_bytes] = self.push.encode(gradient).view(np.uint8)
        self._message[self.frame_bytes:].view("<f4")[:] = extra
        return self._message

    def sum(self, gathered: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The summed gradient and extra values of every rank's message (`gathered`: one row
        per rank, in rank order, as every rank receives them)."""
        self.total[:] = 0
        extra = np.zeros((gathered.shape[1] - self.frame_bytes) // FLOAT32, dtype=np.float32)
        for row in gathered:  # rank order: every rank adds the same numbers in the same order
            decode_add(row[:self.frame_bytes], self.codec, self.total)
            extra += row[self.frame_bytes:].view("<f4")
        return self.total, extra
