"""What one hub shard saves of itself for a checkpoint, and how it takes it back (on the engine).

`shard_state` is the shard's answer to the kernel's `state` request: its parameters, version,
update-rule state and optimizer slots (and, on shard 0, the data position), as a header of
numbers and a list of float32 arrays. `restore_shard` puts such a state into a freshly built
hub before it serves. The files themselves are written and checked in the kernel
(`nbdist.checkpoint.store`).
"""

from __future__ import annotations

import numpy as np

from nbdist.core.schedule import EpochSchedule


def export_fields(obj, fields: tuple[str, ...]) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """`obj`'s state fields split into float32 arrays (sent as frames) and numbers (JSON)."""
    return split_state({name: getattr(obj, name) for name in fields})


def split_state(state: dict) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """A state dict split into float32 arrays (sent as frames) and numbers (JSON)."""
    arrays, numbers = {}, {}
    for name, value in state.items():
        if isinstance(value, np.ndarray):
            arrays[name] = np.ascontiguousarray(value, dtype=np.float32).copy()
        else:
            numbers[name] = value.item() if isinstance(value, np.generic) else value
    return arrays, numbers


def import_fields(obj, fields: tuple[str, ...], values: dict) -> None:
    """Put saved fields back into `obj`, in place; arrays must match in shape."""
    if set(values) != set(fields):
        raise ValueError(f"{type(obj).__name__} state has fields {sorted(values)}, expected {sorted(fields)}")
    for name in fields:
        current, value = getattr(obj, name), values[name]
        if isinstance(current, np.ndarray):
            value = np.asarray(value, dtype=np.float32)
            if value.shape != current.shape:
                raise ValueError(f"{name} has shape {value.shape}, expected {current.shape}")
            np.copyto(current, value)
        else:
            setattr(obj, name, type(current)(value))


def shard_state(hub) -> tuple[dict, list[np.ndarray]]:
    """The `state` reply of one hub shard: header (numbers, data position) and arrays."""
    if getattr(hub, "sync_snapshot", None) is not None:  # sync mode: the weights rank 0 sent
        from nbdist.checkpoint.sync_state import hub_state

        return hub_state(hub)
    arrays = {"params": hub.params.copy()}
    numbers = {}
    if hub.coordinator is not None:
        arrays["non_trainable"] = hub.non_trainable.copy()
    rule, opt = hub.updater.rule, hub.updater.optimizer
    for prefix, (a, n) in (("rule", export_fields(rule, rule.state_fields)),
                           ("opt", split_state(opt.export_state()) if opt is not None else ({}, {}))):
        arrays.update({f"{prefix}.{k}": v for k, v in a.items()})
        numbers.update({f"{prefix}.{k}": v for k, v in n.items()})
    header = {"op": "state", "shard": hub.spec.shard, "version": hub.version,
              "lr": hub.updater.learning_rate() if hub.spec.plan.lr_owner == "hub"
              else (hub.coordinator.lr if hub.coordinator is not None else None),
              "rule": rule.name, "rule_options": rule.options, "optimizer": hub.updater.spec,
              "numbers": numbers, "names": list(arrays)}
    c = hub.coordinator
    if c is not None:
        header["schedule"] = c.schedule.state()
        header["evals_pending"] = sorted({*c.eval_queue, *c.evaluating.values()})
    return header, list(arrays.values())


def restore_shard(hub, state: dict) -> None:
    """Put one shard's saved state into a freshly built hub, before it serves."""
    hub.version = int(state["version"])
    rule, opt = hub.updater.rule, hub.updater.optimizer
    import_fields(rule, rule.state_fields, state.get("rule", {}))
    if opt is not None and state.get("opt"):  # (a sync run's metrics hub saves none)
        opt.restore_state(state["opt"])
    c = hub.coordinator
    if c is not None and "schedule" in state:
        c.schedule = EpochSchedule.from_state(state["schedule"], epochs=c.plan.epochs)
        if c.plan.has_validation:
            c.eval_queue.extend(state.get("evals_pending", []))
