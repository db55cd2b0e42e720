"""A pipeline stage's optimizer state, sent to the kernel with its weights at a fit call's epoch
ends (and returned at the run's end) when a `ModelCheckpoint` saves the whole model, so that the
saved model holds the moments and the step count the stages reached, as `fit`'s would.

Each stage steps its own Keras optimizer over its own variables; Keras names an optimizer's
per-variable slots after the variable (`<variable path, "/" as "_">_<slot>`: "dense_kernel_
momentum"). A stage sends each slot as (its variable's place among the weights it sends, the
slot's name); the kernel, whose layers' names may differ (Keras numbers layers per process),
names it after its own variable at that place (`kernel_names`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from nbdist.fit.optimizer_state import OptimizerState


@dataclass
class StageSlots:
    """What one stage sent of its optimizer: the steps whose variables it sent (in order), each
    slot's owner among those variables, its name and value, and the step count."""

    steps: list[int]
    slot_of: list[int]
    slot_names: list[str]
    values: list[np.ndarray]
    iterations: int


def slot_owners(paths: list[str], names: list[str]) -> list[tuple[int, str] | None]:
    """For each optimizer variable's `names`, the variable it is a slot of (an index into
    `paths`) and the slot's own name; None for the optimizer's own variables (its step count,
    its rate). The longest variable name wins: "d_kernel_1_momentum" is "d/kernel_1"'s.

    Example:
        >>> slot_owners(["d/kernel", "d/kernel_1"],
        ...             ["iteration", "d_kernel_momentum", "d_kernel_1_momentum"])
        [None, (0, 'momentum'), (1, 'momentum')]
    """
    prefixes = sorted(((p.replace("/", "_") + "_", i) for i, p in enumerate(paths)),
                      key=lambda prefix_index: -len(prefix_index[0]))
    return [next(((i, name[len(prefix):]) for prefix, i in prefixes
                  if name.startswith(prefix) and len(name) > len(prefix)), None)
            for name in names]


def stage_slots(optimizer, variables: list) -> tuple[list[int], list[str], list[np.ndarray], int]:
    """This stage's `optimizer` over `variables` (the variables it sends, in order): each
    slot's owner (an index into `variables`), name and value, and the optimizer's step count.
    Nothing before its first step (Keras builds an optimizer then)."""
    if not optimizer.built:
        return [], [], [], 0
    slots = list(optimizer.variables)
    places, names, values = [], [], []
    for slot, owner in zip(slots, slot_owners([v.path for v in variables],
                                              [s.name for s in slots]), strict=True):
        if owner is not None:
            places.append(owner[0])
            names.append(owner[1])
            values.append(np.asarray(slot.numpy()))
    return places, names, values, int(np.asarray(optimizer.iterations.numpy()))


def kernel_names(variables: list, places: list[int], names: list[str]) -> list[str]:
    """The kernel optimizer's names of the slots a stage sent (`stage_slots`), `variables` being
    the kernel's variables at the places the stage's were.

    Example:
        >>> class V:
        ...     def __init__(self, path): self.path = path
        >>> kernel_names([V("seq_3/dense_7/kernel"), V("seq_3/dense_7/bias")], [1, 0],
        ...              ["momentum", "velocity"])
        ['seq_3_dense_7_bias_momentum', 'seq_3_dense_7_kernel_velocity']
    """
    return [f"{variables[i].path.replace('/', '_')}_{name}"
            for i, name in zip(places, names, strict=True)]


def kernel_state(stages: list[StageSlots],
                 variables_of: Callable[[list[int]], list]) -> OptimizerState | None:
    """Every stage's slots as one state named for the kernel's optimizer (`variables_of(steps)`:
    the kernel's variables of those steps, `graph.Graph.step_variables`); None when no stage
    sent any (no callback saves the whole model, or nothing has trained yet)."""
    named: dict[str, np.ndarray] = {}
    iterations = 0
    for stage in stages:
        if not stage.slot_names:
            continue
        names = kernel_names(variables_of(stage.steps), stage.slot_of, stage.slot_names)
        named.update(zip(names, stage.values, strict=True))
        iterations = max(iterations, int(stage.iterations))  # every stage steps every batch
    return OptimizerState(iterations=iterations, by_name=named) if named else None
