"""What each epoch's end costs a cell with its own fit call: small cells of many epochs, plain
Keras against the same cell under nbdist, in one process run.

With a fit call the workers wait at each epoch's end until the kernel has seen it, evaluated
the validation data and run the callbacks, as in Keras. On a small dataset that wait is most of
an epoch, so it is what this measures: for each cell (a 30-epoch regression on 350 samples, a
30-epoch classifier on 600) the wall time of the fit call under plain `model.fit` and under
nbdist (--mode local, and async with 2 workers on a local cluster), the ratio, and the cost
per epoch beyond fit's. Each side runs `--repeats` times (the first of each, which builds
Keras's functions or starts the engines' Keras, is not counted); the median is shown.

    python benchmarks/epoch_cost.py                    # both cells, local and async
    python benchmarks/epoch_cost.py --modes local --repeats 3
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics

from _common import table  # puts the checkout on the path first

import nbdist

EPOCHS = 30
_DATA = '''
import numpy as np
import keras
rng = np.random.default_rng(0)
x = rng.normal(size=({n}, 8)).astype("float32")
'''
CELLS = {
    "regression, 350 samples": _DATA.format(n=350) + '''
y = (x @ rng.normal(size=(8, 1)) + 0.1 * rng.normal(size=(350, 1))).astype("float32")
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(32, activation="relu"),
                          keras.layers.Dense(1)])
model.compile(optimizer="adam", loss="mse", metrics=["mae"])
started = time.perf_counter()
history = model.fit(x, y, epochs=EPOCHS, batch_size=32, validation_split=0.2, verbose=0)
fit_s = time.perf_counter() - started
''',
    "classifier, 600 samples": _DATA.format(n=600) + '''
y = (x[:, :3].sum(axis=1) > 0).astype("int32") + (x[:, 3] > 1).astype("int32")
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(32, activation="relu"),
                          keras.layers.Dense(3, activation="softmax")])
model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
started = time.perf_counter()
history = model.fit(x, y, epochs=EPOCHS, batch_size=32, validation_split=0.2, verbose=0)
fit_s = time.perf_counter() - started
''',
}


def fit_seconds(cell: str, mode: str | None, cluster) -> float:
    """The wall time of the cell's fit call: plain Keras (mode None) or under nbdist."""
    source = f"import time\nEPOCHS = {EPOCHS}\n" + cell
    ns: dict = {}
    with contextlib.redirect_stdout(io.StringIO()):
        if mode is None:
            exec(source, ns)  # noqa: S102 - the benchmark's own cell
        else:
            options = {"workers": 2} if mode == "async" else {}
            run = nbdist.train(source, namespace=ns, mode=mode, cluster=cluster, **options)
            assert run.status == "finished", run.error
    return ns["fit_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", nargs="+", default=["local", "async"])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    cluster = None
    if "async" in args.modes:
        from nbdist.cluster.engines import Cluster

        cluster = Cluster.start(3)  # one hub shard, two workers
    rows = []
    try:
        for name, cell in CELLS.items():
            for mode in args.modes:
                times = {}
                for side in (None, mode):  # fit and nbdist in turn, warmed up first
                    times[side] = statistics.median(
                        [fit_seconds(cell, side, cluster) for _ in range(args.repeats + 1)][1:])
                extra = (times[mode] - times[None]) / EPOCHS
                rows.append([name, mode, round(times[None], 2), round(times[mode], 2),
                             round(times[mode] / times[None], 2), round(extra, 3)])
                print(table(["cell", "mode", "fit s", "nbdist s", "ratio", "extra s/epoch"],
                            rows[-1:]), flush=True)
    finally:
        if cluster is not None:
            cluster.stop()
    print()
    print(table(["cell", "mode", "fit s", "nbdist s", "ratio", "extra s/epoch"], rows))


if __name__ == "__main__":
    main()
