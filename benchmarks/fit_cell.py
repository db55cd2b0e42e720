"""The keras.io "Simple MNIST convnet" cell with its own model.fit(...) call: plain Keras
against the same cell under %%distribute, in one process run.

For each mode (async with 2 workers, sync with 2 ranks, local) it prints the wall time of the
whole cell (the kernel runs the cell, the run trains, the statements after fit run), the wall
time of plain `model.fit` alone on this machine, the epochs and batch trained, and the test
accuracy against fit's. The data: Fashion-MNIST from nbdist.datasets (offline), the first
`--samples` training images, 2,000 test images; the cell is the tests' own
(tests/tutorial_cells.py `KERAS_IO_CONVNET`).

    python benchmarks/fit_cell.py                  # 12,000 images, 3 epochs, async/sync/local
    python benchmarks/fit_cell.py --modes local --samples 6000
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import time

from _common import REPO, table  # puts the checkout on the path first

sys.path.insert(0, str(REPO))  # the tests' cells
from tests.tutorial_cells import KERAS_IO_CONVNET

FIT_LINE = ("model.fit(x_train, y_train, batch_size=batch_size, epochs=epochs, "
            "validation_split=0.1)")


def timed_cell(samples: int, epochs: int) -> str:
    """The tests' keras.io convnet cell (tests/tutorial_cells.py), with `samples` training
    images, `epochs`, and its fit call timed into `fit_s`."""
    cell = (KERAS_IO_CONVNET.replace("x_train[:12000], y_train[:12000]",
                                     f"x_train[:{samples}], y_train[:{samples}]")
            .replace("epochs = 3\n", f"epochs = {epochs}\n")
            .replace(FIT_LINE, "started = time.perf_counter()\n" + FIT_LINE
                     + "\nfit_s = time.perf_counter() - started"))
    assert "fit_s =" in cell and f"epochs = {epochs}" in cell  # the cell's lines were found
    return "import time\n" + cell


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

    cell = timed_cell(args.samples, args.epochs)
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
