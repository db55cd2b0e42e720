"""What the kernel's snapshots of the hub cost, and what a lost hub shard costs with them.

What it measures
    Throughput: steady-state samples/s of the quickstart's async run (the 784-256-256-10 MLP,
    SGD 0.05, on Fashion-MNIST, ASGD, 2 workers, batch 64 each, one hub shard, no validation;
    `nbdist.Cluster.start(4)`: one hub engine, two worker engines and a spare) with the
    kernel snapshotting every hub shard's state every 2 s (the default,
    `NBDIST_HUB_SNAPSHOT_S=2`) against no snapshots (`NBDIST_HUB_SNAPSHOT_S=0`), in this one
    process. A snapshot is what a checkpoint takes (`HubControl.state`: the shard exports its
    parameters, rule state and optimizer slots between two pushes and sends them as signed
    frames; the kernel checks the MAC and copies them). Each run trains `--warm` seconds after
    its first push, then `--seconds` that count, then `run.stop()`; repeats interleave in ABBA
    order. The hub's CPU per push (its engine and its process, psutil) shows where the cost lands.
    The kernel's time per snapshot and its size are timed around `HubControl.state` in the runs
    with snapshots.

    Recovery (`--kill`, after the table): one run with snapshots, the hub shard's process and
    engine killed (SIGKILL) mid-run; the spare engine takes it over (nbdist/run/takeover.py).
    Reported: seconds from the kill until the kernel saw the loss, until the shard served again
    on the spare engine, and until the first push after it; the updates lost (what the shard had
    applied after the snapshot it was started from), and the run's end.

How to read it
    ratio = samples/s with snapshots / samples/s without (median over repeats of each side).
    Target: ratio >= 0.95 (the snapshots cost at most 5% of throughput). On a noisy 2-core
    machine the min-max ranges can be wider than the effect: check them before concluding.

    python benchmarks/snapshot_cost.py            # 3 pairs, 10 s counted per run, and --kill
    python benchmarks/snapshot_cost.py --quick    # 1 pair, 6 s counted per run
    python benchmarks/snapshot_cost.py --no-kill  # the throughput pairs only
"""

from __future__ import annotations

import argparse
import os
import signal
import time

import _common  # noqa: F401 - sets TF_CPP_MIN_LOG_LEVEL and sys.path before nbdist loads
from _common import median, spread, table
from _training import CELL, FOREVER_EPOCHS, Sampler

WORKERS = 2
SNAPSHOT_S = "2"  # the default of NBDIST_HUB_SNAPSHOT_S


def _engine_and_hub_pids() -> list[int]:
    """On an engine: its own process id, then those of the hub processes it supervises."""
    import os as _os

    from nbdist.hub.launch import hub_process, running_hubs

    return [_os.getpid(), *(p.pid for p in (hub_process(*k) for k in running_hubs()) if p)]


def hub_pids(cluster, engine: int) -> list[int]:
    """The hub engine's process id and its hub processes' (asked while it is idle)."""
    return cluster.client[engine].apply_sync(_engine_and_hub_pids)


def cpu_seconds(pids: list[int]) -> float:
    import psutil

    total = 0.0
    for pid in pids:
        try:
            total += sum(psutil.Process(pid).cpu_times()[:2])
        except psutil.Error:
            pass
    return total


class SnapshotTimer:
    """Wraps a run's `HubControl.state` to time each call and count its bytes."""

    def __init__(self, control):
        self.times: list[float] = []
        self.nbytes: list[int] = []
        inner = control.state

        def timed():
            t0 = time.perf_counter()
            shards = inner()
            self.times.append(time.perf_counter() - t0)
            self.nbytes.append(sum(a.nbytes for _, arrays in shards for a in arrays))
            return shards

        control.state = timed


def measure(cluster, snapshots: bool, batch: int, warm: float, seconds: float) -> dict:
    import nbdist

    os.environ["NBDIST_HUB_SNAPSHOT_S"] = SNAPSHOT_S if snapshots else "0"
    run = nbdist.train(CELL, cluster=cluster, namespace={}, workers=WORKERS, epochs=FOREVER_EPOCHS,
                       batch_size=batch, algorithm="asgd", no_validation=True, timeout=120)
    timer = SnapshotTimer(run.state.control)
    sampler = Sampler(run)
    with run:  # an error or Ctrl-C stops the run on the way out
        sampler.wait_first_push(run)
        pids = hub_pids(cluster, run.hubs[0]["engine"])
        time.sleep(warm)
        cpu0, steps0, t0 = cpu_seconds(pids), _steps(run), time.monotonic()
        time.sleep(seconds)
        cpu1, steps1, t1 = cpu_seconds(pids), _steps(run), time.monotonic()
        run.stop()
        run.wait(120)
    return {"rate": sampler.rate(t0, t1), "hub_cpu": (cpu1 - cpu0) / max(1, steps1 - steps0),
            "snap_s": median(timer.times), "snap_mb": median(timer.nbytes) / 1e6,
            "snaps": len(timer.times)}


def _steps(run) -> int:
    return int(sum(n["steps"] for n in run.state.snapshot.get("nodes", [])))


