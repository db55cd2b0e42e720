"""Large elementwise updates in contiguous blocks, run by whatever `map` the caller passes in.

At 10M parameters one push's update is memory-bound (several ms on one thread). Every
update the hub applies per push is elementwise, so it can be cut into contiguous blocks that
are independent of each other; NumPy releases the GIL inside each operation, so threads
run the blocks in parallel. The pool itself lives at the edge (`nbdist.hub.threads`): the core
stays free of threads and is tested with the serial runner below, and a block computes the
same float32 operations on the same elements either way, so the result is bit-identical.

A runner is any callable `run(fn, ranges)` that calls `fn(lo, hi)` once per range and
returns when all have finished.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

BLOCK = 1 << 16  # floats per cache block (sgd.py's fused pass); block edges are multiples of it
MIN_SPLIT = 1 << 20  # below 4 MB a thread hand-off costs more than it saves

Ranges = Sequence[tuple[int, int]]
BlockFn = Callable[[int, int], None]
Runner = Callable[[BlockFn, Ranges], None]


def run_serial(fn: BlockFn, ranges: Ranges) -> None:
    """The runner with no threads: each range in order, on the caller's thread."""
    for lo, hi in ranges:
        fn(lo, hi)


def block_ranges(size: int, parts: int, align: int = BLOCK,
                 min_split: int = MIN_SPLIT) -> list[tuple[int, int]]:
    """`[0, size)` cut into at most `parts` contiguous ranges whose inner edges are multiples of
    `align`; one range when `size < min_split` or `parts <= 1`.

    Example:
        >>> block_ranges(10, 3, align=2, min_split=0)
        [(0, 4), (4, 8), (8, 10)]
        >>> block_ranges(10, 3, align=2, min_split=11)
        [(0, 10)]
    """
    if parts <= 1 or size < min_split or size <= align:
        return [(0, size)]
    blocks = -(-size // align)
    per = -(-blocks // parts)
    edges = list(range(0, size, per * align)) + [size]
    return list(zip(edges[:-1], edges[1:], strict=True))


def intersect(runs: Sequence[tuple[int, int]], lo: int, hi: int) -> list[tuple[int, int]]:
    """The parts of `runs` (sorted `[start, end)` pairs) inside `[lo, hi)`.

    Example:
        >>> intersect([(0, 3), (5, 9)], 2, 6)
        [(2, 3), (5, 6)]
    """
    return [(max(s, lo), min(e, hi)) for s, e in runs if max(s, lo) < min(e, hi)]
