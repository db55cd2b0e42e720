"""DBS-SGD's effect on heterogeneous workers: ASGD with and without `dbs=True`.

What it measures
    3 workers on a local cluster (`nbdist.Cluster.start(4)`: 1 hub engine + 3 worker engines),
    made heterogeneous with the heterogeneity lab's `slowdown` (worker i sleeps (k_i - 1) x its
    compute time after each step): profiles "1,1,3" and "1,2,4". Each run trains the
    784-256-256-10 MLP (SGD 0.05, `--batch` 64 per worker, so a global batch of 192) on
    Fashion-MNIST with `algorithm="asgd"`, once with fixed batches and once with `dbs=True`,
    for the same wall-clock budget: `--seconds` (default 20) counted from the first push, then
    `run.stop()` (epochs are set large). Variants and profiles are interleaved within each
    repeat (the order flips every repeat); the table shows medians over `--repeats`.

    Per worker (steady state = the last 85% of the budget, before the stop):
      batch        median batch size of its pushes (run.history batch_size);
      samples/s    its measured training throughput (samples counted by the hub / wall time);
      step ms      its wall time per push (compute + slow-down sleep + round trip);
      tau mean/p95/max   staleness of its pushes as run.nodes reports them (the hub's window
                   of each worker's last 256 pushes, at the end of the run);
      hist mean/p95      the same from run.history over the whole steady-state window.
    Per run ("all" rows):
      samples/s    all workers together; tau spread = max - min over workers of tau mean;
      loss 10%     mean loss of the last 10% of pushes (run.history);
      val acc (ep) the last val_* row of run.history (validation at each epoch end) and the
                   epoch it belongs to, which differs between runs of the same budget;
      test acc     the kernel's model after the run (the trained weights at the stop),
                   evaluated on the test split: the like-for-like quality at equal time.

How to read it
    DBS-SGD splits the global batch by each worker's measured compute speed so that every
    worker's step takes the same time (in proportion to speed when the fixed cost per step is
    negligible). Expected with DBS: for "1,1,3" the slow worker's
    batch is about a third of the others' (for "1,2,4": batches about 4:2:1); the spread of
    mean delay across workers shrinks (mean tau -> M - 1 = 2 for everyone); p95 delay falls.
    The "Expectations" lines below the table say whether each holds in this measurement, and
    whether the mechanism behind them, equal step times, was reached. It cannot be when a
    worker's fixed cost per step (the gradient call's overhead, assigning the pulled weights),
    which the slow-down multiplies too, already exceeds a fast worker's whole step: then the
    slow worker sits at DBS's batch floor (`batch_min`; nbdist's default when not given)
    whatever its speed. A larger `--batch` makes the per-sample cost count for more.

    python benchmarks/dbs_effect.py                  # both profiles, 20 s per run, 2 repeats
                                                     # (~3.5 min)
    python benchmarks/dbs_effect.py --quick          # profile 1,1,3, 8 s per run, 1 repeat (~1 min)
    python benchmarks/dbs_effect.py --seconds 30 --repeats 3 --profiles 1,2,4
    python benchmarks/dbs_effect.py --batch-min 4    # adds a third variant: dbs with batch_min 4
    python benchmarks/dbs_effect.py --batch 256 --profiles 1,1,3
"""

from __future__ import annotations

import argparse
import time

import _common  # noqa: F401 - sets TF_CPP_MIN_LOG_LEVEL and sys.path before nbdist loads
from _common import median, table
from _training import (
    CELL,
    FOREVER_EPOCHS,
    evaluate_kernel_model,
    history_window,
    last_val,
    percentile,
    pushes,
    run_for,
    stop_time,
)

WARM_FRAC = 0.15  # the first 15% of the budget is start-up (tracing, DBS's first re-balances)
WORKERS = 3


