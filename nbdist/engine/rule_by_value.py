"""A rule from the notebook on its way to the hub (`nbdist.algorithms.custom`): by value.

A class defined in a notebook cannot be imported by name on an engine, so it travels as
cloudpickle's bytes (as the cell's own functions travel to the engines:
`nbdist.engine.run_cell`), inside the hub's spec (its bytes field): through ipyparallel to the
engine, then on the hub process's standard input, never over nbdist's own sockets, which
unpickle nothing (`nbdist/hub/` and `nbdist/core/` import no pickle: tests/inproc/
test_hub_security.py). The hub registers it before it makes its rule.
"""

from __future__ import annotations

import pickle

from nbdist.algorithms.base import Rule
from nbdist.algorithms.custom import CUSTOM, register


def pack(rule: type[Rule]) -> bytes:
    """`rule` by value, for the hub's spec."""
    import cloudpickle  # only a run with a rule of the user's: a hub process starts without it

    return cloudpickle.dumps(rule)


def unpack(packed: bytes) -> type[Rule]:
    """The class `pack` made. Only the hub's spec carries one, which the user's own kernel
    sent through ipyparallel, as it sends the cell."""
    return pickle.loads(packed)  # noqa: S301 - the user's own code


def custom_rule(name: str) -> bytes | None:
    """The hub's spec's `rule` for the run's rule called `name`: a rule of the user's (one
    registered in this kernel) packed, None for a built-in one."""
    rule = CUSTOM.get(name)
    return None if rule is None else pack(rule)


def register_packed(packed: bytes | None) -> None:
    """Make the spec's rule (if any) findable by its name in this hub's process."""
    if packed:
        register(unpack(packed))
