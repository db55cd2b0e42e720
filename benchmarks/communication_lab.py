"""Which way of training reaches the target first, and with how many bytes, on an emulated
1 Gbit/s lab network: sync, ASGD, DiLoCo, streaming DiLoCo and top-k with error feedback, with
`nbdist.sweep`.

What it measures
    A lab network on this machine (tests/lab_network.py; needs root): one host per engine,
    lab1..lab5, each host's link shaped to `--rate` (netem where the kernel has it, else tbf).
    A controller started by hand on the head, one `ipengine` per host: async puts its hub on
    lab1 and its 4 workers on lab2..lab5; sync's 4 ranks take 4 of the hosts. The 784-256-256-10
    MLP (SGD 0.05) on Fashion-MNIST, batch 64 per worker (sync's ranks share it, 16 each, as
    `--mode sync` does with a fit call's batch), `--passes` passes over the data,
    validated on the test split `--evals-per-pass` times a pass (the cell's own `fit` call, its
    `steps_per_epoch` making an epoch that part of a pass, so that the time to the target is
    not rounded up to a whole pass); each way of training once per seed, and one worker alone
    (async) for the speed-ups. The table is `nbdist.sweep`'s: seconds from the first push to
    the first validation at `--target`, the bytes moved by then (counted at the workers'
    sockets; sync's allreduce modelled as a ring, 2 (M - 1) gradient buffers a step), the
    final accuracy, and the speed-up and efficiency against one worker.

    sudo python benchmarks/communication_lab.py                 # ~6 min on 2 cores
    sudo python benchmarks/communication_lab.py --passes 2 --target 0.75
    sudo python benchmarks/communication_lab.py --predict       # and the simulator's table

The simulator's prediction (`--predict`, a few minutes more)
    The same sweep again in `--mode simulate`, with the lab's links (`--sim bandwidth=1000,
    latency=0.2`: each host's rate and delay, as netem shapes them) and, for each way of
    training, what its parts cost on this machine:
    - `per_step`: the fixed cost of a call of the cell's step, timed here alone (the fastest,
      `nbdist.modes.simulate.calibrate.step_points`); evaluations pay it per batch;
    - `per_sample`: the rest of the compute per step its measured run's workers reported, per
      sample (on 2 cores shared by 5 processes a step takes longer than it does alone);
    - `per_push` (the hub's work on each push, one at a time): the hub's CPU per push for
      the method's codec and this model's size, timed here through a real hub over loopback
      (`nbdist.modes.simulate.calibrate.hub_costs`), times the run's contention (its compute
      per sample against the one-worker run's): the hub shares the cores as the workers do.
    It prints the time and bytes to the target both ways and their ratio: what the
    simulator's clock (compute, evaluations, bytes over links, the hub's queue) leaves out is
    the rest.
    streaming-diloco has no row there: the simulator does not model fragments.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from pathlib import Path

import _common  # noqa: F401 - sets TF_CPP_MIN_LOG_LEVEL and sys.path before nbdist loads
from _common import REPO
from _training import CELL

sys.path.insert(0, str(REPO / "tests"))
from lab_network import LabCluster, LabNetwork, rate_bits, unavailable

WORKERS = 4
BATCH = 64
NUM_SAMPLES = 60000  # Fashion-MNIST's training split
# the cell's own fit call: epochs of `steps` batches (part of a pass over the data), each
# validated on the test split (in the kernel, as a fit call does)
FIT = ("model.fit(x_train, y_train, batch_size=64, epochs={epochs}, steps_per_epoch={steps}, "
       "validation_data=(x_test, y_test), verbose=0)\n")
# the ways of training: each a point of the sweep
METHODS = [
    {"mode": "sync"},
    {"algorithm": "asgd", "transport": "tcp"},
    {"algorithm": "diloco", "local_steps": 50, "transport": "tcp"},
    # one fragment of 4 every 13 steps (each synced every 52), one step trained while in flight
    {"algorithm": "streaming-diloco", "local_steps": 50, "transport": "tcp"},
    {"algorithm": "asgd", "compression": "topk:0.01", "transport": "tcp"},
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", default="1gbit")
    parser.add_argument("--passes", type=int, default=3, help="passes over the training data")
    parser.add_argument("--evals-per-pass", type=int, default=4,
                        help="validations per pass (each epoch of the fit call is that part of "
                             "a pass)")
    parser.add_argument("--target", type=float, default=0.80)
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--predict", action="store_true",
                        help="also run the sweep in the simulator, with the lab's links")
    args = parser.parse_args()
    reason = unavailable()
    if reason:
        sys.exit(f"benchmarks/communication_lab.py: the lab network {reason}")
    import nbdist
    from nbdist.cluster.engines import Cluster

    steps = math.ceil(NUM_SAMPLES / BATCH / args.evals_per_pass)
    cell = CELL + FIT.format(epochs=args.passes * args.evals_per_pass, steps=steps)
    hosts = [f"lab{i}" for i in range(1, WORKERS + 2)]
    with LabNetwork(hosts=len(hosts), rate=args.rate) as lab, tempfile.TemporaryDirectory() as tmp:
        hand = LabCluster(lab, Path(tmp), hosts)
        hand.start()
        cluster = Cluster.connect(
            connection_file=str(hand.security / "ipcontroller-lab-client.json"))
        try:
            result = nbdist.sweep(cell, METHODS, target=args.target,
                                  seeds=[int(s) for s in args.seeds.split(",")],
                                  cluster=cluster, workers=WORKERS, timeout=120)
        finally:
            cluster.stop()
        shaping, delay_ms = lab.shaping, lab.delay_ms if lab.shaping.startswith("netem") else 0.0
    table = result.table
    table = table.assign(MB_to_target=(table["bytes_to_target"] / 1e6).round(1))
    print()
    print(f"Links: {shaping}; {WORKERS} workers, batch {BATCH} each (sync's ranks share it), "
          f"{args.passes} passes, "
          f"validated {args.evals_per_pass} times a pass; target val_accuracy >= "
          f"{args.target:g}.")
    shown = table[["point", "reached", "time_to_target", "MB_to_target", "bytes_source", "final",
                   "speedup", "efficiency"]]
    print(shown.to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    if args.predict:
        links = f"bandwidth={rate_bits(args.rate) / 1e6:g},latency={delay_ms:g}"
        predict(result, args, links, cell)


def predict(measured, args, links: str, cell: str) -> None:
    """The sweep again in the simulator: each method with its measured compute per sample and
    the hub's work per push for its codec (see the module docstring)."""
    import pandas as pd

    import nbdist
    from nbdist.modes.simulate.calibrate import hub_costs

    runs = measured.runs
    options = sorted({k for m in METHODS for k in m})
    # grid order, then the baseline; streaming-diloco's fragments are not simulated
    measured_rows = [(m, row) for m, row in zip([*METHODS, None], measured.table.itertuples(),
                                                strict=True)
                     if m is None or m.get("algorithm") != "streaming-diloco"]
    methods = [m for m, _ in measured_rows[:-1]]
    alone = _compute(runs, None, options)
    call_s, size = _call_cost()
    hub_s = {codec: hub_costs(size, codec)[1]
             for codec in {m.get("compression", "none") for m in [*methods, {}]}}

    def cost(method: dict | None) -> str:
        """The method's `--sim` cost: a call's fixed cost, the rest of its measured compute per
        sample (sync's ranks share the batch of 64), the hub's work per push."""
        method = method or {}
        compute = _compute(runs, method or None, options)
        sync = method.get("mode") == "sync"
        per_sample = max(0.0, compute - call_s / (BATCH // WORKERS if sync else BATCH))
        cost = f"{links},per_step={call_s:.3g},per_sample={per_sample:.3g}"
        if sync:  # no hub: the ring
            return cost
        per_push = hub_s[method.get("compression", "none")] * compute / alone
        return f"{cost},per_push={per_push:.3g}"

    points = []
    for method in methods:
        if method.get("mode") == "sync":
            points.append({"sim": f"sync=1,{cost(method)}"})
        else:
            points.append({**{k: v for k, v in method.items() if k != "transport"},
                           "sim": cost(method)})
    baseline = cost(None)
    simulated = nbdist.sweep(cell, points, target=args.target,
                             seeds=[int(s) for s in args.seeds.split(",")], mode="simulate",
                             workers=WORKERS, sim=baseline)
    sim_options = sorted({k for p in points for k in p})
    rows = []
    for (method, real), point, sim in zip(measured_rows, [*points, None],
                                          simulated.table.itertuples(), strict=True):
        rows.append({"method": real.point, "measured_s": real.time_to_target,
                     "predicted_s": sim.time_to_target,
                     "ratio": sim.time_to_target / real.time_to_target,
                     "measured_steps": _mean(runs, method, options, "step_to_target"),
                     "predicted_steps": _mean(simulated.runs, point, sim_options,
                                              "step_to_target"),
                     "measured_ms_per_step": 1e3 * _per_step(runs, method, options),
                     "predicted_ms_per_step": 1e3 * _per_step(simulated.runs, point, sim_options),
                     "measured_MB": real.bytes_to_target / 1e6,
                     "predicted_MB": sim.bytes_to_target / 1e6,
                     "sim": (point or {"sim": baseline})["sim"]})
    print()
    print(f"The simulator's prediction ({links}; per_step: a call's cost alone; per_sample: the "
          f"rest of each method's measured compute; per_push: the hub's work per push for its "
          f"codec, scaled by the run's contention):")
    print(pd.DataFrame(rows).to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    print(f"Validation runs {args.evals_per_pass} times a pass, so the time to the target moves "
          "by that part of a pass where one side reached it a validation later (the steps "
          "columns); the clock's own error is the ms per step.")


def _call_cost() -> tuple[float, int]:
    """The fixed cost of one call of the cell's gradient step, timed in this process alone (the
    fastest of many, fitted over three batch sizes: `--sim calibrate=1`'s measurement), and
    the model's weight count."""
    from nbdist.core.simclock import fit_cost
    from nbdist.engine.flat_layout import ensure_built, read_flat
    from nbdist.engine.flatmodel import FlatModel
    from nbdist.modes.simulate.calibrate import step_points

    namespace: dict = {}
    exec(CELL, namespace)  # noqa: S102 - the benchmark's own cell: its model and data
    model, x, y = namespace["model"], namespace["x_train"], namespace["y_train"]
    ensure_built(model, x[:2])
    params, non_trainable = read_flat(model)
    fitted = fit_cost(step_points(FlatModel(model), params, non_trainable, x[:1024], y[:1024],
                                  BATCH))
    return fitted.per_step_s, int(params.size)


def _mean(runs, method: dict | None, options: list[str], column: str) -> float:
    """The mean of `column` over `method`'s runs in `runs` (None: the baseline's)."""
    rows = runs[runs["baseline"].fillna(False).astype(bool) == (method is None)]
    for name in options:
        if name not in rows:
            continue
        wanted = (method or {}).get(name)
        rows = rows[rows[name].isna()] if wanted is None else rows[rows[name] == wanted]
    return float(rows[column].mean())


def _per_step(runs, method: dict | None, options: list[str]) -> float:
    """Seconds per step up to the target: its time over its step."""
    return (_mean(runs, method, options, "time_to_target")
            / _mean(runs, method, options, "step_to_target"))


def _compute(runs, method: dict | None, options: list[str]) -> float:
    """The mean compute per sample of `method`'s measured runs (None: the baseline's)."""
    value = _mean(runs, method, options, "compute_per_sample_s")
    if math.isnan(value):
        sys.exit(f"benchmarks/communication_lab.py: no measured run of {method or 'the baseline'}")
    return value


if __name__ == "__main__":
    main()
