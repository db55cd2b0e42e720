"""The seeds' claims, reproduced (or not) with `--mode simulate`: deterministic, minutes on a laptop.

What it runs
    Fashion-MNIST (the first `--samples` training images, the first 2,000 test images as
    validation), a 784-128-10 MLP trained with plain SGD, 4 virtual workers at batch 32, for
    `--epochs` epochs, under three slow-down profiles (homogeneous 1,1,1,1; 1,1,2,2; 1,1,2,4),
    for every learning rate of `--lrs` and every seed of `--seeds`, with nine algorithms:
    sync (the batch-weighted mean of all gradients per step), asgd, dc-asgd-a, ddc-asgd,
    asgd+dbs, ddc-asgd+dbs, softsync (n=1: the mean of every 4 pushes), ssp (S=3) and group
    (speed groups, rate lr·B_g/B_ref). The seed fixes the initial weights, the data order and
    the step-time jitter (`jitter=0.1`: each step's time times exp(0.1·N(0,1))).

    Every run is `nbdist.train(..., mode="simulate")`: real gradients, the real rules and
    coordinator, virtual step times (default cost model: 1 ms + 20 µs per sample, times the
    worker's slow-down). So the numbers do not depend on the machine's load and regenerate
    exactly on the same TensorFlow build and CPU kind.

Metrics (each the mean over seeds, with the spread: ± half the range over seeds)
    acc@T, loss@T   validation accuracy / loss of the hub's weights at a fixed virtual budget T:
                    the time perfectly used workers would need for half the work
                    (T = 0.5 · epochs · samples · cost(32) / (32 · Σ 1/slowdown_i));
    acc@end, loss@end   after `--epochs` epochs: equal work (every sample seen `epochs` times,
                    so the same number of gradients for every algorithm);
    t→target        first virtual time the validation accuracy reaches `--target`
                    (evaluated every T/4; "-" when never);
    delay mean/p95  staleness of the pushes (versions);
    div             runs (of the seeds) that diverged: a NaN/inf loss, or loss@end above
                    ln 10 (worse than guessing).

Usage
    python benchmarks/reproduce.py                  # the full study (see README for its time)
    python benchmarks/reproduce.py --quick          # smoke run: 1 profile, 1 seed, 3 algorithms
    python benchmarks/reproduce.py --out /tmp/r.md  # write elsewhere
    python benchmarks/reproduce.py --report-only    # re-write the report from the saved runs
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import _common  # noqa: F401 - quiets TensorFlow, puts the checkout on sys.path
import numpy as np
from _reproduce_report import write_report

ALGORITHMS = {
    "sync": {"sim_extra": "sync=1"},
    "asgd": {"algorithm": "asgd"},
    "dc-asgd-a": {"algorithm": "dc-asgd-a"},
    "ddc-asgd": {"algorithm": "ddc-asgd"},
    "asgd+dbs": {"algorithm": "asgd", "dbs": True},
    "ddc-asgd+dbs": {"algorithm": "ddc-asgd", "dbs": True},
    "softsync": {"algorithm": "softsync", "n": 1},
    "ssp": {"algorithm": "ssp", "staleness": 3},
    "group": {"algorithm": "group"},
}
PROFILES = ["1,1,1,1", "1,1,2,2", "1,1,2,4"]
CELL = """
model = MODEL
model.set_weights(init_weights)
"""
BATCH = 32
JITTER = 0.1
PER_STEP, PER_SAMPLE = 1e-3, 2e-5  # the simulator's default cost model, written out


def budget(profile: str, samples: int, epochs: int) -> float:
    """T: half the work at perfect utilisation of the profile's workers."""
    slow = [float(s) for s in profile.split(",")]
    step = PER_STEP + PER_SAMPLE * BATCH
    return 0.5 * epochs * samples * step / (BATCH * sum(1 / s for s in slow))


def load(samples: int):
    from nbdist.datasets import load_fashion_mnist

    (x, y), (xt, yt) = load_fashion_mnist()
    x = x.reshape(len(x), -1)[:samples].astype("float32") / 255.0
    xt = xt.reshape(len(xt), -1)[:2000].astype("float32") / 255.0
    return x, y[:samples].astype("int64"), xt, yt[:2000].astype("int64")


def build_model():
    import keras

    model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(128, activation="relu"),
                              keras.layers.Dense(10, activation="softmax")])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    return model


def initial_weights(seed: int) -> list:
    import keras

    keras.utils.set_random_seed(seed)
    return build_model().get_weights()


