"""Plain SGD on the hub: ASGD (Downpour) and Hogwild.

Both apply `w -= lr * g` to a push. They differ in what a worker reads:
- `asgd` answers every pull with a consistent copy of `w` at one version;
- `hogwild` lets workers read the live `w` with no lock (from shared memory on the same host,
  or as a zero-copy send over TCP), so a read may mix two versions (a torn read), as in
  Hogwild! (Niu et al. 2011). It saves one copy per pull.
"""

from __future__ import annotations

import numpy as np

from nbdist.algorithms import kernels
from nbdist.algorithms.base import Option, Rule
from nbdist.algorithms.blocks import Ranges, Runner, run_serial
from nbdist.algorithms.kernels import STREAM_MIN, sgd_step, sgd_step_and_copy


class ASGD(Rule):
    """Asynchronous SGD (Dean et al. 2012): apply each push as it arrives."""

    name = "asgd"
    predicts_weights = True
    corrects_momentum = True  # each push is one step of the optimizer
    compensates_delay = False
    takes_local_steps = True
    workers_step = False
    consistent_reads = True

    def __init__(self, size: int, num_workers: int, **options: Option):
        super().__init__(size, num_workers, **options)
        # NumPy's two-pass step needs a scratch array; the compiled kernel does not
        self._scratch = np.empty(size if kernels.COMPILED is None else 0, dtype=np.float32)
        self._stream = size >= STREAM_MIN  # the reply is larger than the cache
        self._run: Runner = run_serial
        self._ranges: Ranges = [(0, size)]

    def use_blocks(self, run: Runner, ranges: Ranges) -> None:
        """Apply each push as the blocks `ranges` of `[0, size)`, run by `run` (a thread pool's
        runner, `nbdist.algorithms.blocks`); the same numbers as one pass."""
        self._run, self._ranges = run, ranges

    def on_push(self, worker: int, w: np.ndarray, g: np.ndarray, lr: float, delay: int) -> bool:
        s = self._scratch if self._scratch.size else None
        if len(self._ranges) == 1:  # one block: no closure, no runner
            sgd_step(w, g, lr, s)
            return True
        self._run(lambda lo, hi: sgd_step(w[lo:hi], g[lo:hi], lr, s if s is None else s[lo:hi]),
                  self._ranges)
        return True

    def push_and_read(self, worker: int, w: np.ndarray, g: np.ndarray, lr: float, delay: int,
                      out: np.ndarray) -> bool:
        s, stream = self._scratch if self._scratch.size else None, self._stream
        if len(self._ranges) == 1:
            sgd_step_and_copy(w, g, lr, s, out, stream)
            return True
        self._run(lambda lo, hi: sgd_step_and_copy(w[lo:hi], g[lo:hi], lr,
                                                   s if s is None else s[lo:hi],
                                                   out[lo:hi], stream),
                  self._ranges)
        return True

    @property
    def state_nbytes(self) -> int:
        return self._scratch.nbytes


class Hogwild(ASGD):
    """Lock-free SGD: the same update, but workers may read `w` while it is being written."""

    name = "hogwild"
    predicts_weights = False  # its reads are live memory, not a buffer the hub writes
    corrects_momentum = True  # each push is one step of the optimizer
    compensates_delay = False
    takes_local_steps = True
    workers_step = False
    consistent_reads = False
