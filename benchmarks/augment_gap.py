"""An Adam CNN with augmentation layers on 2 (or --workers) async workers against `model.fit`:
which rule.

What it measures
    The keras.io convnet (conv32-pool-conv64-pool-dropout 0.5-dense10, `optimizer="adam"`;
    `--model small`: conv8-pool-dropout 0.5-dense10, the tests' typical Adam convnet) on
    `--train` Fashion-MNIST images (default 12,000; the first `--test` test images, default
    2,000), with `RandomFlip("horizontal")` and `RandomTranslation(0.1, 0.1)` at its start,
    `--epochs` epochs (default 3) at batch `--batch` (default 128), for each of `--seeds` seeds
    (default 3). The cell seeds Keras, so every side of one seed starts from the same weights;
    nbdist's `seed` is the same number (its data order). Sides (`--sides` picks some):
      fit            `model.fit(batch_size=B)` in this process (the engines idle meanwhile);
      async ...      `mode="async"`, `--workers` M (default 2) x B, one update per push, so
                     as many updates per epoch as fit: `asgd` (predicting the weights, the
                     default), and with `predict_weights=False` (`-nopredict`); `asgd` with
                     `staleness_lr=True`; `dc-asgd-a`; `ssp` with `staleness=0` (BSP through
                     the hub: each push still applied alone); `softsync` with `n=1` (the mean
                     of M pushes as one update: the global batch is MB, 1/M of fit's
                     updates); `group` with `groups=1` (the same, through the group rule);
      no-aug sides   the same cell without the two augmentation layers, for fit and asgd: does
                     the gap come from augmentation or from Adam under staleness;
      local          `mode="local"` (one worker in this kernel), first seed only;
      sync           `mode="sync"`, M ranks x B/M (global batch B, fit's updates), first seed
                     only.
    Accuracy: the kernel's model after each run, `evaluate` on the test images (the same call
    for fit). gap = side's accuracy - fit's (with or without augmentation, as the side) on the
    same seed; the table gives the mean over the side's seeds, the smallest and largest gap,
    the mean push delay tau (run.nodes) and the wall time per run. No validation during runs.

    python benchmarks/augment_gap.py                        # every side, 3 seeds (~10 min on a
                                                            # busy 2-core machine)
    python benchmarks/augment_gap.py --seeds 3 --sides fit asgd asgd-slr
    python benchmarks/augment_gap.py --batch 32 --epochs 2 \
        --sides fit asgd asgd-slr dc-asgd-a ssp0 asgd-noaug
    python benchmarks/augment_gap.py --model small --train 6000 --batch 32 --epochs 2 \
        --sides fit asgd asgd-slr dc-asgd-a ssp0 asgd-noaug local
    python benchmarks/augment_gap.py --model small --train 6000 --batch 32 --epochs 2 --seeds 10 \
        --workers 3 --sides fit asgd asgd-slr dc-asgd-a ssp0 asgd-noaug
    python benchmarks/augment_gap.py --train 3000 --epochs 1 --seeds 1    # a quick smoke run
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass

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
x_test, y_test = x_test[:{test}, :, :, None].astype("float32") / 255.0, y_test[:{test}]
model = keras.Sequential([
    keras.Input((28, 28, 1)),{augment}{layers}
    keras.layers.Flatten(), keras.layers.Dropout(0.5),
    keras.layers.Dense(10, activation="softmax"),
])
model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
'''
MODELS = {  # the convolutions before flatten-dropout-dense10
    "keras-io": ('\n    keras.layers.Conv2D(32, 3, activation="relu"), '
                 'keras.layers.MaxPooling2D(),'
                 '\n    keras.layers.Conv2D(64, 3, activation="relu"), '
                 'keras.layers.MaxPooling2D(),'),
    "small": '\n    keras.layers.Conv2D(8, 3, activation="relu"), keras.layers.MaxPooling2D(),',
}
AUGMENT = '\n    keras.layers.RandomFlip("horizontal"), keras.layers.RandomTranslation(0.1, 0.1),'


@dataclass(frozen=True)
class Side:
    label: str
    augment: bool = True
    options: dict | None = None  # nbdist.train's options; None: model.fit
    first_seed_only: bool = False
    split_batch: bool = False  # sync: B/M per rank, so the global batch is fit's


ASYNC = {"mode": "async"}  # every nbdist side but local gets workers=--workers
SIDES = {
    "fit": Side("model.fit"),
    "asgd": Side("async asgd", options={**ASYNC, "algorithm": "asgd"}),
    "asgd-nopredict": Side("async asgd --no-predict-weights",
                           options={**ASYNC, "algorithm": "asgd", "predict_weights": False}),
    "asgd-slr": Side("async asgd --staleness-lr",
                     options={**ASYNC, "algorithm": "asgd", "staleness_lr": True}),
    "dc-asgd-a": Side("async dc-asgd-a", options={**ASYNC, "algorithm": "dc-asgd-a"}),
    "ssp0": Side("async ssp --staleness 0", options={**ASYNC, "algorithm": "ssp", "staleness": 0}),
    "softsync": Side("async softsync --n 1", options={**ASYNC, "algorithm": "softsync", "n": 1}),
    "group": Side("async group --groups 1", options={**ASYNC, "algorithm": "group", "groups": 1}),
    "fit-noaug": Side("model.fit, no augmentation", augment=False),
    "asgd-noaug": Side("async asgd, no augmentation", augment=False,
                       options={**ASYNC, "algorithm": "asgd"}),
    "asgd-noaug-nopredict": Side("async asgd --no-predict-weights, no augmentation",
                                 augment=False, options={**ASYNC, "algorithm": "asgd",
                                                         "predict_weights": False}),
    "local": Side("local (1 worker)", options={"mode": "local"}, first_seed_only=True),
    "sync": Side("sync M x B/M", options={"mode": "sync"}, first_seed_only=True, split_batch=True),
}
# group with one group repeats softsync's arithmetic
DEFAULT_SIDES = [k for k in SIDES if k != "group"]


def cell_for(side: Side, seed: int, args) -> str:
    return CELL.format(seed=seed, train=args.train, test=args.test,
                       augment=AUGMENT if side.augment else "", layers=MODELS[args.model])


def run_side(cluster, side: Side, seed: int, args) -> dict:
    ns: dict = {}
    cell = cell_for(side, seed, args)
    t0 = time.perf_counter()
    if side.options is None:
        exec(cell, ns)  # noqa: S102 - the benchmark's own cell
        history = ns["model"].fit(ns["x_train"], ns["y_train"], batch_size=args.batch,
                                  epochs=args.epochs, verbose=0)
        tau, train_loss = float("nan"), float(history.history["loss"][-1])
    else:
        import nbdist

        batch = args.batch // args.workers if side.split_batch else args.batch
        workers = {} if side.options["mode"] == "local" else {"workers": args.workers}
        run = nbdist.train(cell, cluster=cluster, namespace=ns, epochs=args.epochs,
                           batch_size=batch, seed=seed, no_validation=True, timeout=120, wait=True,
                           **side.options, **workers)
        if run.status != "finished" or run.error is not None:
            raise RuntimeError(f"{side.label}, seed {seed}: the run ended {run.status}: "
                               f"{run.error}")
        nodes = run.nodes
        tau = float(nodes["delay_mean"].mean()) if "delay_mean" in nodes.columns else float("nan")
        train_loss = last_epoch_loss(run)
    seconds = time.perf_counter() - t0
    loss, acc = evaluate_kernel_model(ns)
    return {"acc": acc, "loss": loss, "train_loss": train_loss, "tau": tau, "seconds": seconds}


def last_epoch_loss(run) -> float:
    """Mean training loss of the pushes in the last epoch (fit's last `loss`, as near as the
    hub's per-push rows give it; NaN where the mode keeps no per-push rows)."""
    h = run.history
    if h.empty or "loss" not in h.columns or "epoch" not in h.columns:
        return float("nan")
    h = h.dropna(subset=["loss"])
    if h.empty:
        return float("nan")
    return float(h[h["epoch"] >= h["epoch"].max() - 1]["loss"].mean())


def reference(name: str) -> str:
    return "fit" if SIDES[name].augment else "fit-noaug"


def summary_row(name: str, results: dict[str, dict[int, dict]]) -> list:
    """One side's row: mean accuracy, its gaps to fit on the same seeds (mean, min, max, how
    many seeds below fit), medians of train loss, tau and time, and the accuracy per seed."""
    mine = results[name]
    gaps = [] if name in ("fit", "fit-noaug") else \
        [r["acc"] - results[reference(name)][s]["acc"] for s, r in mine.items()]
    gap_cells = [f"{statistics.mean(gaps):+.3f}", f"{min(gaps):+.3f}", f"{max(gaps):+.3f}",
                 f"{sum(g < 0 for g in gaps)}/{len(gaps)}"] if gaps else ["-"] * 4
    return [SIDES[name].label, f"{statistics.mean(r['acc'] for r in mine.values()):.3f}",
            *gap_cells,
            *(median([r[k] for r in mine.values()]) for k in ("train_loss", "tau", "seconds")),
            ", ".join(f"{r['acc']:.3f}" for _, r in sorted(mine.items()))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--train", type=int, default=12000, help="training images (default 12,000)")
    parser.add_argument("--test", type=int, default=2000, help="test images (default 2,000)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=128,
                        help="fit's batch and each async worker's")
    parser.add_argument("--workers", type=int, default=2,
                        help="async workers and sync ranks (default 2)")
    parser.add_argument("--model", choices=list(MODELS), default="keras-io",
                        help="keras-io: conv32-pool-conv64-pool (default); small: conv8-pool, the "
                             "tests' typical Adam convnet")
    parser.add_argument("--sides", nargs="+", choices=list(SIDES), default=DEFAULT_SIDES,
                        help=f"default: {' '.join(DEFAULT_SIDES)}")
    args = parser.parse_args()
    names = list(dict.fromkeys([*(reference(n) for n in args.sides
                                  if n not in ("fit", "fit-noaug")),
                                *args.sides]))  # every gap needs its fit

    import nbdist

    results: dict[str, dict[int, dict]] = {name: {} for name in names}
    started = time.monotonic()
    print(f"augment_gap: {args.model} convnet, {args.workers} workers, {args.train:,} images, "
          f"{args.epochs} epoch(s), batch {args.batch}, seeds 0..{args.seeds - 1}, sides "
          f"{' '.join(names)}",
          flush=True)
    cluster = nbdist.Cluster.start(args.workers + 1)  # async: 1 hub engine + the workers
    try:
        for seed in range(args.seeds):
            order = [n for n in names if seed == 0 or not SIDES[n].first_seed_only]
            for name in order if seed % 2 == 0 else order[::-1]:  # alternate the order
                r = results[name][seed] = run_side(cluster, SIDES[name], seed, args)
                print(f"  seed {seed} {SIDES[name].label:<32} acc {r['acc']:.4f}  loss "
                      f"{r['loss']:.4f}  train loss {r['train_loss']:.4f}  tau {r['tau']:.2f}  "
                      f"{r['seconds']:.0f} s  (total {time.monotonic() - started:.0f} s)",
                      flush=True)
    finally:
        cluster.stop()

    rows = [summary_row(name, results) for name in names]
    sync = f" (sync: {args.workers} x {args.batch // args.workers})" if "sync" in names else ""
    print(f"\n{args.model} convnet, {args.workers} workers, {args.train:,} training images, "
          f"{args.epochs} epoch(s), batch {args.batch}{sync}, {args.test:,} test images, Adam "
          "1e-3; gap = accuracy - fit's on the same seed (no-augmentation sides: fit's "
          "without augmentation)")
    print(table(["side", "test acc (mean)", "gap mean", "gap min", "gap max", "below fit",
                 "train loss", "tau", "s/run", "per seed"], rows))
    print(f"total {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