def one_run(ns: dict, algo: str, profile: str, lr: float, seed: int, args) -> dict:
    import nbdist
    from nbdist.errors import TrainingError

    spec = dict(ALGORITHMS[algo])
    t_budget = budget(profile, args.samples, args.epochs)
    sim = f"jitter={JITTER},eval_every={t_budget / 4!r}"
    if spec.pop("sim_extra", None):
        sim += ",sync=1"
    ns["init_weights"] = ns["INITS"][seed]
    row = {"algo": algo, "profile": profile, "lr": lr, "seed": seed, "T": t_budget}
    try:
        run = nbdist.train(CELL, namespace=ns, mode="simulate", workers=4, slowdown=profile, lr=lr,
                           epochs=args.epochs, batch_size=BATCH, seed=seed, sim=sim, wait=True, **spec)
    except TrainingError:
        return {**row, "diverged": True}
    h = run.history
    evals = h.dropna(subset=["val_accuracy"]).sort_values("time", kind="stable")
    pushes = h.dropna(subset=["loss"])
    at_t = evals[evals["time"] <= t_budget * (1 + 1e-9)]
    last = evals.iloc[-1]
    reached = evals[evals["val_accuracy"] >= args.target]
    row.update(
        acc_T=float(at_t["val_accuracy"].iloc[-1]) if len(at_t) else math.nan,
        loss_T=float(at_t["val_loss"].iloc[-1]) if len(at_t) else math.nan,
        acc_end=float(last["val_accuracy"]), loss_end=float(last["val_loss"]),
        t_target=float(reached["time"].iloc[0]) if len(reached) else math.nan,
        delay_mean=float(pushes["delay"].mean()), delay_p95=float(np.percentile(pushes["delay"], 95)),
        end_time=float(h["time"].max()), pushes=len(pushes),
        curve=[(float(t), float(a)) for t, a in zip(evals["time"], evals["val_accuracy"], strict=True)])
    row["diverged"] = not (row["loss_end"] <= math.log(10))
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke run: 1 profile, 1 seed, 1 rate, 3 algorithms")
    p.add_argument("--samples", type=int, default=10000)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--lrs", type=float, nargs="+", default=[0.1, 0.2, 0.3])
    p.add_argument("--profiles", nargs="+", default=PROFILES)
    p.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS), choices=list(ALGORITHMS))
    p.add_argument("--target", type=float, default=0.75, help="validation accuracy for t->target")
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "reproduce.md"))
    p.add_argument("--report-only", action="store_true",
                   help="re-write the report from the runs saved next to --out (no training)")
    args = p.parse_args(argv)
    raw = Path(args.out).with_suffix(".json")
    if args.report_only:
        saved = json.loads(raw.read_text())
        for key, value in saved["args"].items():
            setattr(args, key, value)
        print(f"wrote {write_report(Path(args.out), saved['rows'], args, saved['command'], saved['elapsed'])}")
        return 0
    if args.quick:
        args.samples, args.epochs, args.seeds, args.lrs = 3000, 1, args.seeds[:1], args.lrs[-1:]
        args.profiles, args.algorithms, args.target = ["1,1,2,4"], ["sync", "asgd", "ddc-asgd"], 0.6
    x, y, xt, yt = load(args.samples)
    ns = {"x_train": x, "y_train": y, "x_test": xt, "y_test": yt, "MODEL": build_model()}
    ns["INITS"] = {s: initial_weights(s) for s in args.seeds}
    rows, started = [], time.perf_counter()
    total = len(args.profiles) * len(args.lrs) * len(args.seeds) * len(args.algorithms)
    for profile in args.profiles:
        for lr in args.lrs:
            for seed in args.seeds:
                for algo in args.algorithms:
                    rows.append(one_run(ns, algo, profile, lr, seed, args))
                    r = rows[-1]
                    print(f"[{len(rows)}/{total} {time.perf_counter() - started:6.0f}s] {profile} lr={lr} "
                          f"seed={seed} {algo:13s} " + ("DIVERGED" if r["diverged"] and "acc_end" not in r
                                                         else f"acc@T {r['acc_T']:.3f} acc@end {r['acc_end']:.3f}"),
                          flush=True)
    elapsed = time.perf_counter() - started
    command = "python benchmarks/reproduce.py " + " ".join(argv if argv is not None else sys.argv[1:])
    raw.parent.mkdir(parents=True, exist_ok=True)
    kept = {k: getattr(args, k) for k in ("samples", "epochs", "seeds", "lrs", "profiles", "algorithms", "target")}
    raw.write_text(json.dumps({"command": command.strip(), "elapsed": elapsed, "args": kept, "rows": rows}))
    path = write_report(Path(args.out), rows, args, command.strip(), elapsed)
    print(f"wrote {path} ({elapsed:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
