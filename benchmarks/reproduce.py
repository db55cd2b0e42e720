"""The seeds' claims in the seeds' own regime: calibrated cost models, 4 to 16 workers, the
rules composed as the papers did. Runs `--mode simulate`; writes results/reproduce.md.

What it runs
    Two regimes, each a model with its cost model *measured* on this machine (`--sim
    calibrate`'s code, nbdist/modes/simulate/calibrate.py: the real gradient step at three
    batch sizes and a real hub's push+pull round trip, five times; the median fit is used):
      compute   a small CNN (conv 32, conv 64, 3x3, each with 2x2 pooling, dense 10): the
                per-sample cost dominates a step, as on the papers' GPU and CPU clusters;
      overhead  the 784-128-10 MLP of the first study: the fixed cost per step (call,
                assignment, round trip) dominates.
    Both train with plain SGD at batch 32 on the first `--samples` Fashion-MNIST images for
    `--epochs` epochs (where sequential SGD, 1 worker, has flattened out), validated on the
    first 1,000 test images. Step times get a jitter exp(0.1 N(0,1)); the seed fixes the initial
    weights, the data order and the jitter, so every comparison is paired by seed.

    Settings (slow-down profiles):
      scale    4, 8 and 16 homogeneous workers: sequential SGD, asgd, dc-asgd (-c), dc-asgd-a,
               ddc-asgd (the DC-ASGD and DDC-ASGD papers' setting);
      hetero   8 workers 1:1:2:4 (two nodes of each kind... 1,1,2,4,1,1,2,4), 8 workers 1:2:4:8,
               16 workers with a quarter of the nodes 4x slower: asgd, dbs, dbs+staleness-lr,
               dbs+dc-asgd-a, softsync with alpha0/tau (n=1, staleness-lr), group and sync
               (DBS only at 8 workers, as the DBS paper; group and sync on all three).

Learning rates: sequential SGD (1 worker) trains at the regime's rate; every run with M workers
trains at one rate per M, chosen before the study by one rule: ASGD on M equal workers, seed
100 (not one of the study's seeds), at the regime's rate times each factor of `--lr-grid`
(1, 1/2, 1/4, 1/8, 1/16); the factor with the best accuracy after the fixed epochs wins (a diverged
run is the worst; a tie goes to the higher rate), and every rule (DC-ASGD, DBS, softsync,
group, sync) then trains at that rate on every profile with M workers. `--lr-grid 1` keeps
the sequential rate everywhere (the first study's choice).

Metrics per run: accuracy and loss after the fixed epochs (equal work), at a virtual budget T
(half the work at perfect utilisation of the profile), the virtual time to a target accuracy
(sequential SGD's accuracy after its first epoch), the staleness of every push. The claims, the
verdict rule (a paired sign test over seeds and settings) and the report are in
_reproduce_report.py.

Usage
    python benchmarks/reproduce.py                  # the full study (~25 min on an idle 2-core
                                                    # machine)
    python benchmarks/reproduce.py --quick          # smoke run, under 2 minutes: overhead regime,
                                                    # 4 workers
    python benchmarks/reproduce.py --regimes overhead --seeds 0 1 2   # a subset
    python benchmarks/reproduce.py --reuse-calibration   # the saved cost models: repeats runs
                                                         # exactly
    python benchmarks/reproduce.py --report-only    # re-write the report from the saved runs
    python benchmarks/reproduce.py --calibration-from /path/reproduce.json   # another run's cost
                                                                             # models
    python benchmarks/reproduce.py --part overlap   # --overlap's utilisation, real 2-engine
                                                    # cluster (~3 min)
    python benchmarks/reproduce.py --part pipeline  # greedy vs random partition, 2 pinned engines
                                                    # (~8 min)

The two real-cluster parts (benchmarks/_reproduce_overlap.py, _reproduce_pipeline.py describe
them) save their runs next to --out and join the report the simulated study wrote.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import Counter
from pathlib import Path

import _common  # noqa: F401 - quiets TensorFlow, puts the checkout on sys.path
import numpy as np
from _reproduce_report import target_of, write_report

# name -> nbdist.train options; the papers' ASGD reads w itself (nbdist predicts it by default)
PLAIN = {"algorithm": "asgd", "predict_weights": False}
ALGORITHMS = {
    "sgd": PLAIN,  # sequential SGD: run with 1 worker
    "sync": {"sim_extra": "sync=1"},
    "asgd": PLAIN,
    "dc-asgd-c": {"algorithm": "dc-asgd"},
    "dc-asgd-a": {"algorithm": "dc-asgd-a"},
    "ddc-asgd": {"algorithm": "ddc-asgd"},
    "dbs": {**PLAIN, "dbs": True},
    "dbs+slr": {**PLAIN, "dbs": True, "staleness_lr": True},
    "dbs+dc-asgd-a": {"algorithm": "dc-asgd-a", "dbs": True},
    "softsync-a0/tau": {"algorithm": "softsync", "n": 1, "staleness_lr": True},
    "group": {"algorithm": "group"},
}
PROFILES = {  # name -> slow-down per worker
    "4w": "1,1,1,1", "8w": ",".join(["1"] * 8), "16w": ",".join(["1"] * 16),
    "8w 1:1:2:4": "1,1,2,4,1,1,2,4", "8w 1:2:4:8": "1,2,4,8,1,2,4,8",
    "16w 1/4 x4": ",".join(["1,1,1,4"] * 4),
}
SCALE = ["4w", "8w", "16w"]
HETERO8 = ["8w 1:1:2:4", "8w 1:2:4:8"]
HETERO = [*HETERO8, "16w 1/4 x4"]
PLAN = [  # (profiles, algorithms): the cells of the study, per regime and seed
    (["1w"], ["sgd"]),
    (SCALE, ["asgd", "dc-asgd-c", "dc-asgd-a", "ddc-asgd"]),
    (HETERO8, ["asgd", "dbs", "dbs+slr", "dbs+dc-asgd-a", "softsync-a0/tau"]),
    (HETERO, ["asgd", "group", "sync"]),
]
# quick one first
REGIMES = {"overhead": {"model": "mlp", "lr": 0.1}, "compute": {"model": "cnn", "lr": 0.05}}
BATCH, JITTER, VALIDATION = 32, 0.1, 1000
# factors of the regime's rate; the tuning run's seed
LR_GRID, TUNE_SEED = (1.0, 0.5, 0.25, 0.125, 0.0625), 100
CELL = """
model = MODEL
model.set_weights(init_weights)
"""


def slowdowns(profile: str) -> list[float]:
    return [1.0] if profile == "1w" else [float(s) for s in PROFILES[profile].split(",")]


def budget(profile: str, cost: dict, samples: int, epochs: int) -> float:
    """T: half the work at perfect utilisation of the profile's workers."""
    step = cost["per_step_s"] + cost["per_sample_s"] * BATCH
    return 0.5 * epochs * samples * step / (BATCH * sum(1 / s for s in slowdowns(profile)))


