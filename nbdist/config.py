"""TrainConfig: every option of a run, validated once at the edge.

The magic and `nbdist.train` both build a `TrainConfig`; everything behind them (hub,
workers, Run) trusts it. Enums are plain strings so `--mode async` and `mode="async"` and
`Mode.ASYNC` are the same thing.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Sequence

from nbdist.errors import ConfigError


class Mode(enum.StrEnum):
    """Where the training runs."""

    ASYNC = "async"  # nbdist's parameter server on the engine cluster
    SYNC = "sync"  # Horovod allreduce across the worker engines
    LOCAL = "local"  # the same hub and worker loop, inside this kernel; no cluster needed


class Algorithm(enum.StrEnum):
    """The update rule the hub applies to each push."""

    ASGD = "asgd"
    HOGWILD = "hogwild"


class Transport(enum.StrEnum):
    """How parameters and gradients travel between a worker and a hub shard."""

    AUTO = "auto"  # shared memory when on the same host, TCP otherwise
    TCP = "tcp"  # raw frames over TCP (what crosses hosts)
    SHM = "shm"  # same host only: buffers in shared memory, only signed headers on ZeroMQ


def _choice(enum_type: type[enum.Enum], value: object, flag: str) -> enum.Enum:
    try:
        return enum_type(value.value if isinstance(value, enum.Enum) else str(value).lower())
    except ValueError:
        valid = ", ".join(repr(m.value) for m in enum_type)
        raise ConfigError(
            f"Unknown {flag} {value!r}. Expected one of: {valid}. "
            f"Pass one of those, e.g. {flag} {next(iter(enum_type)).value}."
        ) from None


def parse_names(value: str | Sequence[str] | None, flag: str) -> tuple[str, ...] | None:
    """'x,y' or ('x', 'y') -> ('x', 'y'); None stays None."""
    if value is None:
        return None
    names = tuple(n.strip() for n in value.split(",")) if isinstance(value, str) else tuple(value)
    if len(names) != 2 or not all(n.isidentifier() for n in names):
        raise ConfigError(
            f"{flag} expects two Python names, inputs then labels (Received: {value!r}). "
            f"Write it as {flag} x_train,y_train."
        )
    return names


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """One run's options. Build with `TrainConfig(...)`; invalid values raise ConfigError.

    Example:
        >>> TrainConfig(mode="async", workers=2, epochs=1, batch_size=64).algorithm
        <Algorithm.ASGD: 'asgd'>
    """

    mode: Mode = Mode.ASYNC
    algorithm: Algorithm = Algorithm.ASGD
    workers: int | None = None  # None: every engine that is not a parameter shard
    servers: int = 1
    epochs: int = 1
    batch_size: int = 32
    lr: float | None = None  # None: the learning rate of the cell's optimizer
    model: str | None = None  # None: the one compiled keras.Model the cell defines
    data: tuple[str, str] = ("x_train", "y_train")
    validation: tuple[str, str] | None = None  # None: ("x_test", "y_test") if the cell has them
    no_validation: bool = False
    seed: int = 0
    transport: Transport = Transport.AUTO
    timeout: float = 120.0  # seconds a hub or worker may stay silent before the run fails

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "mode", _choice(Mode, self.mode, "--mode"))
        set_(self, "algorithm", _choice(Algorithm, self.algorithm, "--algorithm"))
        set_(self, "transport", _choice(Transport, self.transport, "--transport"))
        set_(self, "data", parse_names(self.data, "--data"))
        set_(self, "validation", parse_names(self.validation, "--validation"))
        for flag, value, low in (("--epochs", self.epochs, 1), ("--batch-size", self.batch_size, 1),
                                 ("--servers", self.servers, 1)):
            _check_int(flag, value, low)
        if self.workers is not None:
            _check_int("--workers", self.workers, 1)
        if self.lr is not None and not (math.isfinite(self.lr) and self.lr > 0):
            raise ConfigError(
                f"--lr must be a positive finite number (Received: {self.lr!r}). "
                "Try a value such as 0.01, or leave it out to use the cell's optimizer's rate."
            )
        if self.model is not None and not str(self.model).isidentifier():
            raise ConfigError(f"--model expects a Python name (Received: {self.model!r}).")
        if self.timeout <= 0:
            raise ConfigError(f"timeout must be positive seconds (Received: {self.timeout!r}).")
        if self.mode is Mode.SYNC and (self.servers != 1 or self.algorithm is not Algorithm.ASGD):
            raise ConfigError(
                f"--mode sync averages gradients with Horovod allreduce: it has no parameter server, "
                f"so --servers and --algorithm do not apply (Received: --servers {self.servers}, "
                f"--algorithm {self.algorithm.value}). Drop them, or use --mode async."
            )
        if self.mode is Mode.LOCAL and (self.workers or 1) != 1:
            raise ConfigError(
                f"--mode local trains with one worker inside this kernel (Received: --workers "
                f"{self.workers}). Use --mode async with a cluster (%nbdist start N) for more."
            )

    def replace(self, **changes: object) -> TrainConfig:
        """A copy with some options changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        """Plain JSON-able dict (enums as strings), for engines and logs."""
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}


def _plain(value: object) -> object:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple):
        return list(value)
    return value


def _check_int(flag: str, value: object, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(
            f"{flag} must be a whole number >= {low} (Received: {value!r}). "
            f"Pass e.g. {flag} {max(low, 1)}."
        )
