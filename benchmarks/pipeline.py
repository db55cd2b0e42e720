"""--mode pipeline: samples/s per partition method, 2 and 3 stages, against plain model.fit.

What it measures
    A CNN with very unequal layer costs (two heavy 3x3 convolutions on 32x32x3 images, then a
    large dense head: 512, 512, 10) on random data (`--samples`, default 1024; batch 64,
    `--micro-batches` 4), one epoch per run, on a local cluster of 3 engines
    (`nbdist.Cluster.start(3)`). For S = 2 and 3 and each `--partition` (optimal, greedy,
    uniform, random with seed 0), one pipeline run (GPipe), in this one process run:

      samples/s        samples of steps 2..last over the time between the first and last step's
                       report (run.history; the first step traces the stage functions);
      pred / meas      the slowest stage's predicted time per micro-batch (the profile and the
                       partition's cost model) and its measured one (run.partition: the stage's
                       forwards, backwards and optimizer step per step, over M), in ms;
      bubble / ideal   the measured idle share 1 - busy / (S x wall) over the run's steps
                       (run.pipeline) against (S - 1) / (M + S - 1).

    Baseline, same process run: `model.fit` of the same model (same initial weights, batch
    64, one epoch after a warm-up epoch) in this kernel, whose TensorFlow has the machine's
    threads, as the S stage engines share them (each gets cpu_count // S).

How to read it
    "x fit" = samples/s / fit's samples/s. The thesis's claim is greedy against random:
    "random/greedy time" = greedy's samples/s over random's (above 1: greedy trains faster).
    "greedy/optimal" = optimal's samples/s over greedy's: how far the greedy walk is from the
    best cut. Each run profiles the model again, so its "pred ms" carries that profile's
    noise; the last lines give all four cuts' predictions from one profile. On one host the
    stages share its cores, so the pipeline can only lose to fit here: it is a test of the
    partitions, not of model parallelism's speed-up.

    Stage links: `--transport auto` (default) sends activations and gradients between the
    stages (all on this host) through shared memory, `tcp` over loopback TCP, `both` runs
    every row with each, one after the other, and ends with shm's samples/s over tcp's.

    python benchmarks/pipeline.py             # S = 2, 3; four methods (~5 min)
    python benchmarks/pipeline.py --quick     # 512 samples, S = 2 only
    python benchmarks/pipeline.py --quick --transport both --methods optimal,uniform
"""

from __future__ import annotations

import argparse
import time

import _common  # noqa: F401 - sets TF_CPP_MIN_LOG_LEVEL and sys.path before nbdist loads
from _common import table

BATCH = 64
METHODS = ("optimal", "greedy", "uniform", "random")

CELL = '''
import keras
import numpy as np
keras.utils.set_random_seed(0)
rng = np.random.default_rng(0)
x_train = rng.normal(size=(SAMPLES, 32, 32, 3)).astype("float32")
y_train = rng.integers(0, 10, size=SAMPLES)
model = keras.Sequential([
    keras.Input((32, 32, 3)),
    keras.layers.Conv2D(48, 3, padding="same", activation="relu", name="conv1"),
    keras.layers.Conv2D(48, 3, padding="same", activation="relu", name="conv2"),
    keras.layers.MaxPooling2D(4, name="pool"),
    keras.layers.Flatten(name="flatten"),
    keras.layers.Dense(512, activation="relu", name="dense1"),
    keras.layers.Dense(512, activation="relu", name="dense2"),
    keras.layers.Dense(10, activation="softmax", name="head"),
])
model.compile(optimizer=keras.optimizers.SGD(0.01), loss="sparse_categorical_crossentropy",
              metrics=["accuracy"])
'''


def steady_rate(history) -> float:
    rows = history[history["loss"].notna()].sort_values("step")
    rows = rows[rows["step"] >= 2]
    span = rows["time"].iloc[-1] - rows["time"].iloc[0]
    return float(rows["batch_size"].iloc[1:].sum() / span) if span > 0 else float("nan")


def fit_rate(cell: str) -> float:
    ns: dict = {}
    exec(compile(cell, "<cell>", "exec"), ns)  # noqa: S102 - this benchmark's own cell
    model, x, y = ns["model"], ns["x_train"], ns["y_train"]
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)  # warm-up: traces the step
    t0 = time.perf_counter()
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    return len(x) / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=1024)
    parser.add_argument("--micro-batches", type=int, default=4)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--transport", choices=["auto", "tcp", "both"], default="auto",
                        help="stage links: shared memory on one host (auto), TCP, or each in turn")
    parser.add_argument("--methods", default=",".join(METHODS),
                        help="partition methods, comma-separated")
    args = parser.parse_args()
    methods = [m for m in args.methods.split(",") if m]
    transports = ("auto", "tcp") if args.transport == "both" else (args.transport,)
    samples = 512 if args.quick else args.samples
    stage_counts = (2,) if args.quick else (2, 3)
    cell = f"SAMPLES = {samples}\n" + CELL

    import nbdist

    cluster = nbdist.Cluster.start(3)
    try:
        rows, rates, predicted = [], {}, {}
        for stages in stage_counts:
            for method in methods:
                for transport in transports:
                    run = nbdist.train(cell, cluster=cluster, namespace={}, mode="pipeline",
                                       stages=stages, micro_batches=args.micro_batches,
                                       batch_size=BATCH, partition=method, no_validation=True,
                                       timeout=300, transport=transport)
                    run.wait(timeout=1800)
                    part, pipe = run.partition, run.pipeline
                    rate = steady_rate(run.history)
                    rates[stages, method, transport] = rate
                    # all four cuts, one profile
                    if method == methods[0] and transport == transports[0]:
                        predicted[stages] = {m: p.slowest * 1e3 for m, p in run.partitions.items()}
                    link = "shm" if any(m.get("shm") for m in pipe["messages"]) else "tcp"
                    rows.append([stages, method, link, " | ".join(part["layers"]), rate,
                                 part["predicted_s"].max() * 1e3, part["measured_s"].max() * 1e3,
                                 pipe["bubble"], pipe["ideal_bubble"]])
        fit = fit_rate(cell)
    finally:
        cluster.stop()
    for row in rows:
        row.insert(5, row[4] / fit)
    print(f"pipeline, {samples} samples, batch {BATCH}, {args.micro_batches} "
          "micro-batches, GPipe, one epoch")
    print(table(["S", "partition", "link", "stages", "samples/s", "x fit", "pred ms", "meas ms",
                 "bubble", "ideal"], rows))
    print(f"\nmodel.fit in this kernel: {fit:,.0f} samples/s")
    first = transports[0]
    for stages in stage_counts:
        line = f"S = {stages}: "
        if {"greedy", "random", "optimal"} <= set(methods):
            line += ("random/greedy time "
                     f"{rates[stages, 'greedy', first] / rates[stages, 'random', first]:.2f}, "
                     "greedy/optimal time "
                     f"{rates[stages, 'optimal', first] / rates[stages, 'greedy', first]:.2f}; ")
        print(line + "predicted slowest stage from one profile: "
              + ", ".join(f"{m} {t:.1f} ms" for m, t in predicted[stages].items()))
        if len(transports) == 2:
            print(f"S = {stages}: shm/tcp samples/s " + ", ".join(
                f"{m} {rates[stages, m, 'auto'] / rates[stages, m, 'tcp']:.2f}" for m in methods))


if __name__ == "__main__":
    main()