def load(samples: int, image: bool):
    from nbdist.datasets import load_fashion_mnist

    (x, y), (xt, yt) = load_fashion_mnist()
    shape = (-1, 28, 28, 1) if image else (-1, 784)
    x = x[:samples].reshape(shape).astype("float32") / 255.0
    xt = xt[:VALIDATION].reshape(shape).astype("float32") / 255.0
    return x, y[:samples].astype("int64"), xt, yt[:VALIDATION].astype("int64")


def build_model(kind: str):
    import keras

    layers = keras.layers
    if kind == "cnn":
        stack = [keras.Input((28, 28, 1)), layers.Conv2D(32, 3, activation="relu"),
                 layers.MaxPooling2D(), layers.Conv2D(64, 3, activation="relu"),
                 layers.MaxPooling2D(), layers.Flatten()]
    else:
        stack = [keras.Input((784,)), layers.Dense(128, activation="relu")]
    model = keras.Sequential([*stack, layers.Dense(10, activation="softmax")])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    return model


def calibrate_regime(model, x, y, repeats: int) -> dict:
    """`--sim calibrate`'s measurement, `repeats` times in this kernel; the median fit is used."""
    from nbdist.engine.flat_layout import ensure_built, read_flat
    from nbdist.engine.flatmodel import FlatModel
    from nbdist.modes.simulate.calibrate import calibrate

    ensure_built(model, x[:2])
    params, nt = read_flat(model)
    found = [calibrate(FlatModel(model), params, nt, x, y, BATCH) for _ in range(repeats)]
    each = [{"per_step_s": c.cost.per_step_s, "per_sample_s": c.cost.per_sample_s,
             "compute_per_step_s": c.compute_per_step_s, "hub_round_trip_s": c.hub_round_trip_s,
             "points": c.points} for c in found]
    used = {k: float(np.median([c[k] for c in each])) for k in ("per_step_s", "per_sample_s")}
    return {**used, "where": found[0].where, "params": int(params.size), "each": each}


