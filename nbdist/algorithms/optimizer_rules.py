"""The update formula of each Keras optimizer class, on flat float32 buffers, in place.

Responsible for the part of `optimizer.apply` that differs per class (Keras's `update_step`):
the slots each class keeps (momenta, velocities, accumulators, Nadam's `u_product`) and the
arithmetic that moves the weights. Clipping, weight decay, the learning rate and the step
counter are the same for every class and live in `optimizers.HubOptimizer`.

Formulas, float32 casts and operation order follow Keras 3's source (`keras/src/optimizers/`
sgd.py, adam.py, rmsprop.py, adagrad.py, adamax.py, nadam.py; AdamW is Adam's formula with a
weight decay). Where Keras multiplies by `1 - beta` computed in Python (float64, then cast),
so does this; where it computes `1 - beta` on float32 tensors (Nadam), so does this.

Every formula is elementwise, so a shard applies it to its slice alone. Each step uses two
preallocated scratch buffers of the shard's size (the caller's): nothing is allocated per call.
SGD, momentum and Adam (not AMSGrad) run as one compiled pass where `nbdist.algorithms.kernels`
has its kernel, with these NumPy lines' numbers bit for bit.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from nbdist.algorithms import kernels

_F = np.float32


Scratch = tuple[np.ndarray, np.ndarray]


class UpdateFormula:
    """Base: `apply(w, g, lr, step)` moves `w` in place; `step` is Keras's `iterations` before
    this update (0 on the first). Subclasses set `defaults` to the class's own Keras defaults.

    `scratch` is two float32 buffers of `size` owned by the caller (which also uses them for
    weight decay); `g` must not alias them.
    """

    name: ClassVar[str] = ""
    defaults: ClassVar[dict[str, Any]] = {}
    # the hyper-parameter that carries past gradients into this step (SGD's and RMSprop's
    # `momentum`, the Adam family's `beta_1`), which momentum compensation
    # (`nbdist.algorithms.momentum`) lowers; None: the class has none
    momentum_key: ClassVar[str | None] = None

    def __init__(self, config: dict[str, Any], size: int, scratch: Scratch):
        self.config = config
        self.slots: dict[str, np.ndarray] = {}  # float32 arrays of `size`, saved in checkpoints
        self.scalars: dict[str, float] = {}  # float32 scalars, saved in checkpoints
        self._a, self._b = scratch

    def _slot(self, name: str, size: int, fill: float = 0.0) -> np.ndarray:
        self.slots[name] = np.full(size, fill, _F)
        return self.slots[name]

    def apply(self, w: np.ndarray, g: np.ndarray, lr: np.float32, step: int) -> None:
        raise NotImplementedError


class SGDFormula(UpdateFormula):
    """`m = μm − lr·g; w += m` (Nesterov: `w += μm − lr·g` with the new m); μ = 0: `w −= lr·g`."""

    name = "SGD"
    defaults = {"momentum": 0.0, "nesterov": False}
    momentum_key = "momentum"

    def __init__(self, config: dict[str, Any], size: int, scratch: Scratch):
        super().__init__(config, size, scratch)
        # the cell's: with none, Keras creates no slot (a compensated μ, `config["momentum"]`,
        # may reach 0 and rise again, so the momentum path stays in use then)
        self.has_momentum = float(config["momentum"]) != 0
        if self.has_momentum:
            self.m = self._slot("momentum", size)

    def apply(self, w: np.ndarray, g: np.ndarray, lr: np.float32, step: int) -> None:
        a, b = self._a, self._b
        if not self.has_momentum:
            kernels.sgd_step(w, g, lr, a)
            return
        mu = _F(self.config["momentum"])
        if kernels.momentum_step(w, g, self.m, lr, mu, self.config["nesterov"]):
            return
        np.multiply(g, lr, out=a)
        np.multiply(self.m, mu, out=self.m)
        np.subtract(self.m, a, out=self.m)
        if self.config["nesterov"]:
            np.multiply(self.m, mu, out=b)
            np.subtract(b, a, out=b)
            np.add(w, b, out=w)
        else:
            np.add(w, self.m, out=w)


class AdamFormula(UpdateFormula):
    """`m += (g − m)(1 − β1); v += (g² − v)(1 − β2); w −= m·α / (√v + ε)`,
    `α = lr·√(1 − β2^t) / (1 − β1^t)`: ε outside the bias correction. AMSGrad divides by
    `√max(v̂_prev, v)` instead of `√v`."""

    name = "Adam"
    defaults = {"beta_1": 0.9, "beta_2": 0.999, "epsilon": 1e-7, "amsgrad": False}
    momentum_key = "beta_1"

    def __init__(self, config: dict[str, Any], size: int, scratch: Scratch):
        super().__init__(config, size, scratch)
        self.m = self._slot("momentum", size)
        self.v = self._slot("velocity", size)
        if config["amsgrad"]:
            self.v_hat = self._slot("velocity_hat", size)

    def apply(self, w: np.ndarray, g: np.ndarray, lr: np.float32, step: int) -> None:
        c, a, b = self.config, self._a, self._b
        t = _F(step + 1)
        b1_power = np.power(_F(c["beta_1"]), t)
        b2_power = np.power(_F(c["beta_2"]), t)
        alpha = lr * np.sqrt(_F(1) - b2_power) / (_F(1) - b1_power)
        if not c["amsgrad"] and kernels.adam_step(w, g, self.m, self.v, alpha, _F(1 - c["beta_1"]),
                                                  _F(1 - c["beta_2"]), _F(c["epsilon"])):
            return
        _ema_into(self.m, g, _F(1 - c["beta_1"]), a)
        np.multiply(g, g, out=b)
        _ema_into(self.v, b, _F(1 - c["beta_2"]), a)
        v = self.v
        if c["amsgrad"]:
            np.maximum(self.v_hat, self.v, out=self.v_hat)
            v = self.v_hat
        np.multiply(self.m, alpha, out=a)
        np.sqrt(v, out=b)
        np.add(b, _F(c["epsilon"]), out=b)
        np.divide(a, b, out=a)
        np.subtract(w, a, out=w)


class RMSpropFormula(UpdateFormula):
    """`v = ρv + (1 − ρ)g²`; centered: `ḡ = ρḡ + (1 − ρ)g`, denominator `v − ḡ² + ε`, else
    `v + ε`; `inc = lr·g / √denominator`; momentum μ > 0: `m = μm + inc; w −= m`,
    else `w −= inc`."""

    name = "RMSprop"
    defaults = {"rho": 0.9, "momentum": 0.0, "epsilon": 1e-7, "centered": False}
    momentum_key = "momentum"

    def __init__(self, config: dict[str, Any], size: int, scratch: Scratch):
        super().__init__(config, size, scratch)
        self.v = self._slot("velocity", size)
        self.has_momentum = config["momentum"] > 0  # the cell's (see SGDFormula)
        if self.has_momentum:
            self.m = self._slot("momentum", size)
        if config["centered"]:
            self.avg = self._slot("average_gradient", size)

    def apply(self, w: np.ndarray, g: np.ndarray, lr: np.float32, step: int) -> None:
        c, a, b = self.config, self._a, self._b
        rho, one_minus_rho = _F(c["rho"]), _F(1 - c["rho"])
        np.multiply(g, g, out=a)
        np.multiply(a, one_minus_rho, out=a)
        np.multiply(self.v, rho, out=self.v)
        np.add(self.v, a, out=self.v)
        if c["centered"]:
            np.multiply(g, one_minus_rho, out=a)
            np.multiply(self.avg, rho, out=self.avg)
            np.add(self.avg, a, out=self.avg)
            np.multiply(self.avg, self.avg, out=b)
            np.subtract(self.v, b, out=a)
            np.add(a, _F(c["epsilon"]), out=a)
        else:
            np.add(self.v, _F(c["epsilon"]), out=a)
        np.sqrt(a, out=a)
        np.multiply(g, lr, out=b)
        np.divide(b, a, out=b)
        if self.has_momentum:
            np.multiply(self.m, _F(c["momentum"]), out=self.m)
            np.add(self.m, b, out=self.m)
            np.subtract(w, self.m, out=w)
        else:
            np.subtract(w, b, out=w)


class AdagradFormula(UpdateFormula):
    """`acc += g²; w −= lr·g / √(acc + ε)`, the accumulator starting at
    `initial_accumulator_value` (0.1 by default), not 0."""

    name = "Adagrad"
    defaults = {"initial_accumulator_value": 0.1, "epsilon": 1e-7}

    def __init__(self, config: dict[str, Any], size: int, scratch: Scratch):
        super().__init__(config, size, scratch)
        initial = float(_F(config["initial_accumulator_value"]))
        self.acc = self._slot("accumulator", size, fill=initial)

    def apply(self, w: np.ndarray, g: np.ndarray, lr: np.float32, step: int) -> None:
        a, b = self._a, self._b
        np.multiply(g, g, out=a)
        np.add(self.acc, a, out=self.acc)
        np.add(self.acc, _F(self.config["epsilon"]), out=a)
        np.sqrt(a, out=a)
        np.multiply(g, lr, out=b)
        np.divide(b, a, out=b)
        np.subtract(w, b, out=w)


class AdamaxFormula(UpdateFormula):
    """`m += (g − m)(1 − β1); u = max(β2·u, |g|); w −= lr·m / ((1 − β1^t)(u + ε))`."""

    name = "Adamax"
    defaults = {"beta_1": 0.9, "beta_2": 0.999, "epsilon": 1e-7}
    momentum_key = "beta_1"

    def __init__(self, config: dict[str, Any], size: int, scratch: Scratch):
        super().__init__(config, size, scratch)
        self.m = self._slot("momentum", size)
        self.u = self._slot("norm", size)

    def apply(self, w: np.ndarray, g: np.ndarray, lr: np.float32, step: int) -> None:
        c, a, b = self.config, self._a, self._b
        b1_power = np.power(_F(c["beta_1"]), _F(step + 1))
        _ema_into(self.m, g, _F(1 - c["beta_1"]), a)
        np.multiply(self.u, _F(c["beta_2"]), out=self.u)
        np.abs(g, out=a)
        np.maximum(self.u, a, out=self.u)
        np.add(self.u, _F(c["epsilon"]), out=a)
        np.multiply(a, _F(1) - b1_power, out=a)
        np.multiply(self.m, lr, out=b)
        np.divide(b, a, out=b)
        np.subtract(w, b, out=w)


class NadamFormula(UpdateFormula):
    """Adam with Nesterov momentum and Keras's momentum schedule `u_t = β1(1 − ½·0.96^t)`:
    `u_product` (a float32 scalar slot) is multiplied by `u_t` once per update, before the
    variables move; `m̂ = u_{t+1}·m / (1 − u_product·u_{t+1}) + (1 − u_t)·g / (1 − u_product)`,
    `v̂ = v / (1 − β2^t)`, `w −= m̂·lr / (√v̂ + ε)`."""

    name = "Nadam"
    defaults = {"beta_1": 0.9, "beta_2": 0.999, "epsilon": 1e-7}
    momentum_key = "beta_1"

    def __init__(self, config: dict[str, Any], size: int, scratch: Scratch):
        super().__init__(config, size, scratch)
        self.m = self._slot("momentum", size)
        self.v = self._slot("velocity", size)
        self.scalars["u_product"] = 1.0

    def apply(self, w: np.ndarray, g: np.ndarray, lr: np.float32, step: int) -> None:
        c, a, b = self.config, self._a, self._b
        beta_1, beta_2, decay = _F(c["beta_1"]), _F(c["beta_2"]), _F(0.96)
        t, t_next = _F(step + 1), _F(step + 2)
        # Nadam._backend_update_step: the product advances before any variable moves
        u_product = _F(self.scalars["u_product"]) * beta_1 * (_F(1) - _F(0.5) * np.power(decay, t))
        self.scalars["u_product"] = float(u_product)
        u_t = beta_1 * (_F(1) - _F(0.5) * np.power(decay, t))
        u_t_1 = beta_1 * (_F(1) - _F(0.5) * np.power(decay, t_next))
        u_product_t_1 = u_product * u_t_1
        b2_power = np.power(beta_2, t)
        _ema_into(self.m, g, _F(1) - beta_1, a)
        np.multiply(g, g, out=b)
        _ema_into(self.v, b, _F(1) - beta_2, a)
        np.multiply(self.m, u_t_1, out=a)  # m̂ into a
        np.divide(a, _F(1) - u_product_t_1, out=a)
        np.multiply(g, _F(1) - u_t, out=b)
        np.divide(b, _F(1) - u_product, out=b)
        np.add(a, b, out=a)
        np.divide(self.v, _F(1) - b2_power, out=b)  # v̂ into b
        np.sqrt(b, out=b)
        np.add(b, _F(c["epsilon"]), out=b)
        np.multiply(a, lr, out=a)
        np.divide(a, b, out=a)
        np.subtract(w, a, out=w)


def _ema_into(slot: np.ndarray, x: np.ndarray, weight: np.float32, scratch: np.ndarray) -> None:
    """Keras's `slot += (x − slot)·weight`, in place (`scratch` may not alias `x`)."""
    np.subtract(x, slot, out=scratch)
    np.multiply(scratch, weight, out=scratch)
    np.add(slot, scratch, out=slot)


# AdamW is Adam's formula; its weight decay (default 0.004) is applied by HubOptimizer.
FORMULAS: dict[str, type[UpdateFormula]] = {
    "SGD": SGDFormula,
    "Adam": AdamFormula,
    "AdamW": AdamFormula,
    "RMSprop": RMSpropFormula,
    "Adagrad": AdagradFormula,
    "Adamax": AdamaxFormula,
    "Nadam": NadamFormula,
}
