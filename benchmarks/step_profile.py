"""Where a worker's step goes on the machine: CPU and run-queue wait per thread, per step.

What it measures
    The overhead.py MLP (784-256-256-10, SGD) on Fashion-MNIST, one worker engine and one hub
    engine (`nbdist.Cluster.start(2)`), batch 64 by default, once per `--pin` value (each on a
    fresh cluster, since TensorFlow's thread count is fixed when an engine first uses it).
    Between 20% and 80% of the run it reads the Linux scheduler's counters
    (/proc/PID/task/TID/schedstat: time on a CPU, time waiting on a run queue) of every thread
    of the worker engine, the hub's engine and the hub's own process, and divides by the
    steps in that window. It also prints the worker's own split (compute, comm) per step.

How to read it
    `cpu ms/step` is what a thread ran; `wait ms/step` is what it was ready but waited for a
    core (preempted or not yet scheduled): on a worker's TensorFlow threads that wait is
    compute time lost to the others (the hub's process, ipyparallel's threads). Threads are
    grouped by their name (TensorFlow's pool threads share one); `n` is how many.

    python benchmarks/step_profile.py                  # pin off and auto, batch 64
    python benchmarks/step_profile.py --pin off --batch 256 --steps 1500
    python benchmarks/step_profile.py --overlap        # overlap=True (opt-in: push step t while
                                                       # computing t+1)
"""

from __future__ import annotations

import argparse
import math
import os
import time
from collections import defaultdict

import _common  # noqa: F401 - sets TF_CPP_MIN_LOG_LEVEL and sys.path before nbdist loads
from _common import table
from overhead import CELL

WINDOW = (0.2, 0.8)


def threads_of(pid: int) -> dict[int, tuple[str, int, int]]:
    """{tid: (name, ns on a CPU, ns waiting to run)} of every thread of process `pid`."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                run_ns, wait_ns, _ = (int(v) for v in f.read().split())
        except OSError:  # the thread ended
            continue
        out[int(tid)] = (name, run_ns, wait_ns)
    return out


def snapshot(procs: dict[str, int]) -> dict[tuple[str, int], tuple[str, int, int]]:
    snap = {}
    for role, pid in procs.items():
        try:
            snap.update({(role, tid): v for tid, v in threads_of(pid).items()})
        except OSError:
            pass
    return snap


def profile(pin: str, batch: int, steps: int, overlap: bool) -> tuple[list, dict]:
    import psutil

    import nbdist

    cluster = nbdist.Cluster.start(2)
    try:
        pids = cluster.client[:].apply_sync(os.getpid)
        epochs = max(1, round(steps * batch / 60000))
        total = epochs * math.ceil(60000 / batch)
        run = nbdist.train(CELL, cluster=cluster, namespace={}, workers=1, servers=1, epochs=epochs,
                           batch_size=batch, no_validation=True, timeout=120, pin=pin,
                           overlap=overlap)
        a = b = None
        with run:
            while not run.done():
                nodes = run.nodes
                done = int(nodes.iloc[0]["steps"]) if len(nodes) else 0
                if a is None and done >= WINDOW[0] * total:
                    procs = {}
                    for pid in pids:
                        kids = [p for p in psutil.Process(pid).children()
                                if "nbdist.hub.process" in " ".join(p.cmdline())]
                        if kids:
                            procs["hub engine"], procs["hub process"] = pid, kids[0].pid
                        else:
                            procs["worker engine"] = pid
                    a = (nodes.iloc[0].to_dict(), snapshot(procs), time.perf_counter())
                elif a is not None and b is None and done >= WINDOW[1] * total:
                    b = (nodes.iloc[0].to_dict(), snapshot(procs), time.perf_counter())
                time.sleep(0.05)
            run.wait()
    finally:
        cluster.stop()
    if a is None or b is None:
        raise RuntimeError("the run ended before its measuring window; raise --steps")
    n = int(b[0]["steps"] - a[0]["steps"])
    groups: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    for key, (name, run_ns, wait_ns) in b[1].items():
        before = a[1].get(key, (name, 0, 0))
        g = groups[(key[0], name)]
        g[0] += (run_ns - before[1]) / n / 1e6
        g[1] += (wait_ns - before[2]) / n / 1e6
        g[2] += 1
    rows = sorted(([role, name, c, w, k] for (role, name), (c, w, k) in groups.items()
                   if c + w > 0.005),
                  key=lambda r: (r[0], -r[2]))
    split = {"wall": (b[2] - a[2]) / n * 1e3,
             "compute": (b[0]["compute_s"] - a[0]["compute_s"]) / n * 1e3,
             "comm": (b[0]["comm_s"] - a[0]["comm_s"]) / n * 1e3}
    return rows, split


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pin", choices=["off", "auto", "both"], default="both")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--overlap", action="store_true",
                        help="overlap=True (opt-in in nbdist); without it the worker's "
                             "compute and comm are a serial split of the step")
    args = parser.parse_args()
    for pin in (["off", "auto"] if args.pin == "both" else [args.pin]):
        rows, split = profile(pin, args.batch, args.steps, args.overlap)
        print(f"\npin={pin}, batch {args.batch}: per step wall {split['wall']:.2f} ms = worker "
              f"compute {split['compute']:.2f} + comm {split['comm']:.2f} + other "
              f"{split['wall'] - split['compute'] - split['comm']:.2f} ms")
        print(table(["process", "thread", "cpu ms/step", "wait ms/step", "n"], rows))
    print(f"\nload {os.getloadavg()[0]:.2f} (1 min); {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
