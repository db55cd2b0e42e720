"""A run whose kernel died: its hub shards end it, so no engine trains on for nobody.

A local cluster's watchdog (`nbdist.cluster.watchdog`) ends the engines a dead kernel started.
The engines of a connected, Slurm or MPI cluster outlive it by design, so the run itself must
stop: every shard keeps the kernel's `Lease` (`nbdist.core.liveness`), renewed by each signed
message from the kernel (its monitor polls every shard a few times a second). Once it has
lapsed (the kernel silent for `lease_term(--timeout)`, --timeout less the 2 s the workers get to
leave, counted on the shard's running clock, so a stopped hub blames no one), shard 0:

1. stops the run: every worker's next reply says stop, and the workers say bye and return, so
   their engines are idle (a worker that does not leave within another term is not waited for);
2. writes a last checkpoint into `--checkpoint-dir`, when the run has one: its own state and
   every other shard's (asked over its write-off lines, `nbdist.hub.writeoff`), in the kernel's
   format (`nbdist.checkpoint.store`), so `--resume` goes on from there. The folder is the
   kernel's path, so across hosts it must be a shared file system; a save that fails is logged
   (the engine's log) and the periodic checkpoints before it stay;
3. tells the other shards to shut down, and leaves its loop.

Another shard only notes the lapse; shard 0 ends it (or, with shard 0 gone too, its own idle
timeout does once the workers have left).
"""

from __future__ import annotations

import logging

from nbdist.checkpoint.folder import claimed
from nbdist.checkpoint.store import save
from nbdist.errors import NbdistError, TrainingError
from nbdist.hub.export import shard_state
from nbdist.wire.messages import Control, Shutdown, State

log = logging.getLogger(__name__)
KERNEL = "kernel"  # the kernel's sender name (`HubControl`); its messages renew the lease


def check(hub) -> bool:
    """Called a few times a second by a hub with a lease: True when the hub should leave its
    loop now (its kernel is gone and the run has ended)."""
    now = hub.lease_time()
    if hub.orphaned_at is None:
        if not hub.lease.lapsed(now):
            return False
        hub.orphaned_at = now
        log.warning("hub %d: the kernel has been silent for %.1fs (its lease: %.1fs); taking it "
                    "for dead and stopping the run", hub.spec.shard, hub.lease.silent(now),
                    hub.lease.term_s)
        if hub.core.coordinator is not None:
            hub.core.control(Control(stop=True))
            hub._release_held()  # noqa: SLF001 - held replies (SSP, a group) carry the stop too
        return False
    coordinator = hub.core.coordinator
    if coordinator is None:  # shard 0 asks for this shard's state, then shuts it down
        return False
    if not coordinator.finished and now - hub.orphaned_at < hub.lease.term_s:
        return False  # workers still leaving
    save_last(hub)
    shut_down_others(hub)
    return True


def save_last(hub) -> str | None:
    """Shard 0: write the run's last checkpoint (every shard's state now) into the folder its
    spec names; returns its path, or None (no folder, or it failed: logged)."""
    target = hub.spec.last_checkpoint
    if target is None:
        return None
    folder = target["dir"]
    try:
        shards = [shard_state(hub.core)] + _other_states(hub)
        with claimed(folder, hub.spec.run_id, None):  # the dead kernel's claim went with it
            path = save(folder, shards, target["info"])
    except (NbdistError, OSError) as exc:
        log.warning("hub 0: the last checkpoint of run %s into %s failed: %s (its earlier "
                    "checkpoints there are kept)", hub.spec.run_id, folder, exc)
        return None
    log.warning("hub 0: the kernel of run %s is gone; its last checkpoint is %s (resume with "
                "nbdist.resume(%r, cluster=...) or %%%%distribute --resume %s)", hub.spec.run_id,
                path, folder, folder)
    return path


def _other_states(hub) -> list:
    """Shards 1..S-1's checkpoint states, asked over shard 0's write-off lines."""
    count = hub.spec.num_shards - 1
    lines = [] if hub.peers is None else hub.peers.lines
    if len(lines) != count:
        raise TrainingError(f"shard 0 has lines to {len(lines)} of the {count} other shard(s) (the "
                          "kernel died before it named them), so their state cannot be saved")
    states = []
    for line in lines:
        state, msg = line.request(State())
        states.append((state, [msg.floats(i).copy() for i in range(len(msg.buffers))]))
    return states


def shut_down_others(hub) -> None:
    """Shard 0: ask every other shard to leave its loop (one that does not answer is left to its
    idle timeout)."""
    for line in [] if hub.peers is None else hub.peers.lines:
        try:
            line.request(Shutdown())
        except NbdistError as exc:
            log.warning("hub 0: %s did not answer its shutdown (%s)", line.name, exc)
