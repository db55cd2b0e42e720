"""What the hub's per-push metrics cost: `metrics="full"` against `metrics="minimal"`.

What it measures
    Steady-state throughput of an async run (ASGD, 2 workers, `nbdist.Cluster.start(3)`: one
    hub engine, two worker engines; the 784-256-256-10 MLP, SGD 0.05, batch 64 per worker, on
    Fashion-MNIST, no validation) with the hub recording everything per push ("full": history
    row, timeline row, delay window and histogram, samples/s moving average, compute/comm
    totals) against counters only ("minimal": steps, samples, last loss).

    Each run trains `--warm` seconds (default 4) after its first push, then `--seconds`
    (default 12) that count, then `run.stop()`. Throughput = samples counted by the hub
    between the first and the last poll of the counting window / the kernel time between those
    polls (the Run polls the hub every 0.25 s; the same method for both sides, since "minimal"
    has no history rows to time pushes by). The kernel's polling is part of what is measured:
    with "full" every poll also carries the new history rows, and every 2 s the timeline.
    Repeats are interleaved in ABBA order (full, minimal, minimal, full, ...), so drifts of a
    shared machine hit both sides alike; the table shows medians and min-max.

    CPU per push: the hub engine's and the two worker engines' CPU time (psutil, user +
    system, all threads; read from this process, as the engines share its host) over the
    counting window, divided by the pushes in it. Less sensitive to other load on a shared
    machine than wall-clock throughput, and it shows where the metrics cost lands.

    Runs are configured for 50 epochs and stopped long before: with "full", the hub's cost per
    push grows with the configured number of epochs (EpochSchedule.epochs_done sums over every
    epoch on each push), so a much larger setting would measure that instead.

How to read it
    ratio = full samples/s / minimal samples/s (median over repeats of each side); also the
    median of the per-pair ratios (each full run against the minimal run next to it). With
    both workers busy on a 2-core machine every CPU microsecond the hub spends per push comes
    out of the workers' time, so the hub CPU difference per push, over all engines' CPU per
    push, estimates the throughput cost independently of wall-clock noise.
    Target: ratio >= 0.98 (full metrics cost at most 2% of throughput). On a noisy 2-core
    machine the min-max ranges can be wider than the effect: check them before concluding.

    python benchmarks/metrics_overhead.py            # 4 pairs, 12 s counted per run (~3 min)
    python benchmarks/metrics_overhead.py --quick    # 1 pair, 8 s counted per run (~1 min)
    python benchmarks/metrics_overhead.py --repeats 6 --seconds 20 --batch 32
"""

from __future__ import annotations

import argparse
import time

import _common  # noqa: F401 - sets TF_CPP_MIN_LOG_LEVEL and sys.path before nbdist loads
from _common import median, spread, table
from _training import CELL, FOREVER_EPOCHS, Sampler

WORKERS = 2


def engine_pids(cluster, engines: list[int]) -> list[int]:
    """Process ids of the engines (asked while they are idle; a busy engine runs nothing else)."""
    import os

    return cluster.client[engines].apply_sync(os.getpid)


def engine_cpu(pids: list[int]) -> list[float]:
    """CPU seconds (user + system, all threads) each engine process has used, read from this
    process (local cluster: same host), so a busy engine need not answer."""
    import psutil

    return [sum(psutil.Process(p).cpu_times()[:2]) for p in pids]


def measure(cluster, pids: list[int], metrics: str, batch: int, warm: float,
            seconds: float) -> dict:
    import nbdist

    t_call = time.monotonic()
    run = nbdist.train(CELL, cluster=cluster, namespace={}, workers=WORKERS, epochs=FOREVER_EPOCHS,
                       batch_size=batch, algorithm="asgd", no_validation=True, metrics=metrics,
                       timeout=120)
    sampler = Sampler(run)
    with run:  # an error or Ctrl-C stops the run on the way out
        first = sampler.wait_first_push(run)
        time.sleep(warm)
        cpu0, steps0, t0 = engine_cpu(pids), _steps(run), time.monotonic()
        time.sleep(seconds)
        cpu1, steps1, t1 = engine_cpu(pids), _steps(run), time.monotonic()
        run.stop()
        run.wait(120)
    pushes = max(1, steps1 - steps0)
    cpu = [b - a for a, b in zip(cpu0, cpu1, strict=True)]
    return {"rate": sampler.rate(t0, t1), "startup": first - t_call,
            "hub_cpu": cpu[0] / pushes, "worker_cpu": sum(cpu[1:]) / pushes,
            "history_rows": len(run.history), "steps": int(run.nodes["steps"].sum())}


