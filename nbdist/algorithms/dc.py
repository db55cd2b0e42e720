"""Delay-compensated ASGD: `dc-asgd`, `dc-asgd-a` (Zheng et al. ICML 2017) and `ddc-asgd`.

A push's gradient g was computed at the backup `bak[m]` the worker read, not at today's `w`.
DC-ASGD adds the first-order Taylor term of the gradient's drift, with `λ g⊙g` standing in
for the Hessian's diagonal: `ĝ = g + λ g⊙g⊙(w − bak[m])` (`dc_compensate`).

- `dc-asgd`: constant λ = λ0 (0.04).
- `dc-asgd-a`: λ = λ0 / sqrt(MS + ε) elementwise, MS one running mean of g⊙g over all pushes
  on this shard (as in the paper; not one per worker); λ0 = 2, m = 0.95, ε = 1e-7. MS is updated
  with the current push before it is used, in the order docs/rules.md gives.
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
from nbdist.algorithms.blocks import BLOCK
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
    """DC-ASGD with constant λ0: `w -= η (g + λ0 g⊙g⊙(w − bak[m]))`.

    A push is applied block by block (`BLOCK` floats), with block-sized scratch: every pass
    of the update then reads from cache instead of memory, and the scratch costs kilobytes."""

    name = "dc-asgd"
    predicts_weights = False  # the compensation assumes the weights the worker read
    corrects_momentum = True  # the compensated gradient is one step of the optimizer
    compensates_delay = True  # its curvature term corrects the late gradient
    takes_local_steps = False  # the compensation is not linear in what is pushed
    workers_step = False

    def __init__(self, size: int, num_workers: int, **options: Option):
        super().__init__(size, num_workers, **options)
        self._store = SnapshotStore(size)
        # worker -> its last reads, oldest first
        self._backup: dict[int, list[tuple[int, np.ndarray]]] = {}
        self._lag: dict[int, int] = {}  # worker -> reads its next push lags behind its latest
        self._a = np.empty(min(size, BLOCK), np.float32)
        self._b = np.empty(min(size, BLOCK), np.float32)
        self._ghat: np.ndarray | None = None  # ĝ for another optimizer (see `gradient`)

    @classmethod
    def default_options(cls, num_workers: int) -> dict[str, Option]:
        return {"lambda0": 0.04}

    def on_pull(self, worker: int, w: np.ndarray, version: int) -> None:
        """`bak[worker] = w`, shared with every worker that read the same version; the last
        `reads_kept` reads are kept (an overlapped push was computed on the one before)."""
        held = self._backup.setdefault(worker, [])
        if self.reads_kept == 1 and held:
            if held[-1][0] == version:
                return
            self._store.release(held.pop()[0])  # first, so its buffer can be reused just below
        held.append((version, self._store.acquire(version, w)))
        while len(held) > self.reads_kept:
            self._store.release(held.pop(0)[0])

    def computed_at(self, worker: int, lag: int) -> None:
        self._lag[worker] = lag

    def forget(self, worker: int) -> None:
        for version, _ in self._backup.pop(worker, []):
            self._store.release(version)
        self._lag.pop(worker, None)

    def _held(self, worker: int) -> tuple[int, np.ndarray] | None:
        """The read `worker`'s push was computed on (None: it never pulled from this rule)."""
        held = self._backup.get(worker)
        if not held:
            return None
        return held[max(0, len(held) - 1 - self._lag.get(worker, 0))]

    def on_push(self, worker: int, w: np.ndarray, g: np.ndarray, lr: float, delay: int) -> bool:
        held = self._held(worker)
        self._begin_push(lr, delay)
        for lo in range(0, w.size, BLOCK):
            hi = min(lo + BLOCK, w.size)
            n = hi - lo
            a, b = self._a[:n], self._b[:n]
            part = slice(lo, hi)
            corrected = self._corrected(w[part], g[part],
                                        None if held is None else held[1][part], a, b, part)
            self._apply(w[part], corrected, a if corrected is not a else b, part)
        return True

    def gradient(self, worker: int, w: np.ndarray, g: np.ndarray, delay: int,
                 scale: float) -> tuple[np.ndarray, float] | None:
        """ĝ for another optimizer to apply (the compensation transforms the gradient, the
        optimizer takes the step); kept in a buffer of the model's size, made on first use."""
        if self._ghat is None:
            self._ghat = np.empty(self.size, np.float32)
        held = self._held(worker)
        for lo in range(0, w.size, BLOCK):
            hi = min(lo + BLOCK, w.size)
            a, b = self._a[:hi - lo], self._b[:hi - lo]
            part = slice(lo, hi)
            self._ghat[part] = self._corrected(w[part], g[part],
                                               None if held is None else held[1][part], a, b, part)
        return self._ghat, scale

    def _begin_push(self, lr: float, delay: int) -> None:
        """Per-push constants for `_apply`."""
        self._lr = np.float32(lr)

    def _apply(self, w: np.ndarray, corrected: np.ndarray, scratch: np.ndarray,
               part: slice) -> None:
        """`w -= η ĝ` on one block."""
        np.multiply(corrected, self._lr, out=scratch)
        np.subtract(w, scratch, out=w)

    def _curvature(self, g: np.ndarray, a: np.ndarray, b: np.ndarray, part: slice) -> np.ndarray:
        """`λ0 g⊙g` into `b`."""
        np.multiply(g, g, out=b)
        np.multiply(b, np.float32(self._options["lambda0"]), out=b)
        return b

    def _corrected(self, w: np.ndarray, g: np.ndarray, backup: np.ndarray | None, a: np.ndarray,
                   b: np.ndarray, part: slice) -> np.ndarray:
        """ĝ for one block, in `a` (or `g` itself when the worker has no backup)."""
        curvature = self._curvature(g, a, b, part)
        if backup is None:
            return g
        return dc_compensate(g, w, backup, curvature, out=a)

    @property
    def backup_versions(self) -> list[int]:
        """Versions with a live backup (one copy each, however many workers hold it)."""
        return self._store.versions

    @property
    def state_nbytes(self) -> int:
        ghat = self._ghat.nbytes if self._ghat is not None else 0
        return self._a.nbytes + self._b.nbytes + self._store.nbytes + ghat


