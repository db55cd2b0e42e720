"""Server optimizers for `--local-steps K`: the hub applies a worker's Δ through its own optimizer.

With local steps a worker runs K steps with the cell's optimizer and pushes
`Δ = w_read − w_local` (a descent direction, like a gradient). The hub treats Δ as a
pseudo-gradient (Dpplee3's multi-granular update; FedOpt-style server optimizers):
- `sgd`: `w -= lr·Δ` (lr = 1 replays the worker's K steps on the hub);
- `momentum`: `v = μ v + lr·Δ; w -= v`, μ = 0.9 (for a constant lr the same as
  `v = μ v + Δ; w -= lr·v`; a changed lr or `lr_scale` scales only this push's share, as in Keras);
- `adam`: standard bias-corrected Adam on Δ, β1 = 0.9, β2 = 0.999, ε = 1e-7.

`lr_scale` multiplies this push's rate: pass `dynsgd_scale(delay)` for DynSGD, which divides a
push's Δ by τ + 1. nbdist's choice: Adam's default lr is 1e-2, not 1: its step is about lr per
coordinate whatever Δ's size, so the SGD default would move every weight by ~1 per push.
"""

from __future__ import annotations

import math

import numpy as np

from nbdist.algorithms.base import unknown_option
from nbdist.errors import ConfigError

_BELOW_ONE = math.nextafter(1.0, 0.0)


def dynsgd_scale(delay: int) -> float:
    """DynSGD's `1 / (τ + 1)`: a push τ versions stale counts 1/(τ+1) as much."""
    return 1.0 / (max(0, int(delay)) + 1)


class ServerOptimizer:
    """Base: `apply(w, delta, lr_scale)` in place; `lr` and `options` may change between pushes."""

    name = ""
    default_lr = 1.0
    defaults: dict[str, float] = {}
    bounds: dict[str, tuple[float, float]] = {}
    state_fields: tuple[str, ...] = ()  # what a checkpoint saves (float32 arrays or numbers)

    def __init__(self, size: int, lr: float | None = None, **options: float):
        self.lr = self.default_lr if lr is None else float(lr)
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ConfigError(f"Server learning rate must be positive and finite. Received: {lr!r}.")
        self.options = dict(self.defaults)
        for key, value in options.items():
            if key not in self.defaults:
                raise unknown_option(key, f"the {self.name} server optimizer", self.defaults)
            low, high = self.bounds.get(key, (0.0, math.inf))
            if not low <= float(value) <= high:
                raise ConfigError(f"Server option {key!r} must be in [{low:g}, {high:g}]. "
                                  f"Received: {value!r}.")
            self.options[key] = float(value)
        self._scratch = np.empty(size, np.float32)

    def apply(self, w: np.ndarray, delta: np.ndarray, lr_scale: float = 1.0) -> None:
        raise NotImplementedError

    @property
    def state_nbytes(self) -> int:
        return sum(a.nbytes for a in vars(self).values() if isinstance(a, np.ndarray))


class ServerSGD(ServerOptimizer):
    """`w -= lr·lr_scale·Δ`."""

    name = "sgd"

    def apply(self, w: np.ndarray, delta: np.ndarray, lr_scale: float = 1.0) -> None:
        np.multiply(delta, np.float32(self.lr * lr_scale), out=self._scratch)
        np.subtract(w, self._scratch, out=w)


class ServerMomentum(ServerOptimizer):
    """`v = μ v + lr·lr_scale·Δ; w -= v`."""

    name = "momentum"
    state_fields = ("_v",)
    defaults = {"momentum": 0.9}
    bounds = {"momentum": (0.0, _BELOW_ONE)}

    def __init__(self, size: int, lr: float | None = None, **options: float):
        super().__init__(size, lr, **options)
        self._v = np.zeros(size, np.float32)

    def apply(self, w: np.ndarray, delta: np.ndarray, lr_scale: float = 1.0) -> None:
        np.multiply(self._v, np.float32(self.options["momentum"]), out=self._v)
        np.multiply(delta, np.float32(self.lr * lr_scale), out=self._scratch)
        np.add(self._v, self._scratch, out=self._v)
        np.subtract(w, self._v, out=w)


class ServerAdam(ServerOptimizer):
    """`w -= lr·lr_scale·m̂ / (sqrt(v̂) + ε)`, m̂ and v̂ the bias-corrected moments of Δ."""

    name = "adam"
    state_fields = ("_m", "_v", "iterations")
    default_lr = 1e-2
    defaults = {"beta_1": 0.9, "beta_2": 0.999, "epsilon": 1e-7}
    bounds = {"beta_1": (0.0, _BELOW_ONE), "beta_2": (0.0, _BELOW_ONE)}

    def __init__(self, size: int, lr: float | None = None, **options: float):
        super().__init__(size, lr, **options)
        self._m = np.zeros(size, np.float32)
        self._v = np.zeros(size, np.float32)
        self._step = np.empty(size, np.float32)
        self.iterations = 0

    def apply(self, w: np.ndarray, delta: np.ndarray, lr_scale: float = 1.0) -> None:
        b1, b2, eps = self.options["beta_1"], self.options["beta_2"], self.options["epsilon"]
        self.iterations += 1
        t, a, step = self.iterations, self._scratch, self._step
        np.multiply(self._m, np.float32(b1), out=self._m)
        np.multiply(delta, np.float32(1.0 - b1), out=a)
        np.add(self._m, a, out=self._m)
        np.multiply(delta, delta, out=a)
        np.multiply(a, np.float32(1.0 - b2), out=a)
        np.multiply(self._v, np.float32(b2), out=self._v)
        np.add(self._v, a, out=self._v)
        np.multiply(self._v, np.float32(1.0 / (1.0 - b2**t)), out=a)  # v̂
        np.sqrt(a, out=a)
        np.add(a, np.float32(eps), out=a)
        np.multiply(self._m, np.float32(self.lr * lr_scale / (1.0 - b1**t)), out=step)  # lr·m̂
        np.divide(step, a, out=step)
        np.subtract(w, step, out=w)


SERVER_OPTIMIZERS: dict[str, type[ServerOptimizer]] = {
    cls.name: cls for cls in (ServerSGD, ServerMomentum, ServerAdam)}


def make_server_optimizer(name: str, size: int, lr: float | None = None,
                          **options: float) -> ServerOptimizer:
    """The server optimizer `name` ('sgd' | 'momentum' | 'adam') for a shard of `size` floats.

    `lr=None` takes the optimizer's default (1.0 for sgd and momentum, 1e-2 for adam).

    Example:
        >>> opt = make_server_optimizer("sgd", 2)
        >>> w = np.array([1, 2], np.float32); opt.apply(w, np.array([0.5, -1], np.float32))
        >>> w.tolist()
        [0.5, 3.0]
    """
    try:
        cls = SERVER_OPTIMIZERS[name]
    except KeyError:
        raise ConfigError(f"Unknown server optimizer {name!r}. Expected one of: "
                          f"{', '.join(sorted(SERVER_OPTIMIZERS))}.") from None
    return cls(size, lr, **options)
