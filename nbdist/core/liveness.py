"""When a silent worker counts as lost (killed, its engine died, its host gone): the silence
each worker has had, and the deadline its own pace allows. Pure bookkeeping on the hub's
clock (`now` is passed in), so tests move time by hand; shard 0's `Coordinator` keeps one
and decides what a loss changes.

Silence is measured on a `RunningClock`: the time during which the watcher's own loop ran.
A stopped or starved watcher (SIGSTOP, a laptop's lid closed, a paused VM, a wall clock that
jumps) heard nobody because it was not listening, so that gap is no one's silence. The hub's
clock, the kernel's watch of the hub and every wait for a reply (`nbdist.hub.lines`) run on one.

The kernel holds a `Lease` on a run whose hubs live on engines: every message it sends a
shard renews it (its monitor polls a few times a second). A shard whose kernel has been
silent for longer than the lease's term, on the same running clock, takes the kernel for dead
(SIGKILL, a crash, a lost host) and ends the run (`nbdist.hub.orphan`), so the engines of a
connected, Slurm or MPI cluster do not train on for nobody. The term is `--timeout` less the
time the workers need to leave (`lease_term`), so their engines are idle within `--timeout`.
"""

from __future__ import annotations

LOST_FLOOR_S = 5.0  # a silent worker is never declared lost sooner than this ...
LOST_STEPS = 20  # ... nor sooner than this many of its own (slowed-down) step times
LOST_FIRST_S = 30.0  # silence allowed before its first push is measured (first local round)
LOST_EVAL_S = 60.0  # silence allowed while it evaluates (validation can take long)
# The longest interval between two readings of a watcher's clock that counts in full. Its
# loops read it at least every second (the hub every 0.5 s, a wait for a reply every 1 s), so a
# longer interval means the watcher itself was stopped or starved; only this much of it counts.
GAP_S = 2.0
# The kernel's first message may come this long after a hub started at the latest (its workers
# are started in between), however short the lease's term.
LEASE_FIRST_S = 60.0
# How much sooner than --timeout a lease lapses: room for the workers' last step and their bye.
LEASE_MARGIN_S = 2.0
# The lease's running clock counts at most this of an interval between two of the hub loop's
# readings (every 0.5 s at most): a suspend of kernel and hub together, the kernel continued a
# moment later, must stay well inside a short term (GAP_S would count 2 s of it).
LEASE_GAP_S = 1.0


def lease_term(timeout: float) -> float:
    """The kernel's silence after which its run's hubs end the run: `timeout` less
    LEASE_MARGIN_S, and at least half of `timeout` (the kernel speaks every quarter second).

    Example:
        >>> lease_term(120.0), lease_term(6.0), lease_term(2.0)
        (118.0, 4.0, 1.0)
    """
    return max(timeout - LEASE_MARGIN_S, timeout / 2)


class RunningClock:
    """Seconds during which a loop ran, from its readings of a monotonic clock: an interval
    between two readings longer than `max_step_s` counts as `max_step_s` (the rest is added to
    `discounted`), and a reading that goes back counts as no time.

    Example:
        >>> clock = RunningClock(max_step_s=2.0)
        >>> [clock.read(t) for t in (100.0, 100.5, 101.0, 141.0, 141.5)]
        [0.0, 0.5, 1.0, 3.0, 3.5]
        >>> clock.discounted
        38.0
    """

    def __init__(self, max_step_s: float = GAP_S) -> None:
        self.max_step_s = max_step_s
        self.elapsed = 0.0  # running time so far
        self.discounted = 0.0  # time of the gaps left out
        self._last: float | None = None

    def read(self, reading: float) -> float:
        """The running time at `reading` (seconds of a monotonic clock)."""
        if self._last is not None:
            step = reading - self._last
            if step > self.max_step_s:
                self.discounted += step - self.max_step_s
                step = self.max_step_s
            self.elapsed += max(0.0, step)
        self._last = reading if self._last is None else max(self._last, reading)
        return self.elapsed


class Liveness:
    """Each worker's last message and its step time (a moving average of its push interval,
    divided by its slow-down).

    Example:
        >>> live = Liveness()
        >>> live.heard(0, now=0.0); live.pushed(0, 0.0, slowdown=1.0)
        >>> live.pushed(0, 0.5, slowdown=1.0)
        >>> live.deadline(0, slowdown=1.0, evaluating=False), live.silent(0, now=3.0)
        (10.0, 3.0)
    """

    def __init__(self) -> None:
        self.last_heard: dict[int, float] = {}  # worker -> hub time of its last message
        self._last_push: dict[int, float] = {}
        self._step_s: dict[int, float] = {}

    def heard(self, worker: int, now: float) -> None:
        """`worker` spoke (or its held reply was just sent): its silence starts now."""
        self.last_heard[worker] = now

    def pushed(self, worker: int, now: float, slowdown: float) -> None:
        """A push of `worker` was applied: its step time follows the interval since the last."""
        last = self._last_push.get(worker)
        self._last_push[worker] = now
        if last is not None:
            step = (now - last) / max(1.0, slowdown)
            old = self._step_s.get(worker)
            self._step_s[worker] = step if old is None else 0.8 * old + 0.2 * step

    def rejoined(self, worker: int) -> None:
        """A worker counted as lost came back: its pace is measured afresh."""
        self._step_s.pop(worker, None)

    def silent(self, worker: int, now: float) -> float:
        return now - self.last_heard.get(worker, now)

    def deadline(self, worker: int, slowdown: float, evaluating: bool) -> float:
        """Seconds of silence after which `worker` counts as lost: many of its own step times,
        scaled by its current slow-down, never less than a few seconds."""
        step = self._step_s.get(worker)
        limit = (LOST_FIRST_S if step is None
                 else max(LOST_FLOOR_S, LOST_STEPS * step * max(1.0, slowdown)))
        return max(limit, LOST_EVAL_S) if evaluating else limit


class Lease:
    """The kernel's lease on a run, as one hub shard keeps it: renewed by each message from the
    kernel, lapsed after `term_s` of silence (`first_s` at least before its first renewal).
    Times are the shard's running time (a `RunningClock` of max_step_s=LEASE_GAP_S), so a
    stopped hub blames no one.

    Example:
        >>> lease = Lease(term_s=5.0, now=0.0, first_s=10.0)
        >>> lease.lapsed(8.0), lease.lapsed(10.5)   # no renewal yet: first_s holds
        (False, True)
        >>> lease.renew(11.0)
        >>> lease.lapsed(16.0), lease.lapsed(16.5), lease.silent(16.5)
        (False, True, 5.5)
    """

    def __init__(self, term_s: float, now: float, first_s: float = LEASE_FIRST_S) -> None:
        self.term_s, self.first_s = term_s, first_s
        self.renewed_at = now
        self.renewals = 0

    def renew(self, now: float) -> None:
        """The kernel spoke at `now`."""
        self.renewed_at = max(self.renewed_at, now)
        self.renewals += 1

    def silent(self, now: float) -> float:
        """Seconds since the kernel last spoke (or since the lease began)."""
        return now - self.renewed_at

    def lapsed(self, now: float) -> bool:
        """Whether the kernel has been silent past the term (before its first renewal: past
        `first_s` too, since a run's start can keep it busy that long)."""
        term = self.term_s if self.renewals else max(self.term_s, self.first_s)
        return self.silent(now) > term
