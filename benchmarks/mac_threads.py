"""Keyed BLAKE3 on one thread against blake3's own threads (`max_threads=AUTO`), 1-80 MB.

Every byte on nbdist's sockets is authenticated (`nbdist.hub.protocol.mac`); at 10M+
parameters one MAC pass is several milliseconds on one thread. blake3-py can hash one buffer
on several threads. This times one MAC of a buffer of each size both ways (least of
--repeats), once with the machine as it is and once while another process spins on one core
(as a worker computing next to the hub would), and prints the ratio. `protocol.mac` uses the
threads from `MAC_THREADS_MIN_BYTES` on; this table is what that threshold rests on.

    python benchmarks/mac_threads.py            # 1, 4, 10, 20, 40, 80 MB, 9 repeats
    python benchmarks/mac_threads.py --quick    # 1, 10, 40 MB, 5 repeats
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import time

import _common  # noqa: F401 - sys.path for a checkout
import numpy as np
from _common import table
from blake3 import blake3

from nbdist.hub.protocol import MAC_THREADS_MIN_BYTES, new_key


def _spin(stop) -> None:
    """Keep one core busy until `stop` is set (a worker's compute, for the MAC's purposes)."""
    x = 0
    while not stop.is_set():
        for _ in range(100_000):
            x += 1


def mac_ms(key: bytes, buf: np.ndarray, threads: int, repeats: int) -> float:
    view = memoryview(buf).cast("B")
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        blake3(view, key=key, max_threads=threads).digest()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def measure(sizes_mb: list[float], repeats: int) -> list[list[object]]:
    key, rows = new_key(), []
    for mb in sizes_mb:
        buf = np.ones(int(mb * 1e6) // 4, np.float32)
        one, auto = mac_ms(key, buf, 1, repeats), mac_ms(key, buf, blake3.AUTO, repeats)
        rows.append([mb, one, auto, one / auto])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1, 10 and 40 MB, 5 repeats")
    parser.add_argument("--repeats", type=int, default=None)
    args = parser.parse_args()
    sizes = [1, 10, 40] if args.quick else [1, 4, 10, 20, 40, 80]
    repeats = args.repeats or (5 if args.quick else 9)
    print(f"keyed BLAKE3, one MAC pass, least of {repeats}; {os.cpu_count()} cores; "
          f"load {os.getloadavg()[0]:.2f}", flush=True)
    idle = measure(sizes, repeats)
    ctx = mp.get_context("fork")
    stop = ctx.Event()
    spinner = ctx.Process(target=_spin, args=(stop,), daemon=True)
    spinner.start()
    try:
        time.sleep(0.2)
        busy = measure(sizes, repeats)
    finally:
        stop.set()
        spinner.join(5)
        if spinner.is_alive():
            spinner.kill()
    rows = [[*a, *b[1:]] for a, b in zip(idle, busy, strict=True)]
    print(table(["MB", "1 thread ms", "AUTO ms", "AUTO speed-up", "busy: 1 thread ms",
                 "busy: AUTO ms", "busy: speed-up"], rows))
    print(f"nbdist.hub.protocol.mac uses AUTO from {MAC_THREADS_MIN_BYTES / 1e6:g} MB per message "
          f"on; load {os.getloadavg()[0]:.2f} (1 min)")


if __name__ == "__main__":
    main()
