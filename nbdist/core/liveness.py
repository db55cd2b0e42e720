"""When a silent worker counts as lost (killed, its engine died, its host gone): the silence
each worker has had, and the deadline its own pace allows. Pure bookkeeping on the hub's
clock (`now` is passed in), so tests move time by hand; shard 0's `Coordinator` keeps one
and decides what a loss changes.

Silence is measured on a `RunningClock`: the time during which the watcher's own loop ran.
A stopped or starved watcher (SIGSTOP, a laptop's lid closed, a paused VM, a wall clock that
jumps) heard nobody because it was not listening, so that gap is no one's silence. The hub's
clock, the kernel's watch of the hub and every wait for a reply (`nbdist.hub.lines`) run on one.
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
