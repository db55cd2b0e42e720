"""The kernel's control applied to the run's coordinator: the learning rate, pause and stop, a
worker's slow-down, the batch policy, the rules' live options, regrouping, checkpoint requests
and the epoch gate (one `Control`, from `Run.pause`, `Run.set_lr`, ...), each change recorded
as an event for the views. Kept apart from the coordinator's per-request logic, which only
reads this state on every reply; the coordinator holds it. Pure."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nbdist.core.coordinator import Coordinator
    from nbdist.wire.messages import Control


def apply_control(coord: Coordinator, c: Control, now: float) -> None:
    """Apply every field `c` sets to `coord`'s state, at `now` (the shard's clock)."""
    if c.lr is not None:
        if coord.plan.lr_owner == "workers":
            coord.lr = float(c.lr)
        coord.stats.record_event("set_lr", now, lr=float(c.lr),
                                 **({"by": c.by} if c.by is not None else {}))
    if c.paused is not None and c.paused != coord.paused:
        coord.paused = c.paused
        coord.stats.record_event("pause" if coord.paused else "resume", now)
    if c.stop and not coord.stopping:
        coord.stopping = True
        coord.stats.record_event("stop", now)
    if c.slowdown is not None:
        worker, factor = c.slowdown[0], float(c.slowdown[1])
        coord.slowdown[worker] = factor
        coord.stats.record_event("set_slowdown", now, worker=worker, factor=factor)
    if c.batch_policy is not None:
        coord.sizer.set_policy(c.batch_policy)
        coord.stats.record_event("set_batch_policy", now, policy=c.batch_policy)
    if c.option is not None:  # validated by the rule first (the hub asks it)
        name, value = c.option
        if name == "staleness" and coord.clock is not None:
            coord.clock.staleness = int(value)
        elif name == "max_ratio":
            coord.groups.max_ratio = float(value)
        elif name == "num_groups":
            coord.groups.wanted = int(value)
        coord.stats.record_event("set_option", now, name=name, value=value)
    if c.regroup:
        coord.regroup(now)
    if c.send_state:
        coord.state_wanted += 1
    if c.epoch_done is not None and coord.open_epoch is not None:
        # the kernel ran the epoch's callbacks
        coord.open_epoch = max(coord.open_epoch, c.epoch_done + 1)
    if c.eval is not None:
        # a validation the kernel ran itself (a cell's fit call), for the views
        coord.eval_result(-1, c.eval, now)
