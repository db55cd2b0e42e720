"""--mode sync with and without --sync-batchnorm against `model.fit` at the same global batch.

What it measures
    A BatchNorm+Dropout CNN (conv16-BN-relu-pool, conv32-BN-relu-pool, dropout 0.3, dense64-BN-
    relu, dense10; Adam 1e-3) on a Fashion-MNIST subset (`--train` images, default 12,000; the
    first 2,000 test images), `--epochs` epochs (default 1), for each of `--seeds` seeds (default
    4). BatchNorm momentum 0.9: at Keras's default 0.99 the moving statistics of a ~100-step
    run are still far from the data's, and every side evaluates near chance. The cell seeds
    Keras, so every side starts from the same weights:
      fit        `model.fit(batch_size=128)` in this process;
      sync       `mode="sync"`, 2 workers x 64 (global batch 128), `sync_batchnorm=False`: each
                 rank normalises over its own 64 samples;
      sync+bn    the same with `sync_batchnorm=True`: statistics over the global 128.
    Accuracy: the kernel's model after each run (`evaluate` on the 2,000 test images; the same
    call for fit). gap = sync accuracy - fit accuracy, per seed; the table gives its mean, min
    and max over the seeds.
    Cost per step: fit's wall time / steps (in this process, the engines idle); sync's
    run.nodes (compute_s + comm_s) / steps, mean over both ranks, median over
    the seeds. With --sync-batchnorm the statistics' allreduces are inside the gradient
    computation (compute_s); the gradient allreduce is in comm_s.

    python benchmarks/sync_batchnorm.py                    # 4 seeds, 12,000 images, 1 epoch
                                                           # (~3 min)
    python benchmarks/sync_batchnorm.py --seeds 2 --train 4000   # quicker, noisier
    KERAS_BACKEND=torch python benchmarks/sync_batchnorm.py --collective torch
                        # PyTorch's backend, the torch collective (an autograd function);
                        # KERAS_BACKEND=jax: JAX's (host callbacks inside the compiled step)
"""

from __future__ import annotations

import argparse
import statistics
import time

import _common  # noqa: F401 - sets TF_CPP_MIN_LOG_LEVEL and sys.path before nbdist loads
from _common import median, table
from _training import evaluate_kernel_model

CELL = '''
import keras
from nbdist.datasets import load_fashion_mnist
keras.utils.set_random_seed({seed})
(x_train, y_train), (x_test, y_test) = load_fashion_mnist()
x_train = x_train[:{train}, :, :, None].astype("float32") / 255.0
y_train = y_train[:{train}]
x_test, y_test = x_test[:2000, :, :, None].astype("float32") / 255.0, y_test[:2000]
model = keras.Sequential([
    keras.Input((28, 28, 1)),
    keras.layers.Conv2D(16, 3, use_bias=False), keras.layers.BatchNormalization(momentum=0.9),
    keras.layers.Activation("relu"), keras.layers.MaxPooling2D(),
    keras.layers.Conv2D(32, 3, use_bias=False), keras.layers.BatchNormalization(momentum=0.9),
    keras.layers.Activation("relu"), keras.layers.MaxPooling2D(),
    keras.layers.Flatten(), keras.layers.Dropout(0.3),
    keras.layers.Dense(64, use_bias=False), keras.layers.BatchNormalization(momentum=0.9),
    keras.layers.Activation("relu"), keras.layers.Dense(10, activation="softmax"),
])
model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy",
              metrics=["accuracy"])
'''
WORKERS, BATCH = 2, 64
SIDES = [("sync", False), ("sync+bn", True)]


def fit_run(cell: str, epochs: int) -> dict:
    ns: dict = {}
    exec(cell, ns)  # noqa: S102 - the benchmark's own cell
    t0 = time.perf_counter()
    ns["model"].fit(ns["x_train"], ns["y_train"], batch_size=WORKERS * BATCH, epochs=epochs,
                    verbose=0)
    steps = epochs * -(-len(ns["x_train"]) // (WORKERS * BATCH))
    return {"acc": evaluate_kernel_model(ns)[1],
            "step_ms": 1000 * (time.perf_counter() - t0) / steps, "compute_ms": float("nan")}


def sync_run(cluster, cell: str, epochs: int, seed: int, sync_batchnorm: bool,
             collective: str) -> dict:
    import nbdist

    ns: dict = {}
    run = nbdist.train(cell, cluster=cluster, namespace=ns, mode="sync", workers=WORKERS,
                       epochs=epochs, batch_size=BATCH, seed=seed, no_validation=True,
                       sync_batchnorm=sync_batchnorm, timeout=120, collective=collective)
    with run:  # an error or Ctrl-C stops the run on the way out
        run.wait(900)
    nodes = run.nodes
    per_step = ((nodes["compute_s"] + nodes["comm_s"]) / nodes["steps"]).mean()
    return {"acc": evaluate_kernel_model(ns)[1], "step_ms": 1000 * float(per_step),
            "compute_ms": 1000 * float((nodes["compute_s"] / nodes["steps"]).mean())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--train", type=int, default=12000, help="training images")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--collective", default="auto", help="auto, horovod or torch")
    args = parser.parse_args()

    import keras

    import nbdist

    results: dict[str, list] = {"fit": [], **{name: [] for name, _ in SIDES}}
    started = time.monotonic()
    cluster = nbdist.Cluster.start(WORKERS)
    try:
        for seed in range(args.seeds):
            cell = CELL.format(seed=seed, train=args.train)
            results["fit"].append(fit_run(cell, args.epochs))
            for name, sync_bn in SIDES if seed % 2 == 0 else SIDES[::-1]:  # alternate the order
                results[name].append(sync_run(cluster, cell, args.epochs, seed, sync_bn,
                                              args.collective))
            line = ", ".join(f"{k} {v[-1]['acc']:.4f}" for k, v in results.items())
            print(f"seed {seed}: {line} ({time.monotonic() - started:.0f} s)", flush=True)
    finally:
        cluster.stop()

    fit = [r["acc"] for r in results["fit"]]
    rows = [["model.fit, batch 128", statistics.mean(fit), float("nan"), float("nan"), float("nan"),
             median([r["step_ms"] for r in results["fit"]]), float("nan")]]
    for name, _ in SIDES:
        gaps = [r["acc"] - f for r, f in zip(results[name], fit, strict=True)]
        rows.append([f"{name}, 2 x 64", statistics.mean(r["acc"] for r in results[name]),
                     statistics.mean(gaps), min(gaps), max(gaps),
                     median([r["step_ms"] for r in results[name]]),
                     median([r["compute_ms"] for r in results[name]])])
    print(f"\nKeras on {keras.backend.backend()}, --collective {args.collective}; {args.seeds} "
          f"seeds, {args.train:,} training images, {args.epochs} epoch(s), 2,000 test images; "
          "gap = accuracy - fit's, per seed")
    print(table(["side", "test acc (mean)", "gap mean", "gap min", "gap max", "ms/step",
                 "compute ms/step"], rows))
    for name, _ in SIDES:
        print(f"{name} per seed: " + ", ".join(f"{r['acc']:.4f}" for r in results[name]))
    print("fit per seed: " + ", ".join(f"{a:.4f}" for a in fit))


if __name__ == "__main__":
    main()