def workers_in(profile: str) -> int:
    return len(slowdowns(profile))


def tune_rates(ns: dict, regime: str, cost: dict, args, log) -> dict:
    """The rate per worker count: ASGD on M equal workers, seed TUNE_SEED, each factor of
    --lr-grid; the best accuracy after the fixed epochs wins (diverged = worst, ties = higher rate).
    Returns {M: {"lr": chosen, "grid": [[lr, acc_end or None], ...]}}; 1 worker keeps the rate."""
    base = REGIMES[regime]["lr"]
    counts = sorted({workers_in(p) for p, _ in cells(args)} - {1})
    out: dict = {}
    for m in counts:
        grid = []
        for factor in sorted(set(args.lr_grid), reverse=True):
            if len(args.lr_grid) == 1:  # no tuning: the one factor is the rate
                grid.append([base * factor, None])
                break
            row = one_run(ns, regime, "asgd", f"{m}w", TUNE_SEED, cost, args, lr=base * factor)
            grid.append([base * factor, None if row["diverged"] else row["acc_end"]])
            log(f"{regime} tuning {m}w asgd lr {base * factor:.4g}: "
                + ("DIVERGED" if row["diverged"] else f"acc@end {row['acc_end']:.3f}"))
        best = max(grid, key=lambda g: (-math.inf if g[1] is None else g[1], g[0]))
        out[m] = {"lr": best[0], "grid": grid}
    return out


def one_run(ns: dict, regime: str, algo: str, profile: str, seed: int, cost: dict, args,
            lr: float | None = None) -> dict:
    import nbdist
    from nbdist.errors import TrainingError

    spec = dict(ALGORITHMS[algo])
    t_budget = budget(profile, cost, args.samples, args.epochs)
    sim = (f"jitter={JITTER},eval_every={t_budget / 4!r},per_step={cost['per_step_s']!r},"
           f"per_sample={cost['per_sample_s']!r}")
    if spec.pop("sim_extra", None):
        sim += ",sync=1"
    ns["init_weights"] = ns["INITS"][seed]
    lr = REGIMES[regime]["lr"] if lr is None else lr
    row = {"regime": regime, "algo": algo, "profile": profile, "seed": seed, "T": t_budget,
           "lr": lr}
    try:
        run = nbdist.train(CELL, namespace=ns, mode="simulate", slowdown=PROFILES.get(profile, "1"),
                           lr=lr, epochs=args.epochs, batch_size=BATCH, seed=seed, sim=sim,
                           wait=True, **spec)
    except TrainingError:
        return {**row, "diverged": True}
    h = run.history
    evals = h.dropna(subset=["val_accuracy"]).sort_values("time", kind="stable")
    pushes = h.dropna(subset=["loss"])
    at_t = evals[evals["time"] <= t_budget * (1 + 1e-9)]
    last = evals.iloc[-1]
    row.update(
        acc_T=float(at_t["val_accuracy"].iloc[-1]) if len(at_t) else math.nan,
        loss_T=float(at_t["val_loss"].iloc[-1]) if len(at_t) else math.nan,
        acc_end=float(last["val_accuracy"]), loss_end=float(last["val_loss"]),
        delay_mean=float(pushes["delay"].mean()),
        delay_p95=float(np.percentile(pushes["delay"], 95)),
        delays={str(k): int(v) for k, v in sorted(Counter(pushes["delay"].astype(int)).items())},
        batch_min=int(pushes["batch_size"].min()), batch_max=int(pushes["batch_size"].max()),
        end_time=float(h["time"].max()), pushes=len(pushes),
        curve=[(float(t), float(a), float(v))
               for t, a, v in zip(evals["time"], evals["val_accuracy"], evals["val_loss"],
                                  strict=True)])
    row["diverged"] = not (row["loss_end"] <= math.log(10))
    return row


