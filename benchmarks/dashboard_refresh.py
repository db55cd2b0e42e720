"""What the live dashboard costs the kernel: CPU time of its refresh, with 16 workers.

What it measures
    A Run fed, through its own `_absorb` (the monitor thread's path), a stream of hub stats
    replies shaped like a 16-worker async run: a poll every 0.25 s carrying `--pushes` new
    history rows per second, and every 2 s a bounded timeline (up to 256 rows per worker, as
    the hub down-samples it) and the delay histograms. The live Dashboard (real ipywidgets; each
    plot a PlotPanel anywidget whose figure trait is replaced; no kernel or browser attached, so
    the final JSON encoding of widget messages, ~1 ms per redrawn plot, is not counted) runs
    `refresh()` every 0.5 s, as the kernel's event loop does. The CPU time (time.process_time)
    of all refreshes over `--seconds` of simulated run, divided by those seconds, is the share
    of one core the dashboard takes. The baseline, in the same process run, is the text status
    line (`run.summary()` once a second): the least a live view can cost.

    The one-time import of plotly (for its template) is done before measuring.
    Data arrives faster than real time (no sleeping), so the numbers are pure refresh cost;
    at the default 16 workers x 50 pushes/s the history grows by 800 rows a second.

How to read it
    share = dashboard CPU seconds / simulated seconds. Target: under 5% of one core.
    ratio = dashboard CPU / text status line CPU (how much more the plots cost than text).

    python benchmarks/dashboard_refresh.py                 # 16 workers, 120 simulated seconds
    python benchmarks/dashboard_refresh.py --workers 32 --seconds 300
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from _common import table

from nbdist.config import TrainConfig
from nbdist.dashboard.widget import REFRESH_S, Dashboard
from nbdist.run.handle import Run
from nbdist.run.monitor import POLL_S, TIMELINE_EVERY_S, absorb

TIMELINE_ROWS = 256  # per worker, the hub's bound


def stats_stream(workers: int, seconds: float, pushes_per_s: float, seed: int = 0):
    """(time, reply) pairs: what the hub answers the kernel's polls during a run."""
    rng = np.random.default_rng(seed)
    speed = 1000.0 / (1 + np.arange(workers) % 4)  # four speed classes
    step = 0
    for i in range(int(seconds / POLL_S)):
        t = (i + 1) * POLL_S
        rows = []
        for _ in range(int(pushes_per_s * POLL_S)):
            w = int(rng.integers(workers))
            step += 1
            rows.append([t, step, t / 30, w, float(2 / (1 + t) + rng.random() * 0.1),
                         int(rng.integers(6)), 32])
        nodes = [{"worker": w, "engine": w + 1, "host": "localhost", "state": "running",
                  "samples": step * 2, "samples_per_s": float(speed[w]), "steps": step // workers,
                  "delay_mean": 2.0, "delay_p95": 4.0, "delay_max": 6, "batch_size": 32,
                  "slowdown": 1.0, "group": None, "loss": 0.5, "compute_s": 0.01, "comm_s": 0.001}
                 for w in range(workers)]
        reply = {"nodes": nodes, "history": rows, "paused": False, "lr": 0.05,
                 "batch_policy": "fixed", "global_step": step, "epochs_done": t / 30,
                 "delays": {str(w): {d: int(rng.integers(50)) for d in range(8)}
                            for w in range(workers)},
                 "events": [{"time": 5.0, "step": 100, "event": "set_lr", "lr": 0.05}],
                 "evals": [{"time": e, "step": int(e * pushes_per_s), "val_accuracy": 0.8,
                            "val_loss": 0.5}
                           for e in np.arange(30.0, t, 30.0)]}
        if i % int(TIMELINE_EVERY_S / POLL_S) == 0:
            times = np.linspace(0, t, min(TIMELINE_ROWS, 4 * (i + 1)))
            reply["timeline"] = [{"worker": w, "time": float(x),
                                  "samples_per_s": float(speed[w] * (0.9 + 0.2 * rng.random())),
                                  "batch_size": 32.0, "delay_mean": 2.0, "delay_p95": 4.0}
                                 for w in range(workers) for x in times]
        yield t, reply


def measure(workers: int, seconds: float, pushes_per_s: float, dashboard: bool) -> float:
    """CPU seconds the display spent over the simulated run."""
    run = Run(TrainConfig(), model=None, model_name="model")
    run.state.status = "running"
    view = Dashboard(run) if dashboard else None
    spent, next_refresh = 0.0, 0.0
    every = REFRESH_S if dashboard else 1.0
    for t, reply in stats_stream(workers, seconds, pushes_per_s):
        absorb(run, reply)
        if t >= next_refresh:
            next_refresh = t + every
            start = time.process_time()
            if view is not None:
                view.refresh()
            else:
                run.summary()
            spent += time.process_time() - start
    return spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=120.0, help="simulated run length")
    parser.add_argument("--pushes", type=float, default=50.0, help="pushes per second per worker")
    args = parser.parse_args()
    pushes = args.pushes * args.workers
    from nbdist.dashboard.plots import template

    template("plotly_white")  # a one-time plotly import (~1 s), not a refresh cost
    text = measure(args.workers, args.seconds, pushes, dashboard=False)
    live = measure(args.workers, args.seconds, pushes, dashboard=True)
    print(f"{args.workers} workers, {args.seconds:.0f} simulated s, {pushes:.0f} pushes/s in "
          f"total, refresh every {REFRESH_S} s (text: every 1 s)")
    print(table(["display", "CPU s", "share of one core %", "ratio to text"], [
        ["text status line", text, 100 * text / args.seconds, 1.0],
        ["live dashboard", live, 100 * live / args.seconds, live / text if text else float("nan")],
    ]))
    print(f"target: dashboard share < 5% -> {'met' if live / args.seconds < 0.05 else 'NOT met'}")


if __name__ == "__main__":
    main()
