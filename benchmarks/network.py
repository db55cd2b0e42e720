"""Training across emulated hosts: async against sync, float32 against compressed frames.

What it measures
    A lab network on this machine (tests/lab_network.py; needs root): the hub on host lab1,
    2 or 4 workers on hosts lab2..lab5, each host's link shaped to `--rates` (default 1gbit and
    10gbit; netem where the kernel has it, else tbf: rate only). A controller started by hand on
    the head, one `ipengine` per host. The 784-256-256-10 MLP (SGD 0.05, batch `--batch` per
    worker) on Fashion-MNIST, each configuration trained for `--seconds` after a warm-up:

      async / async CODEC  the parameter hub (asgd), --compression none, then each of --codecs
      sync  / sync CODEC   Horovod across the worker hosts, --compression none, then each of
                           --codecs (fp16 and powersgd through allreduces, the others through
                           an allgather of every rank's frame)

    samples/s      all workers together, from the hub's per-worker sample counts (kernel polls)
    hub MB/s       bytes through the hub host's interface (rx + tx, /sys counters, whole window)
    link use       the busier direction of the hub's link, as a fraction of its rate: the
                   physical limit here (a 1.08 MB push + pull at 1 Gbit/s takes >= 17 ms)
    (sync has no hub: its hub columns show the busiest worker host's link instead.)

    sudo python benchmarks/network.py                    # ~10 min on 2 cores
    sudo python benchmarks/network.py --quick            # 1gbit, 2 workers, 8 s per run
    sudo python benchmarks/network.py --quick --codecs int8,topk:0.01 --modes async
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import _common  # noqa: F401 - sets TF_CPP_MIN_LOG_LEVEL and sys.path before nbdist loads
from _common import REPO, table
from _training import CELL, FOREVER_EPOCHS, Sampler

WARM = 2.0  # seconds after the first push before the window opens
sys.path.insert(0, str(REPO / "tests"))
from lab_network import LabCluster, LabNetwork, rate_bits, unavailable  # noqa: E402


def link_bytes(lab: LabNetwork, host: str) -> tuple[int, int]:
    """(rx, tx) byte counters of a host's lab interface."""
    out = lab.run(host,
                  ["cat", "/sys/class/net/eth0/statistics/rx_bytes",
                   "/sys/class/net/eth0/statistics/tx_bytes"])
    rx, tx = (int(v) for v in out.stdout.split())
    return rx, tx


def measure(cluster, lab, engines, hosts, mode, compression, seconds, batch):
    """(samples/s, bytes/s through the watched host, bytes/s of its busier direction), all over
    the same window: from `WARM` s after the first push, for `seconds`."""
    import nbdist

    run = nbdist.train(CELL, cluster=cluster.subset(engines), namespace={}, mode=mode,
                       workers=len(engines) - (mode == "async"), epochs=FOREVER_EPOCHS,
                       batch_size=batch, compression=compression, no_validation=True,
                       metrics="minimal", timeout=120)
    watched = hosts if mode == "sync" else hosts[:1]  # async: the hub's host; sync: every rank's
    sampler = Sampler(run)
    with run:  # an error or Ctrl-C stops the run on the way out
        sampler.wait_first_push(run)
        time.sleep(WARM)
        before, t0 = {h: link_bytes(lab, h) for h in watched}, time.monotonic()
        time.sleep(seconds)
        after, t1 = {h: link_bytes(lab, h) for h in watched}, time.monotonic()
        if run.done():
            raise RuntimeError("the run ended inside its window; raise FOREVER_EPOCHS")
        run.stop()
        run.wait(120)
    moved = [[b - a for a, b in zip(before[h], after[h], strict=True)] for h in watched]
    busiest = max(moved, key=max)
    return sampler.rate(t0, t1), sum(busiest) / (t1 - t0), max(busiest) / (t1 - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rates", default="1gbit,10gbit")
    parser.add_argument("--workers", default="2,4")
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--codecs", default="fp16",
                        help="--compression values to run besides none, in every mode")
    parser.add_argument("--modes", default="async,sync")
    args = parser.parse_args()
    if args.quick:
        args.rates, args.workers, args.seconds = "1gbit", "2", 8.0
    reason = unavailable()
    if reason:
        sys.exit(f"benchmarks/network.py: the lab network {reason}")
    worker_counts = [int(w) for w in args.workers.split(",")]
    hosts = ["lab1"] + [f"lab{i}" for i in range(2, 2 + max(worker_counts))]
    rows = []
    for rate in args.rates.split(","):
        capacity = rate_bits(rate) / 8
        with LabNetwork(hosts=len(hosts), rate=rate) as lab, tempfile.TemporaryDirectory() as tmp:
            from nbdist.cluster.engines import Cluster

            hand = LabCluster(lab, Path(tmp), hosts)
            hand.start()
            cluster = Cluster.connect(
                connection_file=str(hand.security / "ipcontroller-lab-client.json"))
            try:
                for n in worker_counts:
                    for mode in args.modes.split(","):
                        engines = (list(range(0, n + 1)) if mode == "async"
                                   else list(range(1, n + 1)))
                        used = [hosts[e] for e in engines]
                        codecs = [c for c in args.codecs.split(",") if c]
                        for compression in ("none", *codecs):
                            sps, bps, busiest = measure(cluster, lab, engines, used, mode,
                                                        compression, args.seconds, args.batch)
                            rows.append([rate, n, mode + ("" if compression == "none"
                                                          else f" {compression}"),
                                         round(sps), round(bps / 1e6, 1),
                                         f"{busiest / capacity:.2f}"])
                            print(*rows[-1], flush=True)
            finally:
                cluster.stop()
            shaping = lab.shaping
    print()
    print(f"Links: {shaping.replace(args.rates.split(',')[-1], 'R')}; batch {args.batch} per "
          f"worker; {args.seconds:g} s per run after a 2 s warm-up.")
    print(table(["link", "workers", "mode", "samples/s", "hub MB/s", "link use"], rows))


if __name__ == "__main__":
    main()
