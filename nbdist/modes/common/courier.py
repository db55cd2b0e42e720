"""An overlapped step's round trip on a thread of its own, for workers whose arrays cross TCP.

With `--overlap` a worker sends step t's gradient and computes step t+1 before it takes the
reply. Across hosts the messages carry the arrays themselves, so the send signs the whole
gradient (keyed BLAKE3), and the receive checks the whole reply and copies it into `params`:
about 0.4 ms per step at 269K parameters, done between two computes on the worker's own
thread. The courier does that exchange on a second thread while the next step computes. The
MAC, ZeroMQ's calls and the copy release the GIL, as TensorFlow does, so the two overlap.

Over shared memory only headers travel (tens of microseconds): handing them to a thread
costs what it saves, so those workers call the transport themselves (`wanted`). Over TCP
the courier wins where a core has room for it and loses where every core is busy already
(measured on 2 cores with the hub on the same machine: 0.72 against 0.58 of `model.fit` at
batch 256, 0.45 against 0.51 at batch 64; `benchmarks/overhead.py --transport tcp --overlap
--courier both`). No rule from the parts' times predicted which, so `WayChooser` times the
worker's steps both ways, and keeps the faster.
"""

from __future__ import annotations

import statistics
import threading
import time
from typing import TYPE_CHECKING

from nbdist.env import switch

if TYPE_CHECKING:
    from nbdist.wire.messages import Reply, Step


def wanted(link: str) -> bool:
    """True where the courier pays: arrays in the messages (TCP). NBDIST_COURIER=0 turns it off."""
    return link == "tcp" and switch("NBDIST_COURIER")


class Courier:
    """One push + pull round trip at a time, on a daemon thread; `receive` waits for it.

    Between `send` and `receive` the transport belongs to the courier's thread: the worker
    must not touch it (its sockets are not thread-safe), and it must not write `grad`, which
    ZeroMQ may still be sending without a copy, or read `params`, which the reply fills."""

    def __init__(self, transport):
        self._transport = transport
        self._go = threading.Event()
        self._done = threading.Event()
        self._job: Step | None = None
        self._result: tuple[Reply, float] | None = None
        self._error: BaseException | None = None
        self._closed = False
        self.in_flight = False
        self._thread = threading.Thread(target=self._loop, name="nbdist-courier", daemon=True)
        self._thread.start()

    def send(self, step: Step) -> None:
        """Start pushing `grad` and pulling the parameters (`step`); returns at once."""
        if self.in_flight:  # a bug in the caller, not a user's mistake
            raise RuntimeError("one exchange at a time: receive() the last one first")
        self._job, self.in_flight = step, True
        self._done.clear()
        self._go.set()

    def receive(self) -> tuple[Reply, float]:
        """Shard 0's reply and the `perf_counter` time it was in; re-raises what the
        exchange raised (a timeout, a refused request) here, on the worker's thread."""
        self._done.wait()
        self.in_flight = False
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        result, self._result = self._result, None
        return result

    def close(self) -> None:
        """Stop the thread. An exchange still in flight (the worker failed while it was out)
        is waited for: its sockets must be idle before the transport closes them, and the
        transport's reply timeout bounds the wait."""
        if self.in_flight:
            self._done.wait()
            self.in_flight = False
        self._closed = True
        self._go.set()
        self._thread.join()

    def _loop(self) -> None:
        while True:
            self._go.wait()
            self._go.clear()
            if self._closed:
                return
            step = self._job
            try:
                self._transport.send_step(step)
                self._result = self._transport.receive_step(step), time.perf_counter()
            except BaseException as exc:  # noqa: BLE001 - handed to the worker's thread
                self._error = exc
            self._done.set()


class WayChooser:
    """Which way each exchange goes, by courier (True) or on the worker's thread (False),
    from the worker's step times: `blocks` blocks of `block` steps, alternating ways, then
    the way whose median step was shorter for the next `keep` steps, then measure again (the
    machine's load changes). A block's first step is not counted: it straddles the switch.
    Medians, so that one step with a validation pass in it does not decide."""

    def __init__(self, block: int = 8, blocks: int = 4, keep: int = 512):
        self.block, self.blocks, self.keep = block, blocks, keep
        self._times: dict[bool, list[float]] = {True: [], False: []}
        self._step = 0  # within the current round: measuring, then keeping
        self._last: tuple[float, bool, bool] | None = None  # (when, way, counted) of the last step
        self.chosen: bool | None = None  # the way kept after the last measuring

    def next(self, now: float) -> bool:
        """The way for the step starting at `now` (a `perf_counter` time)."""
        if self._last is not None:
            then, way, counted = self._last
            if counted:
                self._times[way].append(now - then)
        measuring = self.block * self.blocks
        if self._step == measuring:  # measured: keep the faster way
            self.chosen = self._faster()
        if self._step == measuring + self.keep:  # kept long enough: measure again
            self._step = 0
            self._times = {True: [], False: []}
        if self._step < measuring:
            way, counted = (self._step // self.block) % 2 == 0, self._step % self.block != 0
        else:
            way, counted = self.chosen, False
        self._step += 1
        self._last = (now, way, counted)
        return way

    def _faster(self) -> bool:
        return statistics.median(self._times[True]) <= statistics.median(self._times[False])