def run_part(args, raw: Path) -> int:
    """--part overlap / pipeline: real runs on a local cluster (not simulated), saved next to
    --out as <stem>-overlap.json / <stem>-pipeline.json; the report is re-written with them
    when the simulated study's runs are there."""
    started = time.perf_counter()

    def log(text: str) -> None:
        print(f"[{time.perf_counter() - started:6.0f}s] {text}", flush=True)
    if args.part == "overlap":
        from _reproduce_overlap import overlap_rows

        rows = overlap_rows({g: REGIMES[g] for g in args.regimes}, args.overlap_samples,
                            args.repeats or 5, log)
    else:
        from _reproduce_pipeline import pipeline_rows

        rows = pipeline_rows(args.repeats or 10, args.pipeline_samples, args.micro_batches, log)
    part = raw.with_name(f"{raw.stem}-{args.part}.json")
    part.write_text(json.dumps({"command": "python benchmarks/reproduce.py "
                                           + " ".join(sys.argv[1:]),
                                "elapsed": time.perf_counter() - started, "rows": rows}))
    print(f"wrote {part} ({time.perf_counter() - started:.0f} s)")
    return rewrite_report(args, raw) if raw.exists() else 0


def rewrite_report(args, raw: Path) -> int:
    saved = json.loads(raw.read_text())
    for key, value in saved["args"].items():
        setattr(args, key, value)
    args.partial = saved.get("partial", False)
    path = write_report(Path(args.out), saved["rows"], saved["calibration"], args, saved["command"],
                        saved["elapsed"], saved.get("rates"))
    print(f"wrote {path}")
    return 0


