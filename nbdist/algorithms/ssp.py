"""Stale Synchronous Parallel (Ho et al. 2013): SGD updates, bounded clock drift.

The update is plain SGD; what SSP adds is a rule about *when* a worker may go on, kept
here as a pure `StalenessClock` so it is tested without sockets (the coordinator owns the
run's one clock). `clock[p]` counts p's
pushes. The hub holds back p's next pull while `clock[p] − min(active clocks) > S`. So
a worker only starts a step at most S clocks ahead of the slowest active one (its counter
can read S + 1 while it waits); S = 0 is BSP, lockstep. A worker that left (`drop`) no
longer holds the others back.
"""

from __future__ import annotations

from nbdist.algorithms.base import Option
from nbdist.algorithms.sgd import ASGD

STALENESS = 3  # S when not given: bounds staleness, yet absorbs step-time jitter


class StalenessClock:
    """Per-worker push counters and the SSP blocking test.

    Example:
        >>> clock = StalenessClock(num_workers=2, staleness=0)
        >>> clock.tick(0); clock.blocked(0), clock.blocked(1)
        (True, False)
        >>> clock.tick(1); clock.blocked(0)
        False
    """

    def __init__(self, num_workers: int, staleness: int):
        if num_workers < 1 or staleness < 0:
            raise ValueError(f"StalenessClock needs num_workers >= 1 and staleness >= 0. "
                             f"Received: num_workers={num_workers}, staleness={staleness}.")
        self.staleness = int(staleness)
        self._clock = [0] * num_workers
        self._active = set(range(num_workers))

    def tick(self, worker: int) -> None:
        """Count one push by `worker`."""
        self._clock[worker] += 1

    def slowest(self) -> int | None:
        """The lowest clock among active workers (None when none is active)."""
        return min((self._clock[p] for p in self._active), default=None)

    def blocked(self, worker: int) -> bool:
        """True while `worker` is more than S clocks ahead of the slowest active worker."""
        low = self.slowest()
        return (worker in self._active and low is not None
                and self._clock[worker] - low > self.staleness)

    def drop(self, worker: int) -> None:
        """`worker` left or finished: stop waiting for it."""
        self._active.discard(worker)

    def add(self, worker: int) -> None:
        """Know `worker` (an id beyond the first ones, added mid-run) without waiting for it:
        it counts once it `join`s."""
        self._clock.extend([0] * (worker + 1 - len(self._clock)))

    def join(self, worker: int) -> None:
        """`worker` (re)joins at the slowest active clock, so it neither waits nor holds back;
        an id not seen before (a worker added mid-run) is added first."""
        if worker not in self._active:
            self.add(worker)
            low = self.slowest()
            self._clock[worker] = self._clock[worker] if low is None else low
            self._active.add(worker)

    @property
    def active(self) -> frozenset[int]:
        return frozenset(self._active)

    @property
    def clocks(self) -> tuple[int, ...]:
        """Every worker's push count (a left worker's is frozen)."""
        return tuple(self._clock)


class SSP(ASGD):
    """`ssp`: SGD on each push; the option `staleness` (S) says how far a worker may run ahead.

    Who waits is decided by the run's `Coordinator` (on shard 0), which owns the one
    `StalenessClock`: it ticks it on every push, holds a worker's reply while it is blocked,
    and follows a live `run.set_option("staleness", S)`. The rule only declares and validates
    S (default `STALENESS`), so a shard holds no clock of its own.
    """

    name = "ssp"
    predicts_weights = True
    corrects_momentum = True  # each push is one step of the optimizer
    compensates_delay = False
    takes_local_steps = True
    workers_step = False

    @classmethod
    def default_options(cls, num_workers: int) -> dict[str, Option]:
        return {"staleness": STALENESS}
