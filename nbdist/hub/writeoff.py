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
"""

from __future__ import annotations

import logging

import zmq

from nbdist.errors import TrainingError
from nbdist.hub.lines import open_lines
from nbdist.wire.messages import Control

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

    def close(self) -> None:
        for line in self.lines:
            line.close()
        self._ctx.term()


def link(hub, shards: list[dict]) -> None:
    """`peers`: remember the other shards (replacing lines from an earlier `peers`)."""
    close(hub)
    hub.peers = Peers(hub.spec.key, shards, hub.codec.name)


def relay(hub, worker: int, reason: str) -> None:
    """Tell every other shard that `worker` is written off, and wait for each to answer."""
    for line in getattr(hub.peers, "lines", ()):
        try:
            line.request(Control(lost=int(worker), reason=reason))
        except TrainingError as exc:
            log.warning("hub: could not tell %s that worker %d is lost: %s", line.name, worker, exc)


def close(hub) -> None:
    if getattr(hub, "peers", None) is not None:
        hub.peers.close()
        hub.peers = None
