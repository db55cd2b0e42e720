"""The parity matrix: classic cells, each with its own `model.fit(...)` call, trained by plain
Keras and by nbdist's modes on the same seeds, in one process run.

Rows are MODEL:OPTIMIZER (the cells of tests/tutorial_cells.py `parity_cell`: an MLP, the same
with MaxNorm constraints, a CNN with BatchNorm and Dropout, an Embedding + LSTM; the optimizers
of `PARITY_OPTIMIZERS`). Columns are modes:
    async2, async4   --mode async with 2 or 4 workers (the default rule, asgd)
    sim2, sim4       --mode simulate with 2 or 4 virtual workers (no cluster, deterministic)
    sync2            --mode sync with 2 Horovod ranks
    local            --mode local (one worker in this kernel)
For every row, mode and seed it prints the test accuracy against fit's on the same seed; then
per row and mode the mean gap and the worst run's, and whether every run held the bar (at least
fit − 0.03: landing above fit is fine).

    python benchmarks/parity_matrix.py                                  # the whole matrix
    python benchmarks/parity_matrix.py --rows mlp:momentum --modes async2 --seeds 0 1 2 3 4
    python benchmarks/parity_matrix.py --rows bn-cnn:sgd --modes async2 --seeds $(seq 0 19) \\
        --option momentum_correction=false                              # extra train() options
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np
from _common import REPO, table  # puts the checkout on the path first

sys.path.insert(0, str(REPO))  # the tests' cells and helpers
from tests.parity import BAR, accuracy
from tests.tutorial_cells import parity_cell

MODES = {
    "async2": {"mode": "async", "workers": 2},
    "async4": {"mode": "async", "workers": 4},
    "sim2": {"mode": "simulate", "workers": 2},
    "sim4": {"mode": "simulate", "workers": 4},
    "sync2": {"mode": "sync", "workers": 2},
    "local": {"mode": "local"},
}
CLUSTER_ENGINES = {"async2": 3, "async4": 5, "sync2": 2}  # a hub shard + workers, or ranks
DEFAULT_ROWS = [f"mlp:{o}" for o in ("sgd", "momentum", "nesterov", "rmsprop", "adam", "adamw")] + [
    f"{m}:{o}" for m in ("bn-cnn", "lstm", "maxnorm") for o in ("momentum", "adam")]


def parse_option(text: str) -> tuple[str, object]:
    name, _, value = text.partition("=")
    lowered = value.lower()
    if lowered in ("true", "false"):
        return name, lowered == "true"
    try:
        return name, int(value)
    except ValueError:
        try:
            return name, float(value)
        except ValueError:
            return name, value


def run_detail(run, model) -> str:
    """A run's delays, the order of its last pushes and the BatchNorm statistics it ended
    with (the first layer's mean moving variance), for telling one run's ending from another's."""
    history = run.history
    pushes = history[history["worker"].notna()] if "worker" in history else history
    last = " ".join(f"{int(w)}:{int(d)}" for w, d in
                    zip(pushes["worker"].tail(8), pushes["delay"].tail(8), strict=True))
    delays = pushes["delay"]
    text = (f"pushes {len(pushes)}, delay mean {delays.mean():.2f} max {int(delays.max())}, "
            f"last pushes (worker:delay) {last}")
    for layer in model.layers:
        if type(layer).__name__ == "BatchNormalization":
            variance = float(np.asarray(layer.moving_variance).mean())
            text += f", first BatchNorm's mean moving variance {variance:.4f}"
            break
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", nargs="+", default=DEFAULT_ROWS, help="MODEL:OPTIMIZER")
    parser.add_argument("--modes", nargs="+", default=["async2", "async4", "sync2", "local"],
                        choices=sorted(MODES))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--detail", action="store_true",
                        help="per nbdist run: its delays, its last pushes (worker:delay) and the "
                        "BatchNorm statistics it ends with")
    parser.add_argument("--option", action="append", default=[], metavar="NAME=VALUE",
                        help="an extra nbdist.train option for every nbdist run")
    args = parser.parse_args()
    import sys

    sys.path.insert(0, str(REPO))
    import nbdist

    extra = dict(parse_option(o) for o in args.option)
    engines = max((CLUSTER_ENGINES.get(m, 0) for m in args.modes), default=0)
    cluster = nbdist.Cluster.start(engines) if engines else None
    results: dict[tuple[str, str], list[tuple[int, float, float]]] = {}
    warned: dict[tuple[str, str], set[str]] = {}
    started = time.perf_counter()
    try:
        for row in args.rows:
            cell = parity_cell(*row.split(":"))
            for seed in args.seeds:
                fit, _ = accuracy(cell, seed)
                for mode in args.modes:
                    ns: dict = {}
                    acc, run = accuracy(cell, seed, cluster, ns, **MODES[mode], **extra)
                    results.setdefault((row, mode), []).append((seed, fit, acc))
                    warned.setdefault((row, mode), set()).update(
                        w.split(":")[0] for w in run.warnings)
                    print(f"  {row:<16} {mode:<7} seed {seed}: fit {fit:.4f}  nbdist {acc:.4f}"
                          f"  gap {acc - fit:+.4f}", flush=True)
                    if args.detail and run is not None:
                        print("    " + run_detail(run, ns["model"]), flush=True)
    finally:
        if cluster is not None:
            cluster.stop()
    rows = []
    for (row, mode), runs in results.items():
        gaps = [acc - fit for _, fit, acc in runs]
        rows.append([row, mode, f"{statistics.mean(f for _, f, _ in runs):.4f}",
                     f"{statistics.mean(a for _, _, a in runs):.4f}",
                     f"{statistics.mean(gaps):+.4f}", f"{min(gaps):+.4f}",
                     f"{statistics.stdev(gaps):.4f}" if len(gaps) > 1 else "-",
                     "yes" if min(gaps) >= -BAR else "NO",
                     "; ".join(sorted(warned[(row, mode)]))[:60]])
    print(table(["row", "mode", "fit", "nbdist", "mean gap", "worst gap", "sd gap",
                 f">= fit-{BAR}", "warnings"], rows))
    print(f"{len(args.seeds)} seeds, {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
