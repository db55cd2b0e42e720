"""Plain SGD on the hub: ASGD (Downpour) and Hogwild.

Both apply `w -= lr * g` to a push. They differ in what a worker reads:
- `asgd` answers every pull with a consistent copy of `w` at one version;
- `hogwild` lets workers read the live `w` with no lock (from shared memory on the same host,
  or as a zero-copy send over TCP), so a read may mix two versions (a torn read), as in
  Hogwild! (Niu et al. 2011). It saves one copy per pull.
"""

from __future__ import annotations

import numpy as np

from nbdist.algorithms.base import Option, Rule


def sgd_step(w: np.ndarray, g: np.ndarray, lr: float, scratch: np.ndarray) -> None:
    """`w -= lr * g` in place, with `scratch` (same shape) to avoid allocating per push."""
    np.multiply(g, np.float32(lr), out=scratch)
    np.subtract(w, scratch, out=w)


class ASGD(Rule):
    """Asynchronous SGD (Dean et al. 2012): apply each push as it arrives."""

    name = "asgd"
    consistent_reads = True

    def __init__(self, size: int, num_workers: int, **options: Option):
        super().__init__(size, num_workers, **options)
        self._scratch = np.empty(size, dtype=np.float32)

    def on_push(self, worker: int, w: np.ndarray, g: np.ndarray, lr: float, delay: int) -> bool:
        sgd_step(w, g, lr, self._scratch)
        return True

    @property
    def state_nbytes(self) -> int:
        return self._scratch.nbytes


class Hogwild(ASGD):
    """Lock-free SGD: the same update, but workers may read `w` while it is being written."""

    name = "hogwild"
    consistent_reads = False
