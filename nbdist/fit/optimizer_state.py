"""The optimizer's state as the run holds it, written into the kernel model's Keras optimizer at
each epoch's end when a `ModelCheckpoint` saves the whole model (`save_weights_only=False`), so
that it saves the moments and the step count with the weights, and `keras.models.load_model`
then `fit` continues as after Keras's own checkpoint (`nbdist.fit.driver` decides when).

Async and local runs hold the state on their hub shards, as flat slices named as Keras names
its slots ("momentum", "velocity", ...: `nbdist.algorithms.optimizer_rules`); a sync run's rank
0 keeps the cell's own Keras optimizer and sends its slots in build order
(`nbdist.checkpoint.sync_state`). `shard_slots` and `sync_slots` read either into one
`OptimizerState`; `write_into` assigns it to the Keras optimizer's variables. A pipeline's
stages each step their own optimizer: `nbdist.modes.pipeline.optimizer_slots` names their slots
as the kernel's optimizer does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nbdist.checkpoint.sync_state import write_slots

_SLOT_PREFIX = "opt."  # how a shard's state names its optimizer arrays (nbdist.hub.export)


@dataclass
class OptimizerState:
    """Either named flat slots over every trainable parameter (`named`: the hub's), the Keras
    optimizer's slot variables concatenated in build order (`ordered`: a sync rank's), or each
    slot variable's value by its name in the kernel's optimizer (`by_name`: the pipeline
    stages')."""

    iterations: int
    named: dict[str, np.ndarray] | None = None
    ordered: np.ndarray | None = None
    by_name: dict[str, np.ndarray] | None = None


def shard_slots(shards: list) -> OptimizerState | None:
    """The hub shards' `state` replies ((ShardState, arrays) each) as one state: each slot's
    slices joined in shard order (shards are contiguous slices of the flat parameters); a sync
    run's reply (rank 0's state) as `sync_slots` reads it; None where the hubs keep no optimizer
    (the workers step it)."""
    ordered = sorted(shards, key=lambda s: s[0].shard)
    first = ordered[0][0]
    if first.sync:
        arrays = dict(zip(first.names, ordered[0][1], strict=True))
        return sync_slots(first.sync["iterations"], arrays["optimizer_slots"])
    if first.optimizer is None:
        return None
    names = [n[len(_SLOT_PREFIX):] for n in first.names if n.startswith(_SLOT_PREFIX)]
    joined = {}
    for name in names:
        joined[name] = np.concatenate(
            [dict(zip(s.names, arrays, strict=True))[_SLOT_PREFIX + name] for s, arrays in ordered])
    return OptimizerState(iterations=int(first.numbers.get(_SLOT_PREFIX + "iterations", 0)),
                          named=joined)


def sync_slots(iterations: int, slots) -> OptimizerState:
    """Rank 0's Keras slots in build order and step count (a sync run's snapshot, or what it
    returned at the end) as an OptimizerState."""
    return OptimizerState(iterations=int(iterations), ordered=np.asarray(slots, np.float32))


def final_slots(backend) -> OptimizerState | None:
    """A finished sync run's state: what rank 0 returned (its slots, its step count); None for
    other runs (their hubs' state is kept at each epoch's end by the run's monitor)."""
    results = getattr(backend, "results", {}).values()
    result = next((r for r in results if isinstance(r, dict) and r.get("rank") == 0), None)
    if not result or "slots" not in result:
        return None
    return sync_slots(result["iterations"], result["slots"])


def write_into(model, state: OptimizerState) -> list[str]:
    """Assign `state` to `model.optimizer`'s variables (building them first, as `fit` would).
    Returns the slots of the state that the optimizer has no variable for (none when the cell
    compiled the optimizer the hub applies)."""
    optimizer = model.optimizer
    trainable = list(model.trainable_variables)
    if not optimizer.built:
        optimizer.build(trainable)
    optimizer.iterations.assign(state.iterations)
    if state.ordered is not None:
        write_slots(optimizer, state.ordered)
        return []
    by_name = {v.name: v for v in optimizer.variables}
    if state.by_name is not None:
        for name, value in state.by_name.items():
            if name in by_name:
                by_name[name].assign(value)
        return sorted(set(state.by_name) - set(by_name))
    missing = []
    for slot, flat in (state.named or {}).items():
        offset = 0
        for variable in trainable:
            n = int(np.prod(variable.shape))
            target = by_name.get(f"{variable.path.replace('/', '_')}_{slot}")
            if target is None:
                missing.append(slot)
                break
            target.assign(flat[offset:offset + n].reshape(variable.shape))
            offset += n
    return missing
