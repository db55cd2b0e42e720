"""Which way of training reaches the target first, and with how many bytes, on an emulated
1 Gbit/s lab network: sync, ASGD, DiLoCo and top-k with error feedback, with `nbdist.sweep`.

What it measures
    A lab network on this machine (tests/lab_network.py; needs root): one host per engine,
    lab1..lab5, each host's link shaped to `--rate` (netem where the kernel has it, else tbf).
    A controller started by hand on the head, one `ipengine` per host: async puts its hub on
    lab1 and its 4 workers on lab2..lab5; sync's 4 ranks take 4 of the hosts. The 784-256-256-10
    MLP (SGD 0.05) on Fashion-MNIST, batch 64 per worker, `--epochs` epochs, validation on the
    test split at each epoch's end; each way of training once per seed, and one worker alone
    (async) for the speed-ups. The table is `nbdist.sweep`'s: seconds from the first push to
    the first validation at `--target`, the bytes moved by then (counted at the workers'
    sockets; sync's allreduce modelled as a ring, 2 (M - 1) gradient buffers a step), the
    final accuracy, and the speed-up and efficiency against one worker.

    sudo python benchmarks/communication_lab.py                 # ~6 min on 2 cores
    sudo python benchmarks/communication_lab.py --epochs 2 --target 0.75
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import _common  # noqa: F401 - sets TF_CPP_MIN_LOG_LEVEL and sys.path before nbdist loads
from _common import REPO
from _training import CELL

sys.path.insert(0, str(REPO / "tests"))
from lab_network import LabCluster, LabNetwork, unavailable

WORKERS = 4
# the ways of training: each a point of the sweep
METHODS = [
    {"mode": "sync"},
    {"algorithm": "asgd", "transport": "tcp"},
    {"algorithm": "diloco", "local_steps": 50, "transport": "tcp"},
    {"algorithm": "asgd", "compression": "topk:0.01", "transport": "tcp"},
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", default="1gbit")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--target", type=float, default=0.80)
    parser.add_argument("--seeds", default="0")
    args = parser.parse_args()
    reason = unavailable()
    if reason:
        sys.exit(f"benchmarks/communication_lab.py: the lab network {reason}")
    import nbdist
    from nbdist.cluster.engines import Cluster

    hosts = [f"lab{i}" for i in range(1, WORKERS + 2)]
    with LabNetwork(hosts=len(hosts), rate=args.rate) as lab, tempfile.TemporaryDirectory() as tmp:
        hand = LabCluster(lab, Path(tmp), hosts)
        hand.start()
        cluster = Cluster.connect(
            connection_file=str(hand.security / "ipcontroller-lab-client.json"))
        try:
            result = nbdist.sweep(CELL, METHODS, target=args.target,
                                  seeds=[int(s) for s in args.seeds.split(",")],
                                  cluster=cluster, workers=WORKERS, epochs=args.epochs,
                                  batch_size=64, timeout=120)
        finally:
            cluster.stop()
        shaping = lab.shaping
    table = result.table
    table = table.assign(MB_to_target=(table["bytes_to_target"] / 1e6).round(1))
    print()
    print(f"Links: {shaping}; {WORKERS} workers, batch 64 each, {args.epochs} epochs; target "
          f"val_accuracy >= {args.target:g}.")
    shown = table[["point", "reached", "time_to_target", "MB_to_target", "bytes_source", "final",
                   "speedup", "efficiency"]]
    print(shown.to_string(index=False, float_format=lambda v: f"{v:.3g}"))


if __name__ == "__main__":
    main()
