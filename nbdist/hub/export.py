"""What a hub shard sends of itself for a checkpoint, and how it takes it back (on the engine).

`shard_state` is the shard's answer to the kernel's `state` request: what its `ShardCore`
exports (parameters, version, update-rule state, optimizer slots and the tail's
sum (`nbdist.core.tail_average`), and, on shard 0, the data
position), as a header of numbers and a list of float32 arrays. In a sync run the hub holds no
weights: `hub_state` answers with rank 0's latest snapshot instead
(`nbdist.checkpoint.sync_state` says how it gets there). `restore_shard` hands a saved state to
a freshly built core (`ShardCore.restore`) before it serves. The files themselves are written
and checked in the kernel (`nbdist.checkpoint.store`), which imports nothing of the hub.
"""

from __future__ import annotations

import numpy as np

from nbdist.core.schedule import schedule_state
from nbdist.wire.messages import ShardState, SyncState


def split_state(state: dict) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """A state dict split into float32 arrays (sent as frames) and numbers (JSON)."""
    arrays, numbers = {}, {}
    for name, value in state.items():
        if isinstance(value, np.ndarray):
            arrays[name] = np.ascontiguousarray(value, dtype=np.float32).copy()
        else:
            numbers[name] = value.item() if isinstance(value, np.generic) else value
    return arrays, numbers


def shard_state(core) -> tuple[ShardState, list[np.ndarray]]:
    """The `state` reply of one shard (a `ShardCore`): numbers, data position, and arrays."""
    state = core.export()
    arrays = {"params": state["params"]}
    if "non_trainable" in state:
        arrays["non_trainable"] = state["non_trainable"]
    numbers = {}
    for prefix, part in (("rule", state["rule_state"]), ("opt", state["opt_state"]),
                         ("tail", state["tail_state"])):
        a, n = split_state(part)
        arrays.update({f"{prefix}.{k}": v for k, v in a.items()})
        numbers.update({f"{prefix}.{k}": v for k, v in n.items()})
    reply = ShardState(numbers=numbers, names=list(arrays), schedule=state.get("schedule"),
                       evals_pending=state.get("evals_pending", []), steps=state.get("steps"),
                       **{k: state[k] for k in ("shard", "version", "lr", "rule", "rule_options",
                                                "optimizer")})
    return reply, list(arrays.values())


def restore_shard(core, state: dict) -> None:
    """Put one shard's saved state into a freshly built `ShardCore`, before it serves."""
    core.restore(state)


def hub_state(core, snapshot: tuple[SyncState, list]) -> tuple[ShardState, list[np.ndarray]]:
    """The hub's `state` reply in a sync run: rank 0's latest `snapshot` as shard 0's state
    (`core`: shard 0's `ShardCore`, for the plan and the rule's name)."""
    s, (params, non_trainable, slots) = snapshot
    plan = core.plan
    # "state_seq", not "seq": the wire's envelope sets a message's own "seq" (wire.schema.ENVELOPE)
    reply = ShardState(shard=0, state_seq=s.seq, final=s.final, version=s.steps, lr=s.lr,
                       rule=core.updater.rule.name, rule_options=core.updater.rule.options,
                       names=["params", "non_trainable", "optimizer_slots"],
                       schedule=schedule_state(plan.num_samples, plan.epochs, s.epoch, s.offset),
                       sync={"optimizer": s.optimizer, "slots": s.slots, "iterations": s.iterations,
                             "steps": s.steps})
    return reply, [params, non_trainable, slots]