def recovery(cluster, batch: int) -> dict:
    """One run whose hub shard's process and engine are killed mid-run: how long until it
    trains again, and what it lost."""
    import nbdist

    os.environ["NBDIST_HUB_SNAPSHOT_S"] = SNAPSHOT_S
    run = nbdist.train(CELL, cluster=cluster, namespace={}, workers=WORKERS, epochs=2,
                       batch_size=batch, algorithm="asgd", timeout=120)
    sampler = Sampler(run)
    with run:
        sampler.wait_first_push(run)
        time.sleep(6.0)
        pids = hub_pids(cluster, run.hubs[0]["engine"])
        step_before = _steps(run)
        killed = time.monotonic()
        for pid in reversed(pids):  # the hub process, then its engine
            os.kill(pid, signal.SIGKILL)
        while not run.state.recoveries and not run.done():
            time.sleep(0.05)
        served = time.monotonic()
        row = dict(run.state.recoveries[0]) if run.state.recoveries else {}
        revision = run.state.revision
        while not run.done() and run.state.revision == revision:  # a poll of the new shards
            time.sleep(0.05)
        restarted_at = run.stats.get("global_step", 0)  # (a new shard 0 counts on from its own)
        while not run.done() and run.stats.get("global_step", 0) <= restarted_at:
            time.sleep(0.05)
        trained = time.monotonic()
        run.wait(600)
    seen = served - row.get("recovery_s", float("nan"))
    return {"status": run.status, "error": run.error, "seen_s": seen - killed,
            "served_s": served - killed, "trained_s": trained - killed,
            "updates_lost": row.get("updates_lost"), "snapshot_age_s": row.get("snapshot_age_s"),
            "steps_before": step_before, "engine": row.get("engine")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 pair, 6 s counted per run")
    parser.add_argument("--repeats", type=int, default=None, help="pairs (default 3; 1 --quick)")
    parser.add_argument("--seconds", type=float, default=None,
                        help="counted seconds per run (default 10; 6 with --quick)")
    parser.add_argument("--warm", type=float, default=4.0,
                        help="seconds after the first push not counted")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--no-kill", action="store_true", help="skip the recovery run")
    args = parser.parse_args()
    repeats = args.repeats or (1 if args.quick else 3)
    seconds = args.seconds or (6.0 if args.quick else 10.0)
    print(f"snapshot_cost: 784-256-256-10 MLP on Fashion-MNIST, async ASGD, {WORKERS} workers, "
          f"batch {args.batch}, {repeats} pair(s), {args.warm:g} s warm + {seconds:g} s counted "
          f"per run, snapshots every {SNAPSHOT_S} s against none", flush=True)
    runs: dict[bool, list[dict]] = {True: [], False: []}
    cluster, rec = None, None
    try:
        import nbdist

        cluster = nbdist.Cluster.start(WORKERS + 2)  # hub, workers, and a spare for --kill
        measure(cluster, False, args.batch, 0.5, 0.5)  # untimed: TensorFlow and the data load
        for rep in range(repeats):
            for snapshots in ([True, False] if rep % 2 == 0 else [False, True]):
                r = measure(cluster, snapshots, args.batch, args.warm, seconds)
                runs[snapshots].append(r)
                print(f"  [{rep + 1}/{repeats}] {'snapshots' if snapshots else 'none':<9} "
                      f"{r['rate']:>8,.0f} samples/s  hub CPU {r['hub_cpu'] * 1e6:,.0f} us/push"
                      + (f"  {r['snaps']} snapshots of {r['snap_mb']:.2f} MB, "
                         f"{r['snap_s'] * 1e3:.1f} ms each" if snapshots else ""), flush=True)
        if not args.no_kill:
            rec = recovery(cluster, args.batch)
    finally:
        os.environ.pop("NBDIST_HUB_SNAPSHOT_S", None)
        if cluster is not None:
            cluster.stop()

    with_, without = (median([r["rate"] for r in runs[s]]) for s in (True, False))
    rows = [["none", without, spread([r["rate"] for r in runs[False]]), 1.0,
             median([r["hub_cpu"] for r in runs[False]]) * 1e6, "", ""],
            [f"every {SNAPSHOT_S} s", with_, spread([r["rate"] for r in runs[True]]),
             with_ / without, median([r["hub_cpu"] for r in runs[True]]) * 1e6,
             median([r["snap_s"] for r in runs[True]]) * 1e3,
             median([r["snap_mb"] for r in runs[True]])]]
    print()
    print(table(["snapshots", "samples/s", "range", "ratio", "hub CPU us/push",
                 "ms per snapshot", "MB per snapshot"], rows))
    print(f"\nratio {with_ / without:.3f} (target >= 0.95)")
    if rec is not None:
        print(f"\nrecovery: hub shard 0's process and engine killed after {rec['steps_before']:,} "
              f"pushes; the kernel saw the loss after {rec['seen_s']:.1f} s, engine "
              f"{rec['engine']} served it from the snapshot of {rec['snapshot_age_s']} s before "
              f"after {rec['served_s']:.1f} s, the first push after it came {rec['trained_s']:.1f}"
              f" s after the kill; {rec['updates_lost']} updates lost; the run {rec['status']}"
              + (f" ({rec['error']})" if rec["error"] else ""))


if __name__ == "__main__":
    main()
