"""How much memory peers without the run's key can make a hub hold, while a worker trains.

What it measures
    A hub shard of `--params` float32 (default 269,322: the 784-256-256-10 MLP) in its own
    process, as nbdist runs it, and one NumPy worker stepping against it over TCP. For each
    attack, a fresh hub: the hub's RSS is read from outside (psutil) every 50 ms while the
    attack runs `--seconds`; growth is the peak over the RSS after the worker's first steps.
    The attackers (tests/hostile.py) run in processes of their own, on loopback:
      keyless     128 ZeroMQ peers without credentials, each queuing 8 messages of 6 x 1 MB
                  frames, and 700 connections sending random bytes (issue 29's flood);
      pending     512 raw peers, each sending all but the last KB of one handshake command of
                  `--pending-mb` (default 8 bytes per parameter, just under the hub's frame
                  limit), then waiting (reconnecting at once when cut);
      multipart   one raw peer that finishes the handshake if it can and then sends frames
                  flagged "more" without end (stopped at `--multipart-gb`).
    steps       the worker's steps during the attack (it must keep training);
    refused     what the hub counted: messages dropped, connections refused or cut.

    python benchmarks/flood.py                       # every attack, 10 s each
    python benchmarks/flood.py --attacks pending --seconds 5
"""

from __future__ import annotations

import argparse
import sys
import threading
import time

import _common  # noqa: F401 - sys.path before nbdist loads
import numpy as np
import psutil
from _common import REPO, table

sys.path.insert(0, str(REPO))
from tests.hostile import Flood  # after the path is set

ATTACKS = {
    "keyless": [("keyless", {"peers": 128, "messages": 8, "frames": 6, "frame_bytes": 1 << 20}),
                ("garbage", {"peers": 700})],
    "pending": [("pending", {"peers": 512})],
    "multipart": [("multipart", {})],
}


def start_hub(params: int):
    from nbdist.core.coordinator import Plan
    from nbdist.hub.launch import _ProcessHub
    from nbdist.hub.protocol import new_key
    from nbdist.hub.server import HubSpec

    key = new_key()
    plan = Plan(num_workers=1, num_samples=10**9, epochs=1, batch_size=10, lr=0.01,
                has_validation=False)
    spec = HubSpec("flood", key, 0, 1, plan, np.ones(params, np.float32), np.zeros(0, np.float32),
                   idle_timeout=600)
    return key, _ProcessHub(spec)


class Worker(threading.Thread):
    """A NumPy worker pushing and pulling over TCP until told to stop."""

    def __init__(self, key: bytes, endpoints: dict, params: int):
        super().__init__(daemon=True)
        from nbdist.hub.client import WorkerTransport

        self.transport = WorkerTransport(key, 0, [endpoints], 0, transport="tcp", timeout=120)
        self.chunk = self.transport.hello().chunks[0].id
        self.transport.grad[:] = np.float32(1e-6)
        self.steps, self.error, self.halt = 0, None, threading.Event()

    def run(self) -> None:
        from nbdist.wire.messages import Step

        try:
            while not self.halt.is_set():
                self.transport.step(Step(0, push=True, pull=True, loss=0.5,
                                         chunks=[self.chunk] if self.steps == 0 else []))
                self.steps += 1
        except Exception as exc:  # noqa: BLE001 - reported in the table
            self.error = f"{type(exc).__name__}: {exc}"

    def stop(self) -> None:
        self.halt.set()
        self.join(150)
        self.transport.close()


def measure(attack: str, params: int, seconds: float, multipart_bytes: int,
            pending_bytes: int) -> dict:
    from nbdist.hub.control import HubControl

    key, hub = start_hub(params)
    proc = psutil.Process(hub.proc.pid)
    worker = Worker(key, hub.endpoints, params)
    worker.start()
    while worker.steps < 20 and worker.is_alive():
        time.sleep(0.05)
    base = peak = proc.memory_info().rss
    steps0 = worker.steps
    sizes = {"multipart": {"limit": multipart_bytes}, "pending": {"frame_bytes": pending_bytes}}
    floods = [Flood(kind, hub.endpoints["tcp"], **sizes.get(kind, {}), **options)
              for kind, options in ATTACKS[attack]]
    for flood in floods:
        flood.__enter__()
    end = time.monotonic() + seconds
    while time.monotonic() < end and hub.alive():
        peak = max(peak, proc.memory_info().rss)
        time.sleep(0.05)
    steps = worker.steps - steps0
    for flood in floods:
        flood.__exit__(None, None, None)
    worker.stop()
    control = HubControl(key, [hub.endpoints], name="flood-probe", timeout=60)
    try:
        dropped = control.stats().get("dropped", {})
        control.shutdown()
    finally:
        control.close()
    hub.join(30)
    return {"growth": (peak - base) / 2**20, "base": base / 2**20, "steps": steps,
            "worker_error": worker.error, "dropped": dropped,
            "attack": {k: v for f in floods for k, v in f.stats.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", type=int, default=269_322,
                        help="float32 parameters of the hub shard")
    parser.add_argument("--seconds", type=float, default=10.0, help="how long each attack runs")
    parser.add_argument("--attacks", default=",".join(ATTACKS),
                        help=f"comma-separated, of {', '.join(ATTACKS)}")
    parser.add_argument("--multipart-gb", type=float, default=1.5,
                        help="the endless multipart peer stops here")
    parser.add_argument("--pending-mb", type=float, default=None,
                        help="each pending peer's handshake command (default 8 bytes per "
                             "parameter, just under the hub's frame limit of 8 bytes per "
                             "parameter + 1.06 MiB)")
    args = parser.parse_args()
    print(f"flood: hub of {args.params:,} float32 in its own process, one TCP worker, "
          f"{args.seconds:g} s per attack", flush=True)
    rows = []
    for attack in args.attacks.split(","):
        pending = int(args.pending_mb * 2**20) if args.pending_mb else 8 * args.params
        r = measure(attack, args.params, args.seconds, int(args.multipart_gb * 2**30), pending)
        print(f"  {attack:<10} RSS +{r['growth']:7.1f} MB over {r['base']:.0f} MB, worker steps "
              f"{r['steps']}{' (' + r['worker_error'] + ')' if r['worker_error'] else ''}, hub "
              f"counted {r['dropped']}, attackers {r['attack']}", flush=True)
        rows.append([attack, r["growth"], r["steps"], sum(r["dropped"].values()),
                     r["attack"].get("connections", 0), r["attack"].get("bytes sent", 0) / 2**20])
    print()
    print(table(["attack", "hub RSS growth MB", "worker steps", "hub refused", "connections",
                 "MB sent"], rows))


if __name__ == "__main__":
    main()
