"""The kernel's line to a run's hub shards (`HubControl`): statistics, control, the final
parameters, checkpoint state and shutdown, as typed requests (`nbdist.wire.messages`) over one
signed line per shard (`nbdist.hub.lines`)."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator

import numpy as np
import zmq

from nbdist.core.liveness import RunningClock
from nbdist.errors import TrainingError
from nbdist.hub.lines import open_lines
from nbdist.wire.messages import (
    Control,
    Params,
    Peers,
    ShardState,
    Shutdown,
    State,
    Stats,
    StatsReply,
)

NO_ROWS = 1 << 62  # a Stats `since` past every history row: a liveness probe asks for none


class HubControl:
    """The kernel's line to every shard: statistics, control, final parameters. Thread-safe.
    `transport`: "auto" goes over ipc to a shard on this host (`nbdist.hub.lines.open_lines`)."""

    def __init__(self, key: bytes, shards: list[dict], timeout: float = 30.0, name: str = "kernel",
                 transport: str = "tcp"):
        self._ctx = zmq.Context()
        self._key, self._timeout = key, timeout
        self.endpoints = list(shards)
        self.lines = open_lines(self._ctx, key, shards, name, timeout, transport)
        self._lock = threading.Lock()
        self.closed = False
        # each shard's version at the latest stats poll (what a lost shard had reached)
        self.versions: list[int | None] = [None] * len(shards)
        # whether the run is paused, as the kernel last knew it: shard 0's latest statistics, or
        # a pause or resume sent since (what a new shard 0 must be told)
        self.paused: bool | None = None
        self._peers = len(shards) > 1 and name == "kernel"
        if self._peers:  # shard 0 tells the others of write-offs
            self.lines[0].request(Peers(shards[1:]))

    @property
    def dropped(self) -> Counter[str]:
        """Replies dropped on this side (forged, replayed, late, from the wrong endpoint)."""
        return sum((line.dropped for line in self.lines), Counter())

    def stats(self, since: int = 0, timeline: bool = False, timeout: float | None = None,
              during: Callable[[], None] | None = None,
              clock: Callable[[], float] | None = None) -> dict:
        """Shard 0's statistics with history rows from `since` on (and the whole timeline if
        asked). Every other shard is asked at the same time, so a dead or failed one is found
        as fast as shard 0: TrainingError names a shard that does not answer, the first
        shard's error is the snapshot's `error`, and `warnings` holds every shard's. `timeout`:
        wait at most this long for all of them (the lines' own timeout if longer), on `clock`,
        calling `during()` about every second meanwhile (`Line.recv`)."""
        if clock is None:
            running = RunningClock()
            clock = lambda: running.read(time.monotonic())  # noqa: E731
        start = clock()
        with self._lock:
            for line in self.lines[1:]:
                line.send(Stats())
            _, msg = self.lines[0].request(Stats(since, timeline), timeout=timeout, during=during,
                                           clock=clock)
            snap = json.loads(bytes(msg.buffers[0]))
            self.versions[0], self.paused = snap.get("version"), snap.get("paused")
            for i, line in enumerate(self.lines[1:], 1):
                left = None if timeout is None else max(0.001, timeout - (clock() - start))
                _, other = line.recv(StatsReply, left, during, clock)
                answer = json.loads(bytes(other.buffers[0]))
                self.versions[i] = answer.get("version")
                error = answer.get("error")
                if error and not snap.get("error"):
                    snap["error"] = f"{line.name}: {error}"
                snap["warnings"] = [*snap.get("warnings", []), *answer.get("warnings", [])]
        return snap

    def coordinator_stats(self, timeout: float | None = None) -> dict:
        """Shard 0's statistics without history rows, asked of shard 0 alone within `timeout`
        (None: the line's; the others may be gone: a takeover waits on the workers' hellos)."""
        with self._lock:
            _, msg = self.lines[0].request(Stats(since=NO_ROWS), timeout=timeout)
        return json.loads(bytes(msg.buffers[0]))

    def unanswered(self, timeout: float) -> list[int]:
        """The shards that do not answer a `Stats` within `timeout` seconds, all asked at once
        (lost: their process or engine died, or their host is cut off)."""
        with self._lock:
            for line in self.lines:
                line.send(Stats(since=NO_ROWS))
            deadline = time.monotonic() + timeout
            silent = []
            for i, line in enumerate(self.lines):
                try:
                    line.recv(StatsReply, max(0.001, deadline - time.monotonic()))
                except TrainingError:
                    silent.append(i)
        return silent

    @contextlib.contextmanager
    def renewing(self, every_s: float) -> Iterator[None]:
        """While the body runs, ask every shard for nothing (a `Stats` with no rows) at once and
        then every `every_s` seconds, from a thread. Each request renews the hubs' lease on this
        kernel (`nbdist.hub.orphan`): the kernel says nothing else while it starts the workers,
        which can take seconds, and a kernel that dies meanwhile must be found within
        --timeout, not after the lease's first term."""
        done = threading.Event()

        def renew() -> None:
            while True:
                with contextlib.suppress(TrainingError, zmq.ZMQError):
                    self.unanswered(timeout=every_s)
                if done.wait(every_s):
                    return

        thread = threading.Thread(target=renew, name="nbdist-lease-renewal", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()

    def replace_shard(self, shard: int, endpoint: dict) -> None:
        """Talk to a new process of hub shard `shard` (one that took a lost shard over) at
        `endpoint` from now on; shard 0 learns where its peers are again."""
        with self._lock:
            old = self.lines[shard]
            line = type(old)(self._ctx, endpoint, endpoint["tcp"], old.codec, self._key,
                             self._timeout, old.name, old.peer)
            old.close()
            self.lines[shard], self.endpoints[shard] = line, dict(endpoint)
            self.versions[shard] = None
            if self._peers:
                self.lines[0].request(Peers(self.endpoints[1:]))

    def tell(self, shard: int, timeout: float | None = None, **changes: object) -> None:
        """One `Control` to shard `shard` alone (what it applies of it), waiting `timeout` at
        most for its answer (None: the line's): a new shard's process learns what the others
        were told before it started (workers added or lost)."""
        control = Control(**changes)
        with self._lock:
            part = control if shard == 0 else control.for_other_shards()
            if part is not None:
                self.lines[shard].request(part, timeout=timeout)

    def cap_timeout(self, seconds: float) -> None:
        """From now on no request waits longer than `seconds` (a run that is ending in failure
        may be talking to a hub that is gone)."""
        for line in self.lines:
            line.timeout_ms = min(line.timeout_ms, int(seconds * 1000))

    def control(self, **changes: object) -> None:
        """One `Control` of these changes: what every shard applies (lr, rule options, stop,
        ...) goes to all, the rest to shard 0 only."""
        control = Control(**changes)
        others = control.for_other_shards()
        with self._lock:
            if self.closed:  # the run ended between the caller's check and this call
                raise TrainingError("The run has ended; there is nothing to control. "
                                    "Start a new run.")
            for i, line in enumerate(self.lines):
                if i == 0 or others is not None:
                    line.request(control if i == 0 else others)
            if control.paused is not None:
                self.paused = control.paused

    def params(self) -> tuple[np.ndarray, np.ndarray]:
        """The full flat parameter vector and the non-trainable state."""
        with self._lock:
            self._check_open()
            msgs = [line.request(Params())[1] for line in self.lines]
        flat = np.concatenate([m.floats(0) for m in msgs])
        return flat, msgs[0].floats(1).copy()

    def state(self) -> list[tuple[ShardState, list[np.ndarray]]]:
        """Every shard's checkpoint state, with the arrays its `names` lists."""
        with self._lock:
            self._check_open()
            replies = [line.request(State()) for line in self.lines]
        return [(state, [msg.floats(i).copy() for i in range(len(msg.buffers))])
                for state, msg in replies]

    def _check_open(self) -> None:
        """Fail at once after `shutdown`: no hub answers any more (instead of after a timeout)."""
        if self.closed:
            raise TrainingError("The run has ended and its hubs are gone; its final weights are in "
                                "the notebook's model.")

    def shutdown(self) -> None:
        with self._lock:
            for line in self.lines:
                with contextlib.suppress(TrainingError):
                    line.request(Shutdown())
            self.closed = True  # nothing is served any more: a later request fails at once

    def close(self) -> None:
        with self._lock:  # never under a control() from another thread (the notebook's)
            self.closed = True
            for line in self.lines:
                line.close()
        self._ctx.term()