def _steps(run) -> int:
    return int(sum(n["steps"] for n in run.state.snapshot.get("nodes", [])))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 pair, 8 s counted per run")
    parser.add_argument("--repeats", type=int, default=None,
                        help="pairs (default 4; 1 with --quick)")
    parser.add_argument("--seconds", type=float, default=None,
                        help="counted seconds per run (default 12; 8 with --quick)")
    parser.add_argument("--warm", type=float, default=4.0,
                        help="seconds after the first push not counted")
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()
    repeats = args.repeats or (1 if args.quick else 4)
    seconds = args.seconds or (8.0 if args.quick else 12.0)
    print(f"metrics_overhead: 784-256-256-10 MLP on Fashion-MNIST, async ASGD, {WORKERS} workers, "
          f"batch {args.batch}, {repeats} pair(s), {args.warm:g} s warm + "
          f"{seconds:g} s counted per run",
          flush=True)
    runs: dict[str, list[dict]] = {"full": [], "minimal": []}
    pairs: list[float] = []
    cluster = None
    t_start = time.monotonic()
    try:
        import nbdist
        from nbdist.cluster.engines import assign_roles

        cluster = nbdist.Cluster.start(WORKERS + 1)
        roles = assign_roles(cluster.engine_hosts(), 1, WORKERS)  # what ClusterBackend picks
        pids = engine_pids(cluster, [*roles.servers, *roles.workers])  # hub engine first
        # one untimed run first: the engines import TensorFlow and load the data once
        measure(cluster, pids, "minimal", args.batch, 0.5, 0.5)
        for rep in range(repeats):
            order = ["full", "minimal"] if rep % 2 == 0 else ["minimal", "full"]
            pair = {}
            for metrics in order:
                r = measure(cluster, pids, metrics, args.batch, args.warm, seconds)
                runs[metrics].append(r)
                pair[metrics] = r["rate"]
                print(f"  [{rep + 1}/{repeats}] {metrics:<8} {r['rate']:>8,.0f} samples/s  hub CPU "
                      f"{r['hub_cpu'] * 1e6:,.0f} us/push  ({r['steps']:,} pushes, "
                      f"{r['history_rows']:,} history rows)", flush=True)
            pairs.append(pair["full"] / pair["minimal"])
    finally:
        if cluster is not None:
            cluster.stop()

    full = median([r["rate"] for r in runs["full"]])
    minimal = median([r["rate"] for r in runs["minimal"]])
    ratio = full / minimal
    def cpu(side, key):
        return median([r[key] for r in runs[side]]) * 1e6

    rows = [["minimal", minimal, spread([r["rate"] for r in runs["minimal"]]), 1.0, "",
             cpu("minimal", "hub_cpu"), cpu("minimal", "worker_cpu")],
            ["full", full, spread([r["rate"] for r in runs["full"]]), ratio,
             f"{'ok' if ratio >= 0.98 else 'MISS'} (>= 0.98)", cpu("full", "hub_cpu"),
             cpu("full", "worker_cpu")]]
    print()
    print(f"Medians of {repeats} run(s) per side, steady state ({args.warm:g} s after the first "
          f"push, then {seconds:g} s); batch {args.batch} per worker, {WORKERS} workers.")
    print(table(["metrics", "samples/s", "range", "ratio", "target", "hub CPU us/push",
                 "workers CPU us/push"], rows))
    print(f"  per-pair ratios full/minimal: {', '.join(f'{p:.3f}' for p in pairs)} "
          f"(median {median(pairs):.3f})")
    extra = cpu("full", "hub_cpu") - cpu("minimal", "hub_cpu")
    total = cpu("minimal", "hub_cpu") + cpu("minimal", "worker_cpu")
    print(f"  CPU cost of full metrics on the hub: {extra:+,.0f} us per push, "
          f"{extra / total:+.1%} of the CPU all engines spend per push (minimal)")
    print(f"\ntotal benchmark time {time.monotonic() - t_start:.0f}s")


if __name__ == "__main__":
    main()