class DCASGDAdaptive(DCASGD):
    """DC-ASGD-a: λ = λ0 / sqrt(MS + ε), MS a running mean of g⊙g over every push."""

    name = "dc-asgd-a"
    predicts_weights = False  # the compensation assumes the weights the worker read
    corrects_momentum = True  # the compensated gradient is one step of the optimizer
    compensates_delay = True  # its curvature term corrects the late gradient
    takes_local_steps = False  # the compensation is not linear in what is pushed
    workers_step = False
    state_fields = ("_ms",)

    def __init__(self, size: int, num_workers: int, **options: Option):
        super().__init__(size, num_workers, **options)
        self._ms = np.zeros(size, np.float32)

    @classmethod
    def default_options(cls, num_workers: int) -> dict[str, Option]:
        return {"lambda0": 2.0, "ms_decay": 0.95, "epsilon": 1e-7}

    def _bounds(self, name: str) -> tuple[float, float]:
        return (0.0, _BELOW_ONE) if name == "ms_decay" else (0.0, math.inf)

    def _curvature(self, g: np.ndarray, a: np.ndarray, b: np.ndarray, part: slice) -> np.ndarray:
        """Update MS with this push, then `λ0 g⊙g / sqrt(MS + ε)` into `b` (`a` as temp)."""
        m = self._options["ms_decay"]
        ms = self._ms[part]
        np.multiply(g, g, out=b)
        np.multiply(ms, np.float32(m), out=ms)
        np.multiply(b, np.float32(1.0 - m), out=a)
        np.add(ms, a, out=ms)
        np.add(ms, np.float32(self._options["epsilon"]), out=a)
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
    predicts_weights = False  # the compensation assumes the weights the worker read
    corrects_momentum = False  # its delay-weighted momentum is the optimizer
    compensates_delay = True  # its curvature term corrects the late gradient
    takes_local_steps = False  # the compensation is not linear in what is pushed
    workers_step = False
    state_fields = ("_ms", "_d")

    def __init__(self, size: int, num_workers: int, **options: Option):
        super().__init__(size, num_workers, **options)
        self._d = np.zeros(size, np.float32)

    @classmethod
    def default_options(cls, num_workers: int) -> dict[str, Option]:
        return {**super().default_options(num_workers), "momentum": 0.9}

    def _bounds(self, name: str) -> tuple[float, float]:
        return (0.0, _BELOW_ONE) if name == "momentum" else super()._bounds(name)

    def gradient(self, worker: int, w: np.ndarray, g: np.ndarray, delay: int,
                 scale: float) -> tuple[np.ndarray, float] | None:
        raise TypeError("ddc-asgd is its own delay-weighted momentum on plain SGD; it does not "
                        "hand its gradient to another optimizer (nbdist.core.updater refuses that)")

    def _begin_push(self, lr: float, delay: int) -> None:
        beta = ddc_beta(delay, self._options["momentum"])
        self._beta, self._step = np.float32(beta), np.float32(-(1.0 - beta) * lr)

    def _apply(self, w: np.ndarray, corrected: np.ndarray, scratch: np.ndarray,
               part: slice) -> None:
        """`d = β d − (1−β) η ĝ; w += d` on one block."""
        d = self._d[part]
        np.multiply(d, self._beta, out=d)
        np.multiply(corrected, self._step, out=scratch)
        np.add(d, scratch, out=d)
        np.add(w, d, out=w)

    @property
    def state_nbytes(self) -> int:
        return super().state_nbytes + self._d.nbytes
