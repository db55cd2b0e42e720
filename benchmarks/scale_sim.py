"""Scaling past this machine's cores: virtual workers against the measured cost of a hub shard.

What it measures
    On a 2-core machine, more than two real workers only share the same cores. This benchmark
    measures the two costs that decide scaling, in this run, and then plays 1..64 virtual
    workers against them on a virtual clock:
      compute c   one worker step of the 784-256-256-10 MLP at --batch, the compiled
                  `FlatModel.assign_and_gradients_at` call the worker makes (median, this process);
      hub h       the busiest hub shard's own CPU time per push, measured with one NumPy worker
                  against a real hub process (benchmarks/hub_throughput.py's cell) over shared
                  memory ("auto") and TCP, for 1, 2 and 4 shards;
      round trip  that cell's time per round trip with one worker (r = 1 / push/s): r - h is
                  the part of a round trip that does not occupy the shard (the worker's side,
                  the transport).
    Virtual workers each loop: compute for c, then a round trip; a shard serves one push at a
    time for h (first come, first served; a push goes to every shard in parallel and the
    worker waits for the last reply). Events are played in (time, worker) order, as
    `nbdist.core.simclock.EventQueue` orders them in --mode simulate.

How to read it
    samples/s = pushes/s x batch. The hub is the bottleneck from about n* = (c + r) / h
    workers on: past it, throughput stays at shards / h pushes/s whatever the number of
    workers; "hub busy" is the busiest shard's utilisation.

    python benchmarks/scale_sim.py                # batch 64, transports auto and tcp
    python benchmarks/scale_sim.py --batch 256 --size 1000000
"""

from __future__ import annotations

import argparse
import heapq
import os
import time

import _common  # noqa: F401 - quiet TensorFlow, sys.path for a checkout
import numpy as np
from _common import median, table

WORKERS = [1, 2, 4, 8, 16, 32, 64]


def compute_s(batch: int) -> tuple[float, int]:
    """The worker's compiled step at `batch` on the overhead benchmark's MLP; (seconds, params)."""
    from overhead import MODEL_CODE

    from nbdist.engine.flat_layout import read_flat
    from nbdist.engine.flatmodel import FlatModel
    from nbdist.engine.keras_backend import configure_tensorflow

    configure_tensorflow(max(1, (os.cpu_count() or 1)), 0)
    ns: dict = {}
    exec(compile(MODEL_CODE, "<cell>", "exec"), ns)  # noqa: S102 - our own code
    flat = FlatModel(ns["model"])
    flat.hold(ns["x_train"], ns["y_train"])
    params, nt = read_flat(ns["model"])
    rng = np.random.default_rng(0)
    idx = [rng.choice(len(ns["x_train"]), batch, replace=False) for _ in range(8)]
    for i in range(10):
        flat.assign_and_gradients_at(params, nt, idx[i % 8])
    times = []
    for i in range(60):
        t0 = time.perf_counter()
        flat.assign_and_gradients_at(params, nt, idx[i % 8])
        times.append(time.perf_counter() - t0)
    return float(np.median(times)), int(params.size)


def simulate(n: int, shards: int, c: float, h: float, r: float,
             horizon: float = 2.0) -> tuple[float, float]:
    """(pushes/s, busiest shard's utilisation) of `n` workers over `horizon` virtual seconds."""
    latency = max(0.0, r - h)
    free = [0.0] * shards  # when each shard finishes its queue
    busy = [0.0] * shards
    events = [(c, w) for w in range(n)]  # (time a push leaves the worker, worker)
    heapq.heapify(events)
    pushes = 0
    while events:
        t, w = heapq.heappop(events)
        if t > horizon:
            break
        done = 0.0
        for s in range(shards):  # each shard serves in arrival order
            start = max(t + latency / 2, free[s])
            free[s] = start + h
            busy[s] += h
            done = max(done, free[s])
        pushes += 1
        heapq.heappush(events, (done + latency / 2 + c, w))
    return pushes / horizon, max(busy) / horizon


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--size", type=int, default=None,
                        help="float32 parameters (default: the MLP's)")
    parser.add_argument("--shards", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--transport", choices=["auto", "tcp", "both"], default="both")
    parser.add_argument("--seconds", type=float, default=1.5, help="per hub measurement")
    args = parser.parse_args()
    transports = ["auto", "tcp"] if args.transport == "both" else [args.transport]
    t_start = time.monotonic()
    c, params = compute_s(args.batch)
    size = args.size or params
    import hub_throughput  # after TensorFlow: its cells fork NumPy-only children

    costs = {}
    for t in transports:
        for s in args.shards:
            cell = hub_throughput.nbdist_cell(size, s, 1, t, args.seconds)
            costs[(t, s)] = (cell["hub_cpu_ms"] / 1e3, 1.0 / cell["rate"])
    print(f"scale: {size:,} parameters, batch {args.batch}; worker compute c = {c * 1e3:.2f} ms "
          f"(measured); load {os.getloadavg()[0]:.2f}")
    print(table(["transport", "shards", "hub CPU ms/push (h)", "1-worker round trip ms (r)",
                 "hub-bound from workers (c + r) / h"],
                [[t, s, h * 1e3, r * 1e3, (c + r) / h] for (t, s), (h, r) in costs.items()]))
    rows = []
    for (t, s), (h, r) in costs.items():
        for n in WORKERS:
            rate, busy = simulate(n, s, c, h, r)
            rows.append([t, s, n, rate * args.batch, busy, "hub" if busy > 0.9 else "workers"])
    print()
    print(table(["transport", "shards", "workers", "samples/s", "hub busy", "bound by"], rows))
    best = {k: max(r[3] for r in rows if (r[0], r[1]) == k) for k in costs}
    print("\nceiling samples/s per (transport, shards): "
          + ", ".join(f"{t}/{s}: {v:,.0f}" for (t, s), v in best.items())
          + f"; median h {median([h for h, _ in costs.values()]) * 1e3:.3f} ms; "
          f"total {time.monotonic() - t_start:.0f}s")


if __name__ == "__main__":
    main()
