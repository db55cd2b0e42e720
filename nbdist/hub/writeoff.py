"""Write-offs reach every shard before the work moves.

Shard 0's coordinator decides that a silent worker is lost and hands its chunks to the
others. A push from that worker that comes later must then change no shard, or shards 1..S-1
would apply a chunk twice (once from the late push, once from its new owner) and disagree
with shard 0. So shard 0 first tells every other shard (a signed `control lost=W`, answered
in order, so each shard refuses W's later pushes once it has answered) and only then frees
the chunks. Shard 0 learns the other shards' endpoints from the kernel (`peers`, sent when
the kernel's `HubControl` opens).

A push the lost worker sent before shard 0 decided, still in flight to another shard, can
still land there; the window is one message, after at least LOST_FLOOR_S of silence.

The relay asks every shard at once and waits RELAY_TIMEOUT_S at most for all of them. A shard
that does not answer is not asked again: it is dead or stuck, the kernel (which polls every
shard) ends the run, and meanwhile shard 0's loop, which the relay holds, must not stop for
RELAY_TIMEOUT_S on every write-off.
"""

from __future__ import annotations

import logging
import time

import zmq

from nbdist.core.liveness import RunningClock
from nbdist.errors import TrainingError
from nbdist.hub.lines import open_lines
from nbdist.wire.messages import Control, Ok

log = logging.getLogger(__name__)
RELAY_TIMEOUT_S = 5.0


class Peers:
    """Shard 0's lines to shards 1..S-1."""

    def __init__(self, key: bytes, shards: list[dict], shard_name: str):
        self._ctx = zmq.Context()
        lines = open_lines(self._ctx, key, shards, f"{shard_name}-relay", RELAY_TIMEOUT_S)
        for i, line in enumerate(lines, start=1):  # these are shards 1.., not 0..
            line.peer, line.name = f"hub-{i}", f"hub shard {i}"
        self.lines = lines
        self.unreachable: set[str] = set()  # shards that did not answer a relay: not waited for

    def close(self) -> None:
        for line in self.lines:
            line.close()
        self._ctx.term()


def link(hub, shards: list[dict]) -> None:
    """`peers`: remember the other shards (replacing lines from an earlier `peers`)."""
    close(hub)
    hub.peers = Peers(hub.spec.key, shards, hub.codec.name)


def relay(hub, worker: int, reason: str) -> None:
    """Tell every other shard that `worker` is written off, and wait for their answers (all at
    once, RELAY_TIMEOUT_S at most; a shard that missed a relay is not asked again)."""
    peers = getattr(hub, "peers", None)
    if peers is None:
        return
    asked = []
    for line in peers.lines:
        if line.name in peers.unreachable:
            continue
        try:
            line.send(Control(lost=int(worker), reason=reason))
            asked.append(line)
        except TrainingError as exc:  # its local line is closed: it has left
            _unreachable(peers, line, worker, exc)
    running = RunningClock()
    clock = lambda: running.read(time.monotonic())  # noqa: E731
    deadline = clock() + RELAY_TIMEOUT_S
    for line in asked:
        try:
            line.recv(Ok, timeout=max(0.001, deadline - clock()), clock=clock)
        except TrainingError as exc:
            _unreachable(peers, line, worker, exc)


def _unreachable(peers: Peers, line, worker: int, exc: Exception) -> None:
    peers.unreachable.add(line.name)
    log.warning("hub: could not tell %s that worker %d is lost (%s); it is not asked again",
                line.name, worker, exc)


def close(hub) -> None:
    if getattr(hub, "peers", None) is not None:
        hub.peers.close()
        hub.peers = None
