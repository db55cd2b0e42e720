"""The kernel's requests to a hub shard: stats, control, params, state, peers and shutdown.

Kept apart from the server loop (`nbdist.hub.server`), whose own code is the workers' hot path
(hello, step, the replies it holds and releases): these come from the kernel's `HubControl`,
a few a second at most, and read or steer the shard through its core. Each takes the `Hub`,
then the request as the loop received it, and returns the reply and its buffers.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from nbdist.checkpoint.shard_state import shard_state
from nbdist.checkpoint.sync_state import hub_state
from nbdist.hub import writeoff
from nbdist.hub.messages import (
    Control,
    Ok,
    Params,
    ParamsReply,
    Peers,
    ShardState,
    Shutdown,
    State,
    Stats,
    StatsReply,
)

if TYPE_CHECKING:
    from nbdist.hub.protocol import Message
    from nbdist.hub.server import Hub
    from nbdist.hub.wire import Return


def stats(hub: Hub, stats: Stats, msg: Message, ret: Return) -> tuple[StatsReply, list]:
    """Shard 0's statistics; another shard's answer says that it is alive, and its error."""
    if hub.core.coordinator is None:
        snap = {"shard": hub.spec.shard, "version": hub.core.version}
    else:
        snap = hub.core.stats(stats.since, stats.timeline)
    snap.update(error=hub.error, dropped=hub.dropped_counts())
    return StatsReply(), [json.dumps(snap).encode()]


def control(hub: Hub, control: Control, msg: Message, ret: Return) -> tuple[Ok, list]:
    if control.lost is not None:
        hub.unlink(control.lost)
    hub.core.control(control)
    return Ok(), []


def params(hub: Hub, params: Params, msg: Message, ret: Return) -> tuple[ParamsReply, list]:
    return ParamsReply(hub.core.version), [hub.core.params.copy(),
                                           hub.core.non_trainable.copy()]


def state(hub: Hub, state: State, msg: Message, ret: Return) -> tuple[ShardState, list]:
    if hub.sync_snapshot is not None:  # sync mode: the weights rank 0 sent
        return hub_state(hub.core, hub.sync_snapshot)
    return shard_state(hub.core)


def peers(hub: Hub, peers: Peers, msg: Message, ret: Return) -> tuple[Ok, list]:
    writeoff.link(hub, peers.shards)
    return Ok(), []


def shutdown(hub: Hub, shutdown: Shutdown, msg: Message, ret: Return) -> tuple[Ok, list]:
    hub.core.settle()
    hub.closing = True
    return Ok(), []


# each request type and what answers it
HANDLERS = {Stats: stats, Control: control, Params: params, State: state, Peers: peers,
            Shutdown: shutdown}
