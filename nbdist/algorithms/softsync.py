"""n-softsync (Zhang, Gupta, Lian, Liu, IJCAI 2016): apply the mean of every c pushes.

The hub buffers `lr_l * g_l` of each push (lr_l already staleness-scaled by the hub when
`staleness-lr` is on) and every `c = max(1, M // n)` pushes applies `w -= (1/c) Σ lr_l g_l`.
n = M (c = 1) is ASGD; n = 1 (c = M) waits for as many pushes as there are workers.

nbdist's choices, where the paper leaves them open:
- n defaults to M (the paper's λ-softsync, the setting it mostly reports), so picking
  `softsync` without `n` behaves as `asgd`; set `n` to buffer.
- c uses the configured M, not the workers still running, so a worker leaving does not
  change the rule mid-run; its buffered pushes stay in the sum (they are valid gradients).
- The version only advances when the buffer is applied (on_push returns True), so τ counts
  applied updates, as in the paper.
- Buffered pushes left at the end are applied by `flush(w)`, if the hub calls it.
"""

from __future__ import annotations

import numpy as np

from nbdist.algorithms.base import Option, Rule
from nbdist.algorithms.sgd import sgd_step


class SoftSync(Rule):
    """Buffer pushes; every `max(1, M // n)` of them, apply their mean."""

    name = "softsync"
    predicts_weights = False  # pushes are buffered, then applied together
    corrects_momentum = False  # pushes are averaged, then applied together
    compensates_delay = False
    takes_local_steps = True
    workers_step = False
    state_fields = ("_sum", "buffered")  # pushes buffered but not yet applied

    def __init__(self, size: int, num_workers: int, **options: Option):
        super().__init__(size, num_workers, **options)
        self._sum = np.zeros(size, np.float32)
        self._scratch = np.empty(size, np.float32)
        self.buffered = 0  # pushes in the accumulator

    @classmethod
    def default_options(cls, num_workers: int) -> dict[str, Option]:
        return {"n": num_workers}

    def _bounds(self, name: str) -> tuple[float, float]:
        return 1, self.num_workers

    @property
    def pushes_per_update(self) -> int:
        """c = max(1, M // n)."""
        return max(1, self.num_workers // self._options["n"])

    def on_push(self, worker: int, w: np.ndarray, g: np.ndarray, lr: float, delay: int) -> bool:
        if self.pushes_per_update == 1 and not self.buffered:  # c = 1: exactly one SGD step
            sgd_step(w, g, lr, self._scratch)
            return True
        np.multiply(g, np.float32(lr), out=self._scratch)
        np.add(self._sum, self._scratch, out=self._sum)
        self.buffered += 1
        if self.buffered < self.pushes_per_update:
            return False
        return self.flush(w)

    def gradient(self, worker: int, w: np.ndarray, g: np.ndarray, delay: int,
                 scale: float) -> tuple[np.ndarray, float] | None:
        """For another optimizer: buffer `scale_l * g_l`; every c pushes hand it
        `(1/c) Σ scale_l g_l` at scale 1 (c = 1: the push itself)."""
        if self.pushes_per_update == 1 and not self.buffered:
            return g, scale
        np.multiply(g, np.float32(scale), out=self._scratch)
        np.add(self._sum, self._scratch, out=self._sum)
        self.buffered += 1
        if self.buffered < self.pushes_per_update:
            return None
        np.multiply(self._sum, np.float32(1.0 / self.buffered), out=self._scratch)
        self._sum.fill(0.0)
        self.buffered = 0
        return self._scratch, 1.0

    def flush(self, w: np.ndarray) -> bool:
        """Apply the mean of what is buffered now; False if nothing was."""
        if not self.buffered:
            return False
        np.multiply(self._sum, np.float32(1.0 / self.buffered), out=self._sum)
        np.subtract(w, self._sum, out=w)
        self._sum.fill(0.0)
        self.buffered = 0
        return True

    @property
    def state_nbytes(self) -> int:
        return self._sum.nbytes + self._scratch.nbytes
