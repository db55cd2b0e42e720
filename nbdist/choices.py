"""The choices of a run's options: each enum a flag takes (plain strings, so `--mode async`,
`mode="async"` and `Mode.ASYNC` are the same thing). `nbdist.config` validates with them and
re-exports them. Which modes take which flag is each mode's spec (`nbdist.modes.MODES`).
"""

from __future__ import annotations

import enum

from nbdist.errors import ConfigError


class Mode(enum.StrEnum):
    """Where the training runs."""

    ASYNC = "async"  # nbdist's parameter server on the engine cluster
    SYNC = "sync"  # Horovod allreduce across the worker engines
    LOCAL = "local"  # the same hub and worker loop, inside this kernel; no cluster needed
    SIMULATE = "simulate"  # the same rules and coordinator, real gradients, virtual step times
    PIPELINE = "pipeline"  # the model cut into stages, one per engine (nbdist.modes.pipeline)


class Algorithm(enum.StrEnum):
    """The update rule the hub applies to each push (see docs/rules.md)."""

    ASGD = "asgd"
    HOGWILD = "hogwild"
    DC_ASGD = "dc-asgd"
    DC_ASGD_A = "dc-asgd-a"
    DDC_ASGD = "ddc-asgd"
    SOFTSYNC = "softsync"
    SSP = "ssp"
    GROUP = "group"
    EASGD = "easgd"
    DILOCO = "diloco"
    ASYNC_LOCAL_SGD = "async-local-sgd"
    STREAMING_DILOCO = "streaming-diloco"


class Collective(enum.StrEnum):
    """What averages the gradients between `--mode sync` ranks (`--collective`)."""

    AUTO = "auto"  # Horovod on TensorFlow where it is installed, else torch.distributed
    HOROVOD = "horovod"  # Horovod's allreduce inside TensorFlow graphs (TensorFlow only)
    TORCH = "torch"  # torch.distributed over Gloo, on a flat NumPy buffer (every Keras backend)


class ServerOptimizer(enum.StrEnum):
    """An optimizer of nbdist's own for the hub, instead of the cell's (`--server-optimizer`).

    Not given: the hub applies the cell's compiled optimizer; with --local-steps, it applies
    the workers' deltas with SGD at rate 1 (the workers step with the cell's optimizer)."""

    SGD = "sgd"
    MOMENTUM = "momentum"
    ADAM = "adam"
    NESTEROV = "nesterov"


class Metrics(enum.StrEnum):
    """How much the hub records per push."""

    FULL = "full"  # history row, timeline row and delay statistics per push
    MINIMAL = "minimal"  # counters only (for measuring what metrics cost)


class Transport(enum.StrEnum):
    """How parameters and gradients travel between a worker and a hub shard."""

    AUTO = "auto"  # shared memory when on the same host, TCP otherwise
    TCP = "tcp"  # raw frames over TCP (what crosses hosts)
    SHM = "shm"  # same host only: buffers in shared memory, only signed headers on ZeroMQ


class Pin(enum.StrEnum):
    """Whether hub shards and workers get cores of their own on a host (nbdist.cluster.affinity)."""

    AUTO = "auto"  # one core per hub shard, the rest split between the host's workers
    OFF = "off"  # the OS schedules every thread anywhere


class Spin(enum.StrEnum):
    """Whether hub shards and their same-host workers poll instead of sleeping
    (nbdist.cluster.affinity)."""

    AUTO = "auto"  # where the host leaves each hub shard a core of its own
    OFF = "off"  # always sleep until a message comes


def choice(enum_type: type[enum.Enum], value: object, flag: str) -> enum.Enum:
    try:
        return enum_type(value.value if isinstance(value, enum.Enum) else str(value).lower())
    except ValueError:
        valid = ", ".join(repr(m.value) for m in enum_type)
        raise ConfigError(
            f"Unknown {flag} {value!r}. Expected one of: {valid}. "
            f"Pass one of those, e.g. {flag} {next(iter(enum_type)).value}."
        ) from None
