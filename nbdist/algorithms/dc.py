"""Delay-compensated ASGD: `dc-asgd`, `dc-asgd-a` (Zheng et al. ICML 2017) and `ddc-asgd`.

A push's gradient g was computed at the backup `bak[m]` the worker read, not at today's `w`.
DC-ASGD adds the first-order Taylor term of the gradient's drift, with `λ g⊙g` standing in
for the Hessian's diagonal: `ĝ = g + λ g⊙g⊙(w − bak[m])` (`dc_compensate`).

- `dc-asgd`: constant λ = λ0 (0.04).
- `dc-asgd-a`: λ = λ0 / sqrt(MS + ε) elementwise, MS one running mean of g⊙g over all pushes
  on this shard (as in the paper; not one per worker); λ0 = 2, m = 0.95, ε = 1e-7. MS is updated
  with the current push before it is used, in the order ALGORITHMS.md gives.
- `ddc-asgd`: ĝ from `dc-asgd-a`, then delay-weighted momentum `d = β d − (1 − β) η ĝ`,
  `w += d`, `β = τ / (τ + 1/(1 − μ))`: a fresh push (τ = 0) is plain SGD on ĝ, a stale one
  trusts the shard's momentum more. d and MS are global per shard.

Backups live in a `SnapshotStore`, so workers that read the same version share one copy.
nbdist's choice: a push from a worker with no backup (it never pulled from this rule) is applied
uncompensated; MS is still updated.
"""

from __future__ import annotations

import math

import numpy as np

from nbdist.algorithms.base import Option, Rule
from nbdist.algorithms.sgd import sgd_step
from nbdist.algorithms.snapshots import SnapshotStore

_BELOW_ONE = math.nextafter(1.0, 0.0)


def dc_compensate(g: np.ndarray, w: np.ndarray, backup: np.ndarray, curvature: np.ndarray | float,
                  out: np.ndarray) -> np.ndarray:
    """`out = g + curvature ⊙ (w − backup)`: the stale gradient moved to today's `w`.

    `curvature` is the Hessian's diagonal or its stand-in (`λ g⊙g`); with the exact Hessian of a
    quadratic the result is exactly the gradient at `w`. `out` must not alias the inputs.
    """
    np.subtract(w, backup, out=out)
    np.multiply(out, curvature, out=out)
    np.add(out, g, out=out)
    return out


def ddc_beta(delay: int, momentum: float) -> float:
    """`β = τ / (τ + q)`, `q = 1/(1 − μ)`: 0 for a fresh push, towards 1 as it gets staler."""
    tau = max(0, int(delay))
    return tau / (tau + 1.0 / (1.0 - momentum))


class DCASGD(Rule):
    """DC-ASGD with constant λ0: `w -= η (g + λ0 g⊙g⊙(w − bak[m]))`."""

    name = "dc-asgd"

    def __init__(self, size: int, num_workers: int, **options: Option):
        super().__init__(size, num_workers, **options)
        self._store = SnapshotStore(size)
        self._backup: dict[int, tuple[int, np.ndarray]] = {}  # worker -> (version, snapshot)
        self._a = np.empty(size, np.float32)
        self._b = np.empty(size, np.float32)

    @classmethod
    def default_options(cls, num_workers: int) -> dict[str, Option]:
        return {"lambda0": 0.04}

    def on_pull(self, worker: int, w: np.ndarray, version: int) -> None:
        """`bak[worker] = w`, shared with every worker that read the same version."""
        held = self._backup.get(worker)
        if held is not None:
            if held[0] == version:
                return
            self._store.release(held[0])  # first, so its buffer can be reused just below
        self._backup[worker] = (version, self._store.acquire(version, w))

    def forget(self, worker: int) -> None:
        held = self._backup.pop(worker, None)
        if held is not None:
            self._store.release(held[0])

    def on_push(self, worker: int, w: np.ndarray, g: np.ndarray, lr: float, delay: int) -> bool:
        corrected = self._corrected(worker, w, g)
        sgd_step(w, corrected, lr, self._a)
        return True

    def _curvature(self, g: np.ndarray) -> np.ndarray:
        """`λ0 g⊙g` into scratch `_b`."""
        np.multiply(g, g, out=self._b)
        np.multiply(self._b, np.float32(self._options["lambda0"]), out=self._b)
        return self._b

    def _corrected(self, worker: int, w: np.ndarray, g: np.ndarray) -> np.ndarray:
        """ĝ in scratch `_a` (or `g` itself when the worker has no backup)."""
        curvature = self._curvature(g)
        held = self._backup.get(worker)
        if held is None:
            return g
        return dc_compensate(g, w, held[1], curvature, out=self._a)

    @property
    def backup_versions(self) -> list[int]:
        """Versions with a live backup (one copy each, however many workers hold it)."""
        return self._store.versions

    @property
    def state_nbytes(self) -> int:
        return self._a.nbytes + self._b.nbytes + self._store.nbytes