def measure(cluster, profile: str, dbs: bool, seconds: float, batch_min: int | None,
            batch: int) -> dict:
    import nbdist

    ns: dict = {}
    options = {"batch_min": batch_min} if batch_min else {}
    t_call = time.monotonic()
    run = nbdist.train(CELL, cluster=cluster, namespace=ns, workers=WORKERS, epochs=FOREVER_EPOCHS,
                       batch_size=batch, algorithm="asgd", slowdown=profile, dbs=dbs,
                       timeout=120, **options)
    info = run_for(run, seconds * (1 - WARM_FRAC), warm=seconds * WARM_FRAC)
    startup = info["first_push"] - t_call
    nodes = run.nodes.set_index("worker")
    hist = pushes(run)
    win, _, _ = history_window(hist, WARM_FRAC, stop_time(run))
    rates = info["sampler"].worker_rates(*info["window"])
    step_times = info["sampler"].worker_step_times(*info["window"])
    workers = []
    for w in range(WORKERS):
        mine = win[win["worker"] == w]
        workers.append({
            "slowdown": float(nodes.loc[w, "slowdown"]),
            "batch": float(mine["batch_size"].median()) if len(mine) else float("nan"),
            "rate": rates[w] if rates else float("nan"),
            "step_ms": step_times[w] * 1e3 if step_times else float("nan"),
            "tau_mean": float(nodes.loc[w, "delay_mean"]),
            "tau_p95": float(nodes.loc[w, "delay_p95"]),
            "tau_max": float(nodes.loc[w, "delay_max"]),
            "hist_mean": float(mine["delay"].mean()) if len(mine) else float("nan"),
            "hist_p95": percentile(mine["delay"], 95),
        })
    tail = hist.sort_values("step").iloc[-max(1, len(hist) // 10):]
    val = last_val(run)
    test_loss, test_acc = evaluate_kernel_model(ns)
    rebalances = int((run.events["event"] == "rebalance").sum()) if not run.events.empty else 0
    return {"workers": workers, "rate": sum(rates) if rates else float("nan"),
            "loss_tail": float(tail["loss"].mean()),
            "val_acc": float(val.get("val_accuracy", float("nan"))),
            "val_epoch": float(val.get("epoch", float("nan"))),
            "test_acc": test_acc, "test_loss": test_loss, "startup": startup,
            "epochs": float(hist["epoch"].max()), "rebalances": rebalances}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="profile 1,1,3, 8 s runs, 1 repeat")
    parser.add_argument("--seconds", type=float, default=None,
                        help="budget per run (default 20; 8 with --quick)")
    parser.add_argument("--repeats", type=int, default=None, help="default 2 (1 with --quick)")
    parser.add_argument("--profiles", nargs="+", default=None, help='default "1,1,3" "1,2,4"')
    parser.add_argument("--batch", type=int, default=64, help="base batch per worker (default 64)")
    parser.add_argument("--batch-min", type=int, default=None,
                        help="also run DBS with this batch_min (a third variant)")
    args = parser.parse_args()
    seconds = args.seconds or (8.0 if args.quick else 20.0)
    repeats = args.repeats or (1 if args.quick else 2)
    profiles = args.profiles or (["1,1,3"] if args.quick else ["1,1,3", "1,2,4"])
    variants = [("asgd", False, None), ("asgd+dbs", True, None)]
    if args.batch_min:
        variants.append((f"asgd+dbs min {args.batch_min}", True, args.batch_min))
    print(f"dbs_effect: 784-256-256-10 MLP on Fashion-MNIST, {WORKERS} workers, batch {args.batch} "
          f"each, profiles {profiles}, {seconds:g} s per run from the first push, "
          f"{repeats} repeat(s)",
          flush=True)

    results: dict[tuple[str, str], list[dict]] = {(p, v[0]): [] for p in profiles for v in variants}
    cluster = None
    t_start = time.monotonic()
    try:
        import nbdist

        cluster = nbdist.Cluster.start(WORKERS + 1)
        for rep in range(repeats):
            order = variants if rep % 2 == 0 else variants[::-1]
            for profile in profiles:
                for name, dbs, bmin in order:
                    r = measure(cluster, profile, dbs, seconds, bmin, args.batch)
                    results[(profile, name)].append(r)
                    batches = "/".join(f"{w['batch']:.0f}" for w in r["workers"])
                    taus = "/".join(f"{w['tau_mean']:.1f}" for w in r["workers"])
                    print(f"  [{rep + 1}/{repeats}] {profile} {name:<10} {r['rate']:>7,.0f} "
                          f"samples/s  batches {batches}  tau mean {taus}  test acc "
                          f"{r['test_acc']:.3f}  (start-up {r['startup']:.1f}s)", flush=True)
    finally:
        if cluster is not None:
            cluster.stop()

    rows, summary = [], {}
    for profile in profiles:
        for name, _, _ in variants:
            rs = results[(profile, name)]

            def med(key, w=None, rs=rs):
                return median([(r["workers"][w] if w is not None else r)[key] for r in rs])

            per = [{k: med(k, w) for k in rs[0]["workers"][w]} for w in range(WORKERS)]
            spread = median([max(x["tau_mean"] for x in r["workers"])
                             - min(x["tau_mean"] for x in r["workers"]) for r in rs])
            summary[(profile, name)] = {
                "per": per, "spread": spread,
                "p95max": median([max(x["tau_p95"] for x in r["workers"]) for r in rs]),
                "step_ratio": median([max(x["step_ms"] for x in r["workers"])
                                      / min(x["step_ms"] for x in r["workers"]) for r in rs])}
            for w, x in enumerate(per):
                rows.append([profile, name, str(w), x["slowdown"], x["batch"], x["rate"],
                             x["step_ms"], x["tau_mean"],
                             x["tau_p95"], x["tau_max"], x["hist_mean"], x["hist_p95"], "", "", ""])
            rows.append([profile, name, "all", "", "", med("rate"), "", f"spread {spread:.2f}", "",
                         "", "", "", med("loss_tail"),
                         f"{med('val_acc'):.3f} ({med('val_epoch'):.0f})", med("test_acc")])
    print()
    print(f"Medians of {repeats} repeat(s); steady state = the last {1 - WARM_FRAC:.0%} of each "
          f"{seconds:g} s budget. tau = push delay in versions; tau mean/p95/max from run.nodes "
          f"(last 256 pushes per worker), hist = from run.history over the steady state.")
    print(table(["profile", "variant", "worker", "slow", "batch", "samples/s", "step ms",
                 "tau mean", "tau p95", "tau max", "hist mean", "hist p95", "loss 10%",
                 "val acc (ep)", "test acc"], rows))

    print("\nExpectations (DBS against plain ASGD, same profile):")
    for profile in profiles:
        a, d = summary[(profile, "asgd")], summary[(profile, "asgd+dbs")]
        factors = [float(k) for k in profile.split(",")]
        b = [x["batch"] for x in d["per"]]
        want = [1 / f for f in factors]
        ratio = [bi / b[0] for bi in b]
        expect = [wi / want[0] for wi in want]
        close = all(abs(r - e) <= 0.35 * e for r, e in zip(ratio, expect, strict=True))
        print(f"  {profile}: DBS batches {'/'.join(f'{x:.0f}' for x in b)}, relative to worker 0 "
              f"{'/'.join(f'{x:.2f}' for x in ratio)} (expected "
              f"{'/'.join(f'{x:.2f}' for x in expect)}, within 35%): "
              f"{'HOLDS' if close else 'DOES NOT HOLD'}")
        print(f"  {profile}: spread of mean tau across workers {a['spread']:.2f} -> "
              f"{d['spread']:.2f}: "
              f"{'HOLDS (shrinks)' if d['spread'] < a['spread'] else 'DOES NOT HOLD'}")
        print(f"  {profile}: largest worker p95 tau {a['p95max']:.1f} -> {d['p95max']:.1f}: "
              f"{'HOLDS (falls)' if d['p95max'] < a['p95max'] else 'DOES NOT HOLD'}")
        print(f"  {profile}: (mechanism) slowest/fastest step time {a['step_ratio']:.2f} -> "
              f"{d['step_ratio']:.2f}: "
              f"{'equalised' if d['step_ratio'] <= 1.25 else 'NOT equalised'} (within 25%)")
    rebalances = [r["rebalances"] for (p, v), rs in results.items() if v != "asgd" for r in rs]
    print(f"\nMedian start-up (train() call to first push): "
          f"{median([r['startup'] for rs in results.values() for r in rs]):.1f}s; DBS re-balances "
          f"per run: {median(rebalances):.0f}; total benchmark time "
          f"{time.monotonic() - t_start:.0f}s")


if __name__ == "__main__":
    main()
