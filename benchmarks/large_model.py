"""A large model: plain `model.fit` against nbdist async with 2 workers, and where the time goes.

What it measures
    A 784-4096-4096-10 MLP (relu, softmax, SGD 0.01; 20.0M parameters, 80 MB of float32) on
    the first 6,000 Fashion-MNIST images, batch 64, 1 epoch (94 steps), trained:
      model.fit      in a child process with the whole machine's TensorFlow threads;
      nbdist async   `nbdist.train(cell, cluster=Cluster.start(3), workers=2)`: one hub engine,
                     two worker engines on the same cores, transport "auto" (shared memory)
                     and "tcp", start-up included (as a notebook user sees it) and also over the
                     steps alone (the workers' summed samples/s between the first and last push).
    Then the parts of one nbdist step, each timed alone in this run, to show where the time
    goes: the worker's compiled assign+gradients call (in the fit child), the hub's update and
    copy-out of 20M floats (one pass and split across threads, `nbdist.hub.threads`; with the
    compiled kernel and with the NumPy fallback, `benchmarks/update_kernel.py`), a memcpy
    of the same 80 MB, and nbdist's MAC over 80 MB (what TCP signs and verifies, 4 passes per
    round trip).

How to read it
    ratio = nbdist samples/s / model.fit samples/s (both on this machine's cores). With two
    workers on two cores each worker computes at about half of fit's speed, so the ceiling is
    about 1.0; what is left below it is the per-step cost the profile rows list.

    python benchmarks/large_model.py               # 1 repeat (a run is ~1 min on 2 cores)
    python benchmarks/large_model.py --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import _common  # noqa: F401 - quiet TensorFlow, sys.path for a checkout
import numpy as np
from _common import median, table

N, BATCH, WIDTH = 6000, 64, 4096
CELL = f'''
import keras
from nbdist.datasets import load_fashion_mnist
(x_train, y_train), _ = load_fashion_mnist()
x_train = x_train[:{N}].reshape(-1, 784).astype("float32") / 255.0
y_train = y_train[:{N}]
model = keras.Sequential([keras.Input((784,)), keras.layers.Dense({WIDTH}, activation="relu"),
                          keras.layers.Dense({WIDTH}, activation="relu"),
                          keras.layers.Dense(10, activation="softmax")])
model.compile(optimizer=keras.optimizers.SGD(0.01), loss="sparse_categorical_crossentropy")
'''
RESULT = "@@result "


def fit_child() -> None:
    """Child: model.fit once for tracing, once timed; then the worker's call alone."""
    import keras

    from nbdist.engine.flat_layout import read_flat
    from nbdist.engine.flatmodel import FlatModel

    ns: dict = {}
    exec(compile(CELL, "<cell>", "exec"), ns)  # noqa: S102 - our own code
    model, x, y = ns["model"], ns["x_train"], ns["y_train"]
    model.fit(x[:BATCH * 5], y[:BATCH * 5], batch_size=BATCH, epochs=1, verbose=0)
    stamps: list[float] = []

    class Stamp(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            stamps.append(time.perf_counter())

    t0 = time.perf_counter()
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, callbacks=[Stamp()])
    wall = time.perf_counter() - t0
    flat = FlatModel(model)
    params, nt = read_flat(model)
    idx = np.arange(BATCH)
    for _ in range(3):
        flat.assign_and_gradients(params, nt, x[idx], y[idx])
    t0 = time.perf_counter()
    for _ in range(10):
        flat.assign_and_gradients(params, nt, x[idx], y[idx])
    ag = (time.perf_counter() - t0) / 10
    steady = (len(stamps) - 11) * BATCH / (stamps[-1] - stamps[10])
    print(RESULT + json.dumps({"rate": N / wall, "steady": steady, "step_s": BATCH / steady,
                               "assign_grad_s": ag, "params": int(params.size)}), flush=True)


def measure_fit() -> dict:
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--fit-child"],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(next(line for line in out.splitlines()
                           if line.startswith(RESULT))[len(RESULT):])


def measure_nbdist(cluster, transport: str) -> dict:
    import nbdist

    t0 = time.monotonic()
    run = nbdist.train(CELL, cluster=cluster, namespace={}, workers=2, servers=1, epochs=1,
                       batch_size=BATCH, transport=transport, no_validation=True, timeout=300)
    with run:
        run.wait()
    wall = time.monotonic() - t0
    nodes = run.nodes
    hist = run.history.dropna(subset=["time"])
    steps = int(nodes["steps"].sum())
    span = float(hist["time"].max() - hist["time"].min())
    return {"rate": N / wall, "steady": (steps - 1) * BATCH / span if span > 0 else float("nan"),
            "compute_ms": 1e3 * float(nodes["compute_s"].sum()) / steps,
            "comm_ms": 1e3 * float(nodes["comm_s"].sum()) / steps,
            "step_ms": 1e3 * 2 * span / max(1, steps - 1), "wall_s": wall}


