"""`group`: synchronous inside groups of similar speed, asynchronous between groups.

Workers of similar throughput wait little for each other, so they average their gradients
for the same step (sync) and the group pushes that mean as one asynchronous push with the
group's rate `η_g = η · B_g / B_ref` (seed 003, cluster packet synchronization). This module
holds the pure parts; the hub runs the per-group barrier and applies the mean through a plain
SGD step (the `group` rule is ASGD plus the grouping options).

- `form_groups`: 1-D clustering of log throughput. By default, greedily from the slowest, a
  group takes the next-faster worker while fastest/slowest ≤ max_ratio; for intervals on a
  line this greedy gives the fewest groups. With `num_groups`, an exact dynamic programme over
  contiguous splits of the sorted speeds minimises the largest in-group log-range.
- `group_lr`: the linear-scaling rate of a group's push. B_ref is the batch the learning rate
  was set for (the cell's per-worker batch), so a singleton group keeps η and the rule reduces
  to ASGD.
- `mean_into`: the group's mean gradient, in place.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from nbdist.algorithms.base import Option
from nbdist.algorithms.sgd import ASGD
from nbdist.core.partition import min_max_cuts

MAX_RATIO = 1.5  # the fastest worker of a group at most this many times the slowest's speed
_TOL = 1e-12  # speeds exactly max_ratio apart still share a group despite float rounding


def form_groups(rates: Sequence[float], max_ratio: float = MAX_RATIO,
                num_groups: int | None = None) -> list[list[int]]:
    """Worker indices grouped by speed, slowest group first, indices ascending in a group.

    Example:
        >>> form_groups([1, 1, 2, 2, 4])
        [[0, 1], [2, 3], [4]]
    """
    if any(not (math.isfinite(r) and r > 0) for r in rates):
        raise ValueError(f"Worker rates must be positive and finite. Received: {list(rates)}.")
    if not max_ratio >= 1:
        raise ValueError(f"max_ratio must be >= 1. Received: {max_ratio}.")
    order = sorted(range(len(rates)), key=lambda i: (rates[i], i))
    logs = [math.log(rates[i]) for i in order]
    if num_groups is None:
        cuts, start = [], 0
        for j in range(1, len(order)):
            if logs[j] - logs[start] > math.log(max_ratio) + _TOL:
                cuts.append(j)
                start = j
    else:
        if not 1 <= num_groups <= max(1, len(order)):
            raise ValueError(f"num_groups must be between 1 and the number of workers "
                             f"({len(order)}). Received: {num_groups}.")
        cuts = _min_range_cuts(logs, num_groups)
    bounds = [0, *cuts, len(order)]
    return [sorted(order[a:b]) for a, b in zip(bounds, bounds[1:], strict=False) if b > a]


def _min_range_cuts(logs: list[float], k: int) -> list[int]:
    """Start indices of groups 2..k splitting sorted `logs` into k runs with the least max range."""
    n = len(logs)
    if n == 0:
        return []
    return min_max_cuts(n, k, lambda i, j: logs[j - 1] - logs[i])


def group_lr(lr: float, group_batch: int, ref_batch: int) -> float:
    """`η_g = η · B_g / B_ref`: a group of B_g samples per step scales the rate linearly."""
    if group_batch <= 0 or ref_batch <= 0:
        raise ValueError(f"Batch sizes must be positive. Received: group_batch={group_batch}, "
                         f"ref_batch={ref_batch}.")
    return lr * (group_batch / ref_batch)  # B_g = B_ref gives exactly lr


def mean_into(out: np.ndarray, grads: Sequence[np.ndarray]) -> np.ndarray:
    """`out = mean(grads)` in place, without temporaries (`out` may be one of `grads`)."""
    if not grads:
        raise ValueError("mean_into needs at least one gradient.")
    first, *rest = grads
    if first is not out:
        np.copyto(out, first)
    for g in rest:
        if g is out:
            raise ValueError("`out` may only alias the first gradient.")
        np.add(out, g, out=out)
    if rest:
        np.divide(out, np.float32(len(grads)), out=out)
    return out


class Group(ASGD):
    """`group`: each push is a group's mean gradient, applied at the group's rate.

    Options: `max_ratio` (MAX_RATIO) for `form_groups`, `num_groups` (0 = as many as max_ratio
    needs).
    The rule declares and validates them; the run's `Coordinator` forms the groups with them
    (and follows live changes), since it owns group membership."""

    name = "group"
    predicts_weights = False  # a push is a group's mean, applied once the group has pushed
    corrects_momentum = False  # a group's mean is one step
    compensates_delay = False
    takes_local_steps = False
    workers_step = False
    syncs_groups = True

    @classmethod
    def default_options(cls, num_workers: int) -> dict[str, Option]:
        return {"max_ratio": MAX_RATIO, "num_groups": 0}

    def _bounds(self, name: str) -> tuple[float, float]:
        return (1.0, math.inf) if name == "max_ratio" else (0, self.num_workers)



class DiLoCo(Group):
    """`diloco` (Douillard et al. 2023, "DiLoCo: Distributed Low-Communication Training of
    Language Models"): each worker takes H inner steps with the cell's optimizer from the
    weights it pulled and pushes its delta; the hub waits for every worker's delta (one group
    of everyone), and its outer optimizer (Nesterov momentum 0.9 at rate 0.7:
    `--server-optimizer nesterov`) steps on their mean. nbdist.config sets H (500) and the
    outer optimizer where the run leaves them."""

    name = "diloco"
    predicts_weights = False  # a push is H steps' delta
    corrects_momentum = False  # the outer momentum is the recipe's own
    compensates_delay = False
    takes_local_steps = True
    workers_step = False
    syncs_groups = True

    @classmethod
    def default_options(cls, num_workers: int) -> dict[str, Option]:
        return {"num_groups": 1}  # every worker in one synchronous round

    def _bounds(self, name: str) -> tuple[float, float]:
        return 1, 1
