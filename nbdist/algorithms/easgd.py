"""Elastic averaging SGD (Zhang, Choromanska, LeCun, NeurIPS 2015), asynchronous form.

Each worker trains its own `x_i` and every τ local steps exchanges with the hub's center
`x̃`: `e = α (x_i − x̃)`, `x_i -= e`, `x̃ += e`. The elastic force pulls both towards each
other and conserves `x_i + x̃`. As in the paper's asynchronous algorithm, the worker reads
`x̃`, computes `e` itself (`elastic_exchange`) and pushes `e`; the hub's `easgd` rule only adds it.

Default α = β / M with β = 0.9, the paper's choice (`easgd_alpha`). The communication period
τ is the worker's `--local-steps`.
"""

from __future__ import annotations

import numpy as np

from nbdist.algorithms.base import Option, Rule


def easgd_alpha(num_workers: int, beta: float = 0.9) -> float:
    """α = β / M (the paper keeps the total elastic force β = Mα fixed at 0.9)."""
    return beta / num_workers


def elastic_exchange(x_local: np.ndarray, x_center: np.ndarray, alpha: float,
                     out: np.ndarray | None = None) -> np.ndarray:
    """`e = α (x_local − x_center)`; `x_local -= e`; `x_center += e`, in place; returns e.

    Example:
        >>> x, c = np.array([1, 2], np.float32), np.zeros(2, np.float32)
        >>> elastic_exchange(x, c, 0.5).tolist(), x.tolist(), c.tolist()
        ([0.5, 1.0], [0.5, 1.0], [0.5, 1.0])
    """
    e = np.empty_like(x_local) if out is None else out
    np.subtract(x_local, x_center, out=e)
    np.multiply(e, np.asarray(alpha, dtype=e.dtype), out=e)
    np.subtract(x_local, e, out=x_local)
    np.add(x_center, e, out=x_center)
    return e


class EASGD(Rule):
    """`easgd` on the hub: a push carries the elastic difference `e`; apply `x̃ += e`.

    `lr` and `delay` are ignored: the elastic step has its own rate α, which workers read
    from `options["alpha"]`. τ = 0 does not make this an SGD step: a push is not a gradient.
    """

    name = "easgd"
    predicts_weights = False  # a push is an elastic difference, not a gradient
    corrects_momentum = False  # the workers step with the cell's optimizer
    compensates_delay = False
    takes_local_steps = True
    workers_step = True  # each worker steps with the cell's optimizer between exchanges

    @classmethod
    def default_options(cls, num_workers: int) -> dict[str, Option]:
        return {"alpha": easgd_alpha(num_workers)}

    def _bounds(self, name: str) -> tuple[float, float]:
        return 0.0, 1.0

    def on_push(self, worker: int, w: np.ndarray, g: np.ndarray, lr: float, delay: int) -> bool:
        np.add(w, g, out=w)
        return True

    def gradient(self, worker: int, w: np.ndarray, g: np.ndarray, delay: int,
                 scale: float) -> tuple[np.ndarray, float] | None:
        raise TypeError("easgd pushes an elastic difference, not a gradient: the hub applies it "
                        "with no optimizer (the cell's optimizer runs on the workers)")
