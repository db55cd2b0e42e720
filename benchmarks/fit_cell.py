"""The keras.io "Simple MNIST convnet" cell with its own model.fit(...) call: plain Keras
against the same cell under %%distribute, in one process run.

For each mode (async with 2 workers, sync with 2 ranks, local) it prints the wall time of the
whole cell (the kernel runs the cell, the run trains, the statements after fit run), the wall
time of plain `model.fit` alone on this machine, the epochs and batch trained, and the test
accuracy against fit's. The data: Fashion-MNIST from nbdist.datasets (offline), the first
`--samples` training images, 2,000 test images.

    python benchmarks/fit_cell.py                  # 12,000 images, 3 epochs, async/sync/local
    python benchmarks/fit_cell.py --modes local --samples 6000
"""

from __future__ import annotations

import argparse
import contextlib
import io
import time

from _common import table  # puts the checkout on the path first

CELL = '''
import numpy as np
import keras
from keras import layers
from nbdist.datasets import load_fashion_mnist
num_classes = 10
input_shape = (28, 28, 1)
(x_train, y_train), (x_test, y_test) = load_fashion_mnist()
x_train, y_train = x_train[:SAMPLES], y_train[:SAMPLES]
x_test, y_test = x_test[:2000], y_test[:2000]
x_train = x_train.astype("float32") / 255
x_test = x_test.astype("float32") / 255
x_train = np.expand_dims(x_train, -1)
x_test = np.expand_dims(x_test, -1)
y_train = keras.utils.to_categorical(y_train, num_classes)
y_test = keras.utils.to_categorical(y_test, num_classes)
model = keras.Sequential([
    keras.Input(shape=input_shape),
    layers.Conv2D(32, kernel_size=(3, 3), activation="relu"),
    layers.MaxPooling2D(pool_size=(2, 2)),
    layers.Conv2D(64, kernel_size=(3, 3), activation="relu"),
    layers.MaxPooling2D(pool_size=(2, 2)),
    layers.Flatten(),
    layers.Dropout(0.5),
    layers.Dense(num_classes, activation="softmax"),
])
model.compile(loss="categorical_crossentropy", optimizer="adam", metrics=["accuracy"])
started = time.perf_counter()
history = model.fit(x_train, y_train, batch_size=128, epochs=EPOCHS, validation_split=0.1)
fit_s = time.perf_counter() - started
score = model.evaluate(x_test, y_test, verbose=0)
'''


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=12000,
                        help="training images (default 12000)")
    parser.add_argument("--epochs", type=int, default=3, help="the cell's fit epochs (default 3)")
    parser.add_argument("--modes", default="async,sync,local",
                        help="comma-separated (default all three)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import keras

    import nbdist

    cell = "import time\n" + (CELL.replace("SAMPLES", str(args.samples))
                              .replace("EPOCHS", str(args.epochs)))
    modes = args.modes.split(",")
    rows = []
    keras.utils.set_random_seed(args.seed)
    ns: dict = {}
    started = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        exec(cell, ns)  # noqa: S102 - the benchmark's own cell: plain Keras
    print(f"fit: accuracy {ns['score'][1]:.4f}, cell {time.perf_counter() - started:.1f} s",
          flush=True)
    fit_accuracy = ns["score"][1]
    rows.append(["model.fit", time.perf_counter() - started, ns["fit_s"], args.epochs, 128,
                 fit_accuracy, 0.0])
    cluster = nbdist.Cluster.start(3) if {"async", "sync"} & set(modes) else None
    try:
        for mode in modes:
            keras.utils.set_random_seed(args.seed)
            ns = {}
            started = time.perf_counter()
            with contextlib.redirect_stdout(io.StringIO()):
                run = nbdist.train(cell, namespace=ns, cluster=cluster, mode=mode,
                                   **({} if mode == "local" else {"workers": 2}))
            wall = time.perf_counter() - started
            history = run.keras_history
            batch = run.config.batch_size * (2 if mode == "sync" else 1)
            accuracy = ns["score"][1]
            print(f"{mode}: accuracy {accuracy:.4f}, cell {wall:.1f} s, {len(history.epoch)} "
                  "epochs", flush=True)
            rows.append([f"%%distribute --mode {mode}", wall, ns["fit_s"], len(history.epoch),
                         batch, accuracy, accuracy - fit_accuracy])
    finally:
        if cluster is not None:
            cluster.stop()
    print(table(["cell", "cell s", "fit call s", "epochs", "batch/step", "test accuracy", "vs fit"],
                rows))


if __name__ == "__main__":
    main()