def _best_ms(fn, repeats: int = 7) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def hub_parts(size: int) -> dict:
    """The hub's share of a step at this size, timed alone here: the update with the kernel in
    use (`nbdist.algorithms.kernels.IMPLEMENTATION`) and with the NumPy fallback."""
    from update_kernel import numpy_kernels

    from nbdist.algorithms import kernels
    from nbdist.core.coordinator import Plan
    from nbdist.core.updater import make_updater
    from nbdist.hub.protocol import mac, new_key
    from nbdist.hub.threads import BlockPool, update_threads

    w, g, out = (np.ones(size, np.float32) for _ in range(3))
    plan = Plan(num_workers=2, num_samples=N, epochs=1, batch_size=BATCH, lr=0.01,
                has_validation=False, algorithm="asgd")
    threads = max(2, update_threads())
    pools = [BlockPool(threads), BlockPool(threads)]
    one, split = make_updater(plan, {}, None, size), make_updater(plan, {}, None, size)
    split.use_blocks(pools[0], threads)
    with numpy_kernels():
        numpy_one, numpy_split = (make_updater(plan, {}, None, size),
                                  make_updater(plan, {}, None, size))
        numpy_split.use_blocks(pools[1], threads)

    def numpy_push(updater) -> None:
        with numpy_kernels():
            updater.push(0, w, g, 0, into=out)

    key = new_key()
    try:
        return {"memcpy": _best_ms(lambda: np.copyto(out, w)),
                f"update 1 thread ({kernels.IMPLEMENTATION})":
                    _best_ms(lambda: one.push(0, w, g, 0, into=out)),
                f"update {threads} threads ({kernels.IMPLEMENTATION})":
                    _best_ms(lambda: split.push(0, w, g, 0, into=out)),
                "update 1 thread (numpy)": _best_ms(lambda: numpy_push(numpy_one)),
                f"update {threads} threads (numpy)": _best_ms(lambda: numpy_push(numpy_split)),
                "MAC x4 (tcp)": 4 * _best_ms(lambda: mac(key, b"header", [g]))}
    finally:
        for pool in pools:
            pool.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--transport", choices=["auto", "tcp", "both"], default="both")
    parser.add_argument("--fit-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.fit_child:
        fit_child()
        return
    import nbdist

    transports = ["auto", "tcp"] if args.transport == "both" else [args.transport]
    print(f"large model: 784-{WIDTH}-{WIDTH}-10 MLP, {N:,} images, batch {BATCH}, 1 epoch; "
          f"nbdist async with 2 workers, transports {transports}, {args.repeats} repeat(s)",
          flush=True)
    t_start = time.monotonic()
    fits, runs = [], {t: [] for t in transports}
    cluster = nbdist.Cluster.start(3)
    try:
        for rep in range(args.repeats):
            fits.append(measure_fit())
            print(f"  [{rep + 1}] model.fit {fits[-1]['rate']:,.0f} samples/s", flush=True)
            for t in transports:
                runs[t].append(measure_nbdist(cluster, t))
                print(f"  [{rep + 1}] nbdist {t} {runs[t][-1]['rate']:,.0f} samples/s", flush=True)
    finally:
        cluster.stop()
    fit_rate, fit_steady = median([f["rate"] for f in fits]), median([f["steady"] for f in fits])
    rows = [["model.fit", fit_rate, 1.0, fit_steady, 1.0, BATCH / fit_steady * 1e3, float("nan"),
             float("nan")]]
    for t in transports:
        rs = runs[t]
        rate, steady = median([r["rate"] for r in rs]), median([r["steady"] for r in rs])
        rows.append([f"nbdist {t}" + (" (shm)" if t == "auto" else ""), rate, rate / fit_rate,
                     steady, steady / fit_steady, median([r["step_ms"] for r in rs]),
                     median([r["compute_ms"] for r in rs]), median([r["comm_ms"] for r in rs])])
    print()
    print(table(["side", "samples/s (with start-up)", "ratio", "samples/s (steps)", "ratio",
                 "step ms (per worker)", "compute ms", "comm ms"], rows))
    size = int(fits[0]["params"])
    parts = hub_parts(size)
    print(f"\nWhere a step goes ({size:,} parameters, {4 * size / 1e6:.0f} MB; least "
          "of 7, this process):")
    prow = [["fit step (fit child)", 1e3 * median([f["step_s"] for f in fits])],
            ["worker assign+gradients alone (fit child)",
             1e3 * median([f["assign_grad_s"] for f in fits])],
            *([k, v] for k, v in parts.items())]
    print(table(["part", "ms"], prow))
    print(f"\nload: {os.getloadavg()[0]:.2f} (1 min); total {time.monotonic() - t_start:.0f}s")


if __name__ == "__main__":
    main()
