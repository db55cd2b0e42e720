"""Thread pinning on a small machine (`--pin`): which cores a hub shard and a worker may use.

On a host with few cores, TensorFlow's intra-op threads and a hub shard's process preempt each
other: a worker's step waits for its slowest thread, and a thread that shares its core with the
hub's accounting is the slowest. `plan_cores` (pure) decides, from the cores an engine may use
and the roles on its host, a core set per role; `pin_process` (the edge) applies one to every
thread of the calling process, so threads and child processes started later (a hub's own
process, TensorFlow's pools) inherit it, and `unpin_process` restores what the engine had.

Policy, per host: each hub shard gets one core of its own (from the end of the list), and the
workers share the rest in contiguous blocks as equal as they can be, TensorFlow's intra-op
threads set to the block's size. When that would leave a worker without a core (fewer cores
than hubs + workers), or the host has no worker, nothing is pinned: the plan is None and the
run behaves as with `pin="off"`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Placement:
    """Where one engine's role runs: its cores and (workers) its TensorFlow intra-op threads."""

    cores: tuple[int, ...]
    threads: int


def plan_cores(cores: tuple[int, ...] | list[int], hubs: int, workers: int, role: str,
               index: int) -> Placement | None:
    """The placement of the `index`-th hub or worker (`role`) on a host whose engines may use
    `cores`, with `hubs` hub shards and `workers` workers there; None: leave it unpinned.

    Example:
        >>> plan_cores((0, 1), hubs=1, workers=1, role="hub", index=0)
        Placement(cores=(1,), threads=1)
        >>> plan_cores((0, 1), hubs=1, workers=1, role="worker", index=0)
        Placement(cores=(0,), threads=1)
        >>> plan_cores((0, 1, 2, 3, 4, 5), hubs=1, workers=2, role="worker", index=1)
        Placement(cores=(2, 3, 4), threads=3)
        >>> plan_cores((0, 1), hubs=1, workers=2, role="worker", index=0) is None
        True
    """
    if role not in ("hub", "worker"):
        raise ValueError(f"role must be 'hub' or 'worker' (Received: {role!r}).")
    count = hubs if role == "hub" else workers
    if not 0 <= index < count:
        raise ValueError(f"{role} index {index} is outside the {count} {role}s on this host.")
    cores = tuple(sorted(cores))
    free = len(cores) - hubs  # cores left to the workers
    if workers == 0 or free < workers:  # nothing to keep apart, or a worker would get no core
        return None
    if role == "hub":
        return Placement((cores[free + index],), 1)
    mine = cores[index * free // workers:(index + 1) * free // workers]
    return Placement(mine, len(mine))


def worker_threads(cpus: int, hubs: int, workers: int) -> int:
    """TensorFlow intra-op threads for each of `workers` workers on a host of `cpus` cores that
    also serves `hubs` hub shards: the cores the hubs leave, shared (at least 1). A hub's update
    and accounting run while the worker computes; a TensorFlow thread that shares its core with
    them makes every step wait for it (benchmarks/overhead.py --worker-threads 2 1 on 2 cores
    with a hub: 1 thread gave 0.55 of fit at batch 64 and 0.67 at 256, 2 threads 0.46 and 0.58).

    Example:
        >>> (worker_threads(2, 1, 1), worker_threads(8, 1, 2), worker_threads(2, 0, 2),
        ...  worker_threads(1, 1, 1))
        (1, 3, 1, 1)
    """
    return max(1, (cpus - hubs) // max(1, workers))


def cores_per_host(engine_cores) -> dict[str, int]:
    """host -> how many cores its engines may use, from (host, cores) pairs: the union of their
    core sets, so engines that share a machine's cores count them once and engines that Slurm
    (or taskset) gave cores of their own add theirs up. An engine that knows no cores (empty)
    adds none; a host with none known is left out. Threads and polling are planned from this,
    not from the notebook kernel's core count, which says nothing of another host's.

    Example:
        >>> cores_per_host([("a", (0, 1, 2, 3)), ("a", (0, 1, 2, 3)), ("b", (0, 1)), ("b", (2, 3)),
        ...                 ("c", ())])
        {'a': 4, 'b': 4}
    """
    union: dict[str, set[int]] = {}
    for host, cores in engine_cores:
        if cores:
            union.setdefault(host, set()).update(cores)
    return {host: len(cores) for host, cores in union.items()}


# --spin: how long a hub shard (and a same-host worker waiting for its reply) polls before it
# sleeps. A sleeping hub is woken by the worker's send and, on a busy 2-core machine, runs on
# the sender's core: `benchmarks/overhead.py --spin both` had the round trip at 0.23 ms polling
# against 0.45 sleeping at batch 64 (0.88 against 0.65 of fit). The hub's budget covers a step
# of a few ms, so between the steps of a small model it never sleeps. Over TCP polling gained
# nothing (0.29 against 0.29 of fit): ZeroMQ's I/O thread wakes the hub either way.
HUB_SPIN_S = 0.005
WORKER_SPIN_S = 0.002


def may_spin(cpus: int, hubs: int, workers: int) -> bool:
    """Whether the `hubs` hub shards and `workers` workers on a host of `cpus` cores poll
    instead of sleeping (`--spin auto`): where there are both, and each hub keeps a core of its
    own once every worker has one (`worker_threads` gives the workers the rest), so polling
    takes no core from TensorFlow.

    Example:
        >>> (may_spin(2, 1, 1), may_spin(2, 1, 2), may_spin(8, 2, 6), may_spin(4, 0, 4),
        ...  may_spin(4, 1, 0))
        (True, False, True, False, False)
    """
    return hubs > 0 and workers > 0 and cpus >= hubs + workers


def threads_of_process() -> list[int]:
    """Thread ids of this process (Linux: /proc/self/task)."""
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return [0]  # no /proc: the calling thread only


_original: set[int] | None = None  # the engine's cores before the first pin_process


def pin_process(cores: tuple[int, ...]) -> bool:
    """Restrict every thread of this process to `cores`; False where the OS cannot (no
    sched_setaffinity, or a core this process may not use: then nothing changes)."""
    global _original
    if not hasattr(os, "sched_setaffinity"):
        return False
    if _original is None:
        _original = set(os.sched_getaffinity(0))
    if not set(cores) <= _original:
        return False
    _set_all(set(cores))
    return True


def unpin_process() -> None:
    """Give every thread of this process back the cores it had before `pin_process`."""
    if _original is not None:
        _set_all(_original)


def allowed_cores() -> tuple[int, ...]:
    """The cores this engine may use: as it started, before any pin_process."""
    if _original is not None:
        return tuple(sorted(_original))
    if hasattr(os, "sched_getaffinity"):
        return tuple(sorted(os.sched_getaffinity(0)))
    return tuple(range(os.cpu_count() or 1))


def _set_all(cores: set[int]) -> None:
    for tid in threads_of_process():
        try:
            os.sched_setaffinity(tid, cores)
        except OSError:  # a thread that ended meanwhile
            pass


def apply(role: str, index: int, hubs: int, workers: int) -> Placement | None:
    """On an engine: pin it for its role (see `plan_cores`), or undo an earlier pin when the
    plan is None. Returns the placement applied."""
    placement = plan_cores(allowed_cores(), hubs, workers, role, index)
    if placement is None or not pin_process(placement.cores):
        unpin_process()
        return None
    return placement
