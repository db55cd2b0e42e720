"""What Keras's weight constraints cost the hub per push: with and without MaxNorm on every kernel.

What it measures
    One push on a hub shard holding a ~1M-parameter MLP (784-1024-256-10, 1,068,810 floats),
    as the hub runs it (`Updater.push(..., into=reply)`: the update, the constraints, the copy
    of the new weights into the worker's reply), in this one process, with:
      none      no constraint: the update and the reply copy as before;
      MaxNorm   `MaxNorm(2.0)` on the three kernels (1,065,472 of the floats): after the update,
                each kernel's column norms, its rescaling, and the kernel copied into the
                reply again;
    for plain SGD (the rule's fused pass: update and reply copy in one) and for Adam (the hub's
    optimizer, then the reply copy). `constraints alone` times `ShardConstraints.apply` with
    the reply refresh, on its own.

How to read it
    Each time is the least of `--repeats` rounds of 5 calls, the variants interleaved within a
    round, so a busy moment hits all of them. `x none` = the push with constraints / the same
    push without. One thread (`NBDIST_HUB_THREADS` does not apply: no pool here).

    python benchmarks/constraints_cost.py
    python benchmarks/constraints_cost.py --repeats 15 --constraint UnitNorm
"""

from __future__ import annotations

import argparse
import math
import os
import time

import _common  # noqa: F401 - sys.path for a checkout
import numpy as np
from _common import table

from nbdist.algorithms import kernels, make_rule
from nbdist.algorithms.constraints import ShardConstraints
from nbdist.algorithms.optimizers import server_optimizer_spec
from nbdist.core.updater import Updater

SHAPES = [(784, 1024), (1024,), (1024, 256), (256,), (256, 10), (10,)]  # kernels and biases
CONFIGS = {"MaxNorm": {"max_value": 2.0, "axis": 0}, "UnitNorm": {"axis": 0},
           "MinMaxNorm": {"min_value": 0.5, "max_value": 2.0, "rate": 1.0, "axis": 0}, "NonNeg": {}}


def kernel_constraints(name: str) -> list[dict]:
    """`name` on every kernel (the 2-D variables), as `describe_constraints` would give them."""
    entries, start = [], 0
    for i, shape in enumerate(SHAPES):
        if len(shape) == 2:
            entries.append({"variable": f"dense_{i // 2}/kernel", "start": start,
                            "shape": list(shape), "class_name": name, "config": CONFIGS[name],
                            "epsilon": 1e-7})
        start += math.prod(shape)
    return entries


def measure(repeats: int, name: str) -> list[list[object]]:
    size = sum(math.prod(s) for s in SHAPES)
    rng = np.random.default_rng(0)
    w = (rng.normal(size=size) * 0.1).astype(np.float32)  # column norms ~2.8: MaxNorm(2) bites
    g = (rng.normal(size=size) * 1e-3).astype(np.float32)
    reply = np.empty(size, np.float32)
    entries = kernel_constraints(name)
    segments = [math.prod(s) for s in SHAPES]
    variants = {}
    for optimizer in ("sgd", "adam"):
        spec = server_optimizer_spec(optimizer, 1e-3, segments)
        for label, cons in (("none", ()), (name, entries)):
            up = Updater(make_rule("asgd", size, 2), spec, constraints=cons)
            variants[(optimizer, label)] = lambda u=up: u.push(0, w, g, 0, into=reply)
    alone = ShardConstraints(entries, 0, size)
    variants[("-", "constraints alone")] = lambda: alone.apply(w, reply)
    best = dict.fromkeys(variants, float("inf"))
    for _ in range(repeats):
        for key, fn in variants.items():
            fn()  # warm
            for _ in range(5):
                t0 = time.perf_counter()
                fn()
                best[key] = min(best[key], time.perf_counter() - t0)
    rows = []
    for (optimizer, label), t in best.items():
        base = best.get((optimizer, "none"), float("nan"))
        rows.append([optimizer, label, 1e3 * t, t / base if label != "none" else 1.0])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--constraint", choices=sorted(CONFIGS), default="MaxNorm",
                        help="the constraint put on every kernel")
    args = parser.parse_args()
    size = sum(math.prod(s) for s in SHAPES)
    print(f"constraints on the hub: {size:,} floats, {args.constraint} on every kernel; update "
          f"kernel: {kernels.IMPLEMENTATION}; {args.repeats} rounds of 5 calls; load "
          f"{os.getloadavg()[0]:.2f} (1 min)",
          flush=True)
    rows = measure(args.repeats, args.constraint)
    print()
    print(table(["optimizer", "constraints", "ms per push", "x none"], rows))
    print(f"\nload: {os.getloadavg()[0]:.2f} (1 min)")


if __name__ == "__main__":
    main()
