"""`async-local-sgd` (Liu et al. 2024, "Asynchronous Local-SGD Training for Language Modeling"):
each worker takes H inner steps with the cell's optimizer and pushes its delta Δ as soon as it
is done; the hub applies each delta at once, with the paper's delayed Nesterov momentum (DN).

Momentum on stale deltas overshoots (the paper's finding), so DN folds the deltas into the
momentum only once every N pushes, their mean, and steps on the plain delta in between:

    δ ← δ + Δ                          every push t (t counts from 0)
    w ← w − η Δ / N
    if (t + 1) mod N = 0:              every N-th push
        m ← β m + δ / N
        w ← w − η β m
        δ ← 0

Over N pushes that is DiLoCo's outer Nesterov step, `w − η (ḡ + β m)` with `m = β m + ḡ`, on
the mean ḡ of the last N deltas, but each delta lands as it arrives. Defaults: N = M workers
(the `buffer` option), β = 0.9 (`momentum`), η = 0.7 (`outer_lr`, times the hub's rate, 1
unless `run.set_lr` changes it); β and η as DiLoCo's outer optimizer.
"""

from __future__ import annotations

import math

import numpy as np

from nbdist.algorithms.base import Option, Rule


class AsyncLocalSGD(Rule):
    """Apply each worker's delta at once; fold the last N deltas' mean into a Nesterov
    momentum every N pushes (see the module docstring)."""

    name = "async-local-sgd"
    predicts_weights = False  # a push is H steps' delta
    corrects_momentum = False  # the outer momentum is the recipe's own
    compensates_delay = False
    takes_local_steps = True
    workers_step = False
    shares_rounds = True  # H = 500 steps would give the first worker to ask a small epoch alone
    state_fields = ("_momentum", "_pending", "pushes")  # m, δ and t

    def __init__(self, size: int, num_workers: int, **options: Option):
        super().__init__(size, num_workers, **options)
        self._momentum = np.zeros(size, np.float32)
        self._pending = np.zeros(size, np.float32)
        self._scratch = np.empty(size, np.float32)
        self.pushes = 0

    @classmethod
    def default_options(cls, num_workers: int) -> dict[str, Option]:
        return {"buffer": num_workers, "momentum": 0.9, "outer_lr": 0.7}

    def _bounds(self, name: str) -> tuple[float, float]:
        if name == "buffer":
            return 1, math.inf
        if name == "momentum":
            return 0.0, 0.999
        return 0.0, math.inf

    def on_push(self, worker: int, w: np.ndarray, g: np.ndarray, lr: float, delay: int) -> bool:
        n = int(self._options["buffer"])
        eta = np.float32(lr * self._options["outer_lr"])
        np.add(self._pending, g, out=self._pending)
        np.multiply(g, eta / np.float32(n), out=self._scratch)
        np.subtract(w, self._scratch, out=w)
        self.pushes += 1
        if self.pushes % n == 0:
            beta = np.float32(self._options["momentum"])
            np.multiply(self._momentum, beta, out=self._momentum)
            np.multiply(self._pending, np.float32(1.0) / np.float32(n), out=self._scratch)
            np.add(self._momentum, self._scratch, out=self._momentum)
            np.multiply(self._momentum, eta * beta, out=self._scratch)
            np.subtract(w, self._scratch, out=w)
            self._pending.fill(0.0)
        return True

    def gradient(self, worker: int, w: np.ndarray, g: np.ndarray, delay: int,
                 scale: float) -> tuple[np.ndarray, float] | None:
        raise TypeError("async-local-sgd is its own outer optimizer (delayed Nesterov) on plain "
                        "SGD; it does not hand its deltas to another optimizer "
                        "(nbdist.core.updater refuses that)")

    @property
    def state_nbytes(self) -> int:
        return self._momentum.nbytes + self._pending.nbytes + self._scratch.nbytes
