"""--partition measured against the cuts it is meant to beat: greedy, uniform and 5 random ones.

What it measures
    A CNN with a skip connection and unequal layers (a stem convolution, two heavy ones whose
    sum is the skip's, pooling, a dense layer and the logits; 32x32x3 random images, batch 64,
    4 micro-batches, GPipe), cut into 2 stages on 2 engines, one epoch per run after the
    stages' first step. Each partition is one run in this one process run:

      measured     the default: the cost model's best cuts, each timed as whole stages on the
                   first stage's engine before training, the fastest kept
      greedy       the thesis's walk over the per-layer profile
      uniform      equal layer counts
      random s     a seeded random cut, s = 0..4

      samples/s    steps 2..last over the time between their reports (run.history)
      cut          the layers of stage 0 | stage 1

    Several methods often pick the same cut, and two runs of one cut differ by up to 10% on this
    shared machine, so the verdict is per distinct cut: the median samples/s of every run of
    that cut (whichever method chose it; the methods' runs alternate, `--repeats` rounds,
    default 3). The ratio at the end is the median of measured's cut over the best median of
    any other cut: the bar is 0.95 or more.

    `--hosts 2` puts the two stage engines on two emulated hosts (tests/lab_network.py: network
    namespaces on one bridge, each link shaped to `--rate`, default 1gbit; needs root), so each
    activation and gradient crosses a 1 Gbit/s link; the kernel and the controller stay on the
    head.

    python benchmarks/pipeline_partition.py               # one host (~4 min)
    sudo python benchmarks/pipeline_partition.py --hosts 2
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
from pathlib import Path

import _common  # noqa: F401 - sets TF_CPP_MIN_LOG_LEVEL and sys.path before nbdist loads
import numpy as np
from _common import REPO, table
from pipeline import steady_rate

BATCH = 64
CELL = '''
import keras
import numpy as np
keras.utils.set_random_seed(0)
rng = np.random.default_rng(0)
x_train = rng.normal(size=(SAMPLES, 32, 32, 3)).astype("float32")
y_train = rng.integers(0, 10, size=SAMPLES)
inp = keras.Input((32, 32, 3))
stem = keras.layers.Conv2D(16, 3, padding="same", activation="relu", name="stem")(inp)
heavy1 = keras.layers.Conv2D(16, 3, padding="same", activation="relu", name="heavy1")(stem)
heavy2 = keras.layers.Conv2D(16, 3, padding="same", activation="relu", name="heavy2")(heavy1)
skip = keras.layers.Add(name="skip")([stem, heavy2])
pooled = keras.layers.MaxPooling2D(4, name="pool")(skip)
flat = keras.layers.Flatten(name="flatten")(pooled)
dense = keras.layers.Dense(256, activation="relu", name="dense")(flat)
logits = keras.layers.Dense(10, activation="softmax", name="logits")(dense)
model = keras.Model(inp, logits)
model.compile(optimizer=keras.optimizers.SGD(0.01), loss="sparse_categorical_crossentropy")
'''


def partitions() -> list[tuple[str, dict]]:
    return [("measured", {"partition": "measured"}), ("greedy", {"partition": "greedy"}),
            ("uniform", {"partition": "uniform"}),
            *((f"random {s}", {"partition": "random", "seed": s}) for s in range(5))]


def one_run(cell: str, cluster, options: dict) -> tuple[float, str, str]:
    import nbdist

    run = nbdist.train(cell, cluster=cluster, namespace={}, mode="pipeline", stages=2,
                       micro_batches=4, batch_size=BATCH, no_validation=True, timeout=300,
                       **options)
    run.wait(timeout=1800)
    part = run.partition
    note = next((t for t in run.events["text"].dropna() if t.startswith("pipeline:")), "")
    return steady_rate(run.history), " | ".join(part["layers"]), note


@contextlib.contextmanager
def engines_on(hosts: int, rate: str):
    """A cluster of 2 engines: on this host, or on 2 emulated hosts (the lab network)."""
    import nbdist

    if hosts == 1:
        cluster = nbdist.Cluster.start(2)
        try:
            yield cluster
        finally:
            cluster.stop()
        return
    sys.path.insert(0, str(REPO / "tests"))
    from lab_network import LabCluster, LabNetwork, unavailable

    why = unavailable()
    if why:
        raise SystemExit(f"--hosts 2 needs the lab network: {why}")
    from nbdist.cluster.engines import Cluster

    with LabNetwork(hosts=2, rate=rate) as lab, tempfile.TemporaryDirectory() as tmp:
        hand = LabCluster(lab, Path(tmp), ["lab1", "lab2"])
        hand.start()
        cluster = Cluster.connect(
            connection_file=str(hand.security / "ipcontroller-lab-client.json"))
        try:
            yield cluster
        finally:
            cluster.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--hosts", type=int, choices=[1, 2], default=1)
    parser.add_argument("--rate", default="1gbit", help="each emulated host's link (--hosts 2)")
    args = parser.parse_args()
    cell = f"SAMPLES = {args.samples}\n" + CELL
    rates: dict[str, list[float]] = {}
    cuts, notes = {}, {}
    with engines_on(args.hosts, args.rate) as cluster:
        for _ in range(args.repeats):
            for name, options in partitions():
                rate, cut, note = one_run(cell, cluster, options)
                rates.setdefault(name, []).append(rate)
                cuts[name], notes[name] = cut, note
    by_cut: dict[str, list[float]] = {}
    for name, runs in rates.items():
        by_cut.setdefault(cuts[name], []).extend(runs)
    median = {cut: float(np.median(runs)) for cut, runs in by_cut.items()}
    mine = cuts["measured"]
    others = max((v for cut, v in median.items() if cut != mine), default=median[mine])
    rows = [[name, cuts[name], *rates[name], median[cuts[name]]] for name in rates]
    where = "one host" if args.hosts == 1 else f"2 emulated hosts, {args.rate} links"
    print(f"pipeline, 2 stages on {where}, {args.samples} samples, batch {BATCH}, "
          "4 micro-batches, GPipe")
    print(table(["partition", "cut", *(f"run {i + 1}" for i in range(args.repeats)),
                 "cut's median"], rows))
    print(f"\nmeasured: {notes['measured']}")
    print(f"measured's cut / fastest other cut (medians): {median[mine] / others:.3f} "
          "(the bar: >= 0.95)")


if __name__ == "__main__":
    main()
