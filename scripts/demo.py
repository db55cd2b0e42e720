"""`make demo`: start a local cluster, train the quickstart model asynchronously, show results.

Runs the same path a notebook user takes (nbdist.train is what %%distribute calls), on
Fashion-MNIST read offline, and writes the run's HTML report (out/demo-report.html), history
and per-node table under out/.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = Path(__file__).resolve().parents[1]
CELL = '''
import keras
from nbdist.datasets import load_fashion_mnist
(x_train, y_train), (x_test, y_test) = load_fashion_mnist()
x_train = x_train.reshape(-1, 784).astype("float32") / 255.0
x_test = x_test.reshape(-1, 784).astype("float32") / 255.0
model = keras.Sequential([
    keras.Input((784,)),
    keras.layers.Dense(256, activation="relu"),
    keras.layers.Dense(256, activation="relu"),
    keras.layers.Dense(10, activation="softmax"),
])
model.compile(optimizer=keras.optimizers.SGD(0.05), loss="sparse_categorical_crossentropy",
              metrics=["accuracy"])
'''


def main() -> int:
    import nbdist

    logging.basicConfig(level=logging.WARNING)
    out = ROOT / "out"
    out.mkdir(exist_ok=True)
    print("Starting a local cluster of 3 engines (1 hub, 2 workers)...", flush=True)
    cluster = nbdist.Cluster.start(3)
    try:
        start = time.time()
        run = nbdist.train(CELL, cluster=cluster, workers=2, epochs=2, batch_size=64)
        while not run.done():
            print(run.summary(), flush=True)
            time.sleep(3)
        run.wait()
        print(run.summary())
        print(f"\nTrained in {time.time() - start:.1f}s. Per-node table:")
        print(run.nodes.to_string(index=False))
        run.history.to_csv(out / "demo-history.csv", index=False)
        run.nodes.to_csv(out / "demo-nodes.csv", index=False)
        report = run.report(out / "demo-report.html")
        print(f"\nWrote {report} (open it in a browser; it needs no network),")
        print(f"      {out / 'demo-history.csv'} and {out / 'demo-nodes.csv'}")
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
