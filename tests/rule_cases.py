"""Shared cases for the update-rule tests: exact float32 vectors, a stale push, and random
push schedules applied as the hub would."""

from __future__ import annotations

import numpy as np


def f32(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float32)


def stale_push(rule, lr: float = 0.5) -> np.ndarray:
    """Worker 0 reads w = [1, 2]; worker 1 reads it too and pushes [1, 1] (w -> [0.5, 1.5]);
    then worker 0 pushes g = [0.5, -1] computed at [1, 2], one version late."""
    w = f32(1, 2)
    rule.on_pull(0, w, 0)
    rule.on_pull(1, w, 0)
    assert rule.on_push(1, w, f32(1, 1), lr, 0)
    rule.on_pull(1, w, 1)
    assert rule.on_push(0, w, f32(0.5, -1), lr, 1)
    return w


def random_pushes(seed: int = 0, pushes: int = 12, size: int = 5, workers: int = 3):
    """A reproducible interleaving: (worker, gradient, lr) per push."""
    rng = np.random.default_rng(seed)
    return [(int(rng.integers(workers)), rng.standard_normal(size).astype(np.float32),
             float(rng.uniform(0.01, 0.5))) for _ in range(pushes)]


def run(rule, schedule, size: int = 5) -> np.ndarray:
    """Apply `schedule` as the hub would: each worker pulls right after its push."""
    w = np.linspace(-1, 1, size, dtype=np.float32)
    version, read = 0, {}
    for worker in {p[0] for p in schedule}:
        rule.on_pull(worker, w, version)
        read[worker] = version
    for worker, g, lr in schedule:
        if rule.on_push(worker, w, g, lr, version - read[worker]):
            version += 1
        rule.on_pull(worker, w, version)
        read[worker] = version
    return w


def half_step_rule(name: str):
    """A rule as a notebook writes it (`nbdist.Rule`): plain SGD at half the rate, so what the
    hub applies must equal asgd at lr / 2. Made in a function, as a notebook cell makes it: not
    importable by name, so it travels to a cluster's hub by value."""
    import nbdist

    class HalfStep(nbdist.Rule):
        def __init__(self, size, num_workers, **options):
            super().__init__(size, num_workers, **options)
            self.step = np.empty(size, np.float32)

        def on_push(self, worker, w, g, lr, delay):
            np.multiply(g, 0.5 * lr, out=self.step)
            w -= self.step
            return True

    HalfStep.name = name
    return HalfStep
