"""What crosses a simulated run's network, and when it arrives.

Each virtual worker's pushes and pulls go through the encoders a TCP worker and its hub use
(`nbdist.core.compression`: the codec, the error feedback, the pulls of changes), so a
simulated `--compression` trains as a real one does. Their bytes are counted as a TCP worker
counts them (`run.traffic`, `run.nodes`; headers left out), and with `--sim bandwidth=...`
or `latency=...` each message takes the virtual time the links give it (`nbdist.core.links`).
"""

from __future__ import annotations

import numpy as np

from nbdist.core.compression import (
    Codec,
    PullEncoder,
    PushEncoder,
    decode_into,
    encode,
    parse,
)
from nbdist.core.links import HUB, Link, Network, ring_allgather_s, ring_allreduce_s

FLOAT32 = 4  # bytes


class VirtualNetwork:
    """The virtual workers' links to the hub: `push` and `pull` give what arrives and when.

    Sync (`--sim sync=1`) exchanges gradients by a ring that bypasses the hub, as `--mode sync`
    does: an allreduce of the float32 or float16 gradient (`ring_allreduce_s`), or for a codec
    whose frames do not sum (int8, qsgd, topk, randomk) an allgather of every worker's frame,
    each encoded with that worker's error feedback and random stream (`ring_allgather_s`). A
    push then takes no time and counts no bytes (as a sync rank's report counts none), and
    each step's pull waits for the ring (the first pull stands for the start's broadcast of the
    weights). An evaluation's pull waits for nothing: a rank evaluates the weights it holds.
    """

    def __init__(self, codec: str | Codec, num_workers: int, count: int, non_trainable: int,
                 links: dict[str, Link] | None, seed: int, sync: bool = False):
        self.codec, self.count, self.sync, self._seed = parse(codec), count, sync, seed
        self.network = Network(links) if links is not None else None
        ring = ring_allgather_s if self.codec.gathered else ring_allreduce_s
        self._ring_s = (ring(self.codec.wire_bytes(count),
                             [links[str(w)] for w in range(num_workers)])
                        if links is not None and sync else 0.0)
        self._nt_bytes = FLOAT32 * non_trainable  # BatchNorm's state travels as float32
        self._push = [PushEncoder(self.codec, count, np.random.default_rng([seed, w, 1]))
                      for w in range(num_workers)]
        self._pull: list[PullEncoder | None] = [None] * num_workers  # after a first, full pull
        self._decoded = np.empty(count, dtype=np.float32)
        # per worker: TCP bytes [sent, received], shared memory's [0, 0], frames' [sent,
        # received], the float32 arrays' they stand for [sent, received] (stats.traffic_row)
        self.traffic = [[0] * 8 for _ in range(num_workers)]

    def push(self, w: int, now: float, gradient: np.ndarray) -> tuple[np.ndarray, float]:
        """The gradient as the hub decodes it from worker `w`'s frame, and when it arrives."""
        if self.sync:  # the allreduce's float16, or the allgather's frame: it bypasses the hub
            if self.codec.name == "none":
                return gradient, now
            frame = (self._push[w].encode(gradient) if self.codec.gathered
                     else encode(gradient, self.codec))
            decode_into(frame, self.codec, self._decoded)
            return self._decoded, now
        received = gradient
        if self.codec.name == "none":
            frame_bytes = gradient.nbytes
        else:
            frame = self._push[w].encode(gradient)
            decode_into(frame, self.codec, self._decoded)
            frame_bytes, received = frame.nbytes, self._decoded
        self._count(w, sent=frame_bytes)
        arrives = (now if self.network is None
                   else self.network.send(now, str(w), HUB, frame_bytes + self._nt_bytes))
        return received, arrives

    def pull(self, w: int, now: float, weights: np.ndarray, out: np.ndarray,
             full: bool = False) -> float:
        """Write into `out` what worker `w` receives of `weights` (all of them: `full`, as for
        an evaluation); returns when it arrives."""
        if self.sync:
            np.copyto(out, weights)
            return now if full else now + self._ring_s
        codec, pull = self.codec, self._pull[w]
        if codec.lossy and (full or pull is None):  # the weights themselves, as float32
            if pull is None:
                pull = self._pull[w] = PullEncoder(codec, self.count,
                                                   np.random.default_rng([self._seed, w, 2]))
            np.copyto(pull.held, weights)
            np.copyto(out, weights)
            frame_bytes = weights.nbytes
        elif codec.lossy:  # the change from the copy the worker holds
            frame_bytes = pull.encode(weights).nbytes
            np.copyto(out, pull.held)  # the worker's copy equals the hub's (tests/inproc)
        else:
            frame = encode(weights, codec)
            np.copyto(out, frame)
            frame_bytes = frame.nbytes
        self._count(w, received=frame_bytes)
        return (now if self.network is None
                else self.network.send(now, HUB, str(w), frame_bytes + self._nt_bytes))

    def _count(self, w: int, sent: int = 0, received: int = 0) -> None:
        counts, floats = self.traffic[w], FLOAT32 * self.count
        counts[0] += sent + self._nt_bytes * bool(sent)
        counts[1] += received + self._nt_bytes * bool(received)
        counts[4] += sent
        counts[5] += received
        counts[6] += floats * bool(sent)
        counts[7] += floats * bool(received)