def cells(args) -> list[tuple[str, str]]:
    """(profile, algorithm) pairs of the study, without repeats, in PLAN order."""
    out: list[tuple[str, str]] = []
    for profiles, algos in PLAN:
        for profile in profiles:
            for algo in algos:
                if (profile in args.profiles + ["1w"] and algo in args.algorithms
                        and (profile, algo) not in out):
                    out.append((profile, algo))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="smoke run: overhead regime, 4 workers, 1 seed")
    p.add_argument("--regimes", nargs="+", default=list(REGIMES), choices=list(REGIMES))
    p.add_argument("--samples", type=int, default=4000)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--profiles", nargs="+", default=list(PROFILES), choices=list(PROFILES))
    p.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS), choices=list(ALGORITHMS))
    p.add_argument("--lr-grid", type=float, nargs="+", default=list(LR_GRID),
                   help="factors of the regime's rate tried for ASGD per worker "
                        "count (1: no tuning)")
    p.add_argument("--calibrations", type=int, default=5,
                   help="measurements per regime (median used)")
    p.add_argument("--reuse-calibration", action="store_true",
                   help="use the cost models saved next to --out instead of measuring: "
                        "repeats the runs exactly")
    p.add_argument("--calibration-from", metavar="PATH",
                   help="use the cost models of another run's reproduce.json (e.g. one measured "
                        "on a quiet machine)")
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "reproduce.md"))
    p.add_argument("--part", choices=["study", "overlap", "pipeline"], default="study",
                   help="study: the simulated runs; overlap, pipeline: real runs on a local "
                        "cluster (see the doc)")
    p.add_argument("--repeats", type=int,
                   help="--part overlap: pairs per regime (5); pipeline: seeds (10)")
    p.add_argument("--overlap-samples", type=int, default=24000,
                   help="--part overlap: images per run")
    p.add_argument("--pipeline-samples", type=int, default=4096,
                   help="--part pipeline: samples per epoch")
    p.add_argument("--micro-batches", type=int, default=4,
                   help="--part pipeline: micro-batches per batch of 64")
    p.add_argument("--report-only", action="store_true",
                   help="re-write the report from the runs saved next to --out (no training)")
    args = p.parse_args(argv)
    raw = Path(args.out).with_suffix(".json")
    if args.report_only:
        return rewrite_report(args, raw)
    if args.part != "study":
        return run_part(args, raw)
    if args.quick:
        args.regimes, args.samples, args.epochs, args.seeds = ["overhead"], 3000, 1, args.seeds[:1]
        args.profiles, args.calibrations = ["4w"], 1
        if args.lr_grid == list(LR_GRID):
            args.lr_grid = [1.0, 0.5]
        if args.algorithms == list(ALGORITHMS):
            args.algorithms = ["sgd", "asgd", "ddc-asgd"]
    source = Path(args.calibration_from) if args.calibration_from else raw
    saved_cost = (json.loads(source.read_text())["calibration"]
                  if args.reuse_calibration or args.calibration_from else {})
    if args.calibration_from:  # the report names where the cost models were measured
        args.calibration_command = json.loads(source.read_text())["command"]
    rows, calibration, rates, started = [], {}, {}, time.perf_counter()
    command = ("python benchmarks/reproduce.py "
               + " ".join(argv if argv is not None else sys.argv[1:])).strip()
    kept = {k: getattr(args, k, None)
            for k in ("regimes", "samples", "epochs", "seeds", "profiles", "algorithms", "lr_grid",
                      "calibration_from", "calibration_command")}
    raw.parent.mkdir(parents=True, exist_ok=True)

    def save(elapsed: float, partial: bool) -> None:
        """The rows so far: an interrupted study can still be reported (--report-only)."""
        raw.write_text(json.dumps({"command": command, "elapsed": elapsed, "partial": partial,
                                   "args": kept, "calibration": calibration, "rates": rates,
                                   "rows": rows}))
    todo = cells(args)
    total = len(args.regimes) * len(args.seeds) * len(todo)
    for regime in args.regimes:
        kind = REGIMES[regime]["model"]
        x, y, xt, yt = load(args.samples, image=kind == "cnn")
        ns = {"x_train": x, "y_train": y, "x_test": xt, "y_test": yt, "MODEL": build_model(kind)}
        calibration[regime] = saved_cost.get(regime) or calibrate_regime(
            ns["MODEL"], x[:4 * BATCH], y[:4 * BATCH], args.calibrations)
        cost = calibration[regime]
        print(f"{regime}: per step {cost['per_step_s'] * 1e3:.3g} ms, per sample "
              f"{cost['per_sample_s'] * 1e6:.3g} us ({cost['where']})", flush=True)
        ns["INITS"] = {}
        for s in [*args.seeds, TUNE_SEED]:
            import keras

            keras.utils.set_random_seed(s)
            ns["INITS"][s] = build_model(kind).get_weights()
        rates[regime] = tune_rates(ns, regime, cost, args, lambda text: print(
            f"[{time.perf_counter() - started:6.0f}s] {text}", flush=True))
        print(f"{regime}: rates per worker count "
              + ", ".join(f"{m}w {r['lr']:.4g}" for m, r in rates[regime].items()), flush=True)
        save(time.perf_counter() - started, partial=True)
        for seed in args.seeds:
            for profile, algo in todo:
                m = workers_in(profile)
                lr = rates[regime][m]["lr"] if m > 1 else None
                rows.append(one_run(ns, regime, algo, profile, seed, cost, args, lr=lr))
                r = rows[-1]
                print(f"[{len(rows)}/{total} {time.perf_counter() - started:6.0f}s] {regime} "
                      f"{profile} seed={seed} {algo:15s} "
                      + ("DIVERGED" if "acc_end" not in r else
                         f"acc@T {r['acc_T']:.3f} acc@end {r['acc_end']:.3f}"), flush=True)
                save(time.perf_counter() - started, partial=True)
        print(f"{regime}: target accuracy {target_of(rows, regime, args.epochs):.3f}", flush=True)
    elapsed = time.perf_counter() - started
    save(elapsed, partial=False)
    path = write_report(Path(args.out), rows, calibration, args, command, elapsed, rates)
    print(f"wrote {path} ({elapsed:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