class DCASGDAdaptive(DCASGD):
    """DC-ASGD-a: λ = λ0 / sqrt(MS + ε), MS a running mean of g⊙g over every push."""

    name = "dc-asgd-a"

    def __init__(self, size: int, num_workers: int, **options: Option):
        super().__init__(size, num_workers, **options)
        self._ms = np.zeros(size, np.float32)

    @classmethod
    def default_options(cls, num_workers: int) -> dict[str, Option]:
        return {"lambda0": 2.0, "ms_decay": 0.95, "epsilon": 1e-7}

    def _bounds(self, name: str) -> tuple[float, float]:
        return (0.0, _BELOW_ONE) if name == "ms_decay" else (0.0, math.inf)

    def _curvature(self, g: np.ndarray) -> np.ndarray:
        """Update MS with this push, then `λ0 g⊙g / sqrt(MS + ε)` into `_b` (`_a` as temp)."""
        m = self._options["ms_decay"]
        a, b = self._a, self._b
        np.multiply(g, g, out=b)
        np.multiply(self._ms, np.float32(m), out=self._ms)
        np.multiply(b, np.float32(1.0 - m), out=a)
        np.add(self._ms, a, out=self._ms)
        np.add(self._ms, np.float32(self._options["epsilon"]), out=a)
        np.sqrt(a, out=a)
        np.divide(b, a, out=b)
        np.multiply(b, np.float32(self._options["lambda0"]), out=b)
        return b

    @property
    def state_nbytes(self) -> int:
        return super().state_nbytes + self._ms.nbytes


class DDCASGD(DCASGDAdaptive):
    """DC-ASGD-a's ĝ through delay-weighted momentum: `d = β d − (1−β) η ĝ; w += d`."""

    name = "ddc-asgd"

    def __init__(self, size: int, num_workers: int, **options: Option):
        super().__init__(size, num_workers, **options)
        self._d = np.zeros(size, np.float32)

    @classmethod
    def default_options(cls, num_workers: int) -> dict[str, Option]:
        return {**super().default_options(num_workers), "momentum": 0.9}

    def _bounds(self, name: str) -> tuple[float, float]:
        return (0.0, _BELOW_ONE) if name == "momentum" else super()._bounds(name)

    def on_push(self, worker: int, w: np.ndarray, g: np.ndarray, lr: float, delay: int) -> bool:
        corrected = self._corrected(worker, w, g)
        beta = ddc_beta(delay, self._options["momentum"])
        np.multiply(self._d, np.float32(beta), out=self._d)
        np.multiply(corrected, np.float32(-(1.0 - beta) * lr), out=self._a)
        np.add(self._d, self._a, out=self._d)
        np.add(w, self._d, out=w)
        return True

    @property
    def state_nbytes(self) -> int:
        return super().state_nbytes + self._d.nbytes
