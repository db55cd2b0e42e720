"""The hub's update threads: a small pool that runs a large push's blocks in parallel.

`nbdist.algorithms.blocks` cuts an elementwise update into contiguous blocks; NumPy releases
the GIL inside each operation, so a few threads move a 40 MB update at close to the memory
bandwidth instead of one core's. The pool belongs to the hub process (the core stays free of
threads); the hub's own thread runs the first block itself, so `threads` includes it.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

from nbdist.algorithms.blocks import BlockFn, Ranges, block_ranges
from nbdist.env import HUB_THREADS_MAX, switch


def update_threads() -> int:
    """Threads per shard: half the cores (the workers on this host need the other half), at
    most `HUB_THREADS_MAX`; `NBDIST_HUB_THREADS` overrides (1: one pass, no pool). On a 2-core
    machine that is 1: with the workers computing, there is no idle core for a second thread
    (measured: benchmarks/large_model.py, 2 threads 17.5 ms vs 1 thread 11.5 ms per 20M push)."""
    given = switch("NBDIST_HUB_THREADS")
    if given is not None:
        return given
    return max(1, min(HUB_THREADS_MAX, (os.cpu_count() or 1) // 2))


class BlockPool:
    """A runner for `Updater.use_blocks`: `pool(fn, ranges)` calls `fn(lo, hi)` per range, the
    first on the calling thread, the others on the pool's, and returns when all are done (an
    exception in a block is raised here)."""

    def __init__(self, threads: int, name: str = "nbdist-hub-update"):
        self.threads = max(1, int(threads))
        self._pool = (ThreadPoolExecutor(self.threads - 1, thread_name_prefix=name)
                      if self.threads > 1 else None)

    def __call__(self, fn: BlockFn, ranges: Ranges) -> None:
        if self._pool is None or len(ranges) <= 1:
            for lo, hi in ranges:
                fn(lo, hi)
            return
        futures = [self._pool.submit(fn, lo, hi) for lo, hi in ranges[1:]]
        try:
            fn(*ranges[0])
        finally:
            for future in futures:
                future.result()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


def split_updates(updater) -> BlockPool | None:
    """Give a shard's `Updater` a pool when its updates are large enough to split; the caller
    closes the pool (None: the update stays in one pass on the hub's thread)."""
    threads = update_threads()
    if len(block_ranges(updater.rule.size, threads)) <= 1:
        return None
    pool = BlockPool(threads)
    updater.use_blocks(pool, threads)
    return pool
