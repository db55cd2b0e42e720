"""Flag values as text, parsed: names, sizes, rule options and slow-down factors.

Each parser takes what the magic or `nbdist.train` received and returns a plain value, or
raises a ConfigError that says what was received and how to write it; `nbdist.config` calls
them once, when a `TrainConfig` is built.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from nbdist.errors import ConfigError

MAX_SLOWDOWN = 100.0  # the slowest a worker may be made to behave (--slowdown, set_slowdown)


def parse_names(value: str | Sequence[str] | None, flag: str) -> tuple[str, ...] | None:
    """'x,y' or ('x', 'y') -> ('x', 'y'): arrays, inputs then labels; 'ds' -> ('ds',): one
    tf.data.Dataset or generator function yielding (inputs, labels); None stays None."""
    if value is None:
        return None
    names = tuple(n.strip() for n in value.split(",")) if isinstance(value, str) else tuple(value)
    if len(names) not in (1, 2) or not all(isinstance(n, str) and n.isidentifier() for n in names):
        raise ConfigError(
            f"{flag} expects two Python names, inputs then labels, or one name of a "
            f"tf.data.Dataset or generator function (Received: {value!r}). Write it as {flag} "
            f"x_train,y_train or {flag} train_ds."
        )
    return names


SIZE_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3,
              "gb": 1000**3, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "t": 1000**4,
              "tb": 1000**4}


def parse_size(value: str | int, flag: str = "--in-memory-limit") -> int:
    """'2GiB' -> 2147483648, '500MB' -> 500000000, 1024 -> 1024 (bytes; 0 is allowed)."""
    if isinstance(value, bool):
        raise ConfigError(f"{flag} expects a size such as 2GiB or 500MB (Received: {value!r}).")
    if isinstance(value, int):
        number, unit = float(value), ""
    else:
        text = str(value).strip().lower().replace(" ", "")
        digits = text.rstrip("abcdefghijklmnopqrstuvwxyz")
        number, unit = digits, text[len(digits):]
        try:
            number = float(number)
        except ValueError:
            number = math.nan
    if unit not in SIZE_UNITS or not (math.isfinite(number) and number >= 0):
        raise ConfigError(f"{flag} expects a size in bytes such as 2GiB, 500MB or 0 (Received: "
                          f"{value!r}). Units: B, KB, MB, GB, KiB, MiB, GiB.")
    return int(number * SIZE_UNITS[unit])


def parse_options(value: str | dict | None) -> dict:
    """'lambda0=2,momentum=0.9' -> {'lambda0': 2.0, 'momentum': 0.9} (numbers only, never eval)."""
    if not value:
        return {}
    items = (value.items() if isinstance(value, dict)
             else (p.partition("=")[::2] for p in value.split(",")))
    options = {}
    for name, raw in items:
        name = str(name).strip()
        try:
            options[name] = float(raw)
        except (TypeError, ValueError):
            raise ConfigError(
                f"--algo-opt expects name=number pairs (Received: {name}={raw!r}). "
                "Write it as --algo-opt lambda0=2,momentum=0.9."
            ) from None
        if not name.isidentifier():
            raise ConfigError(f"--algo-opt option names are identifiers (Received: {name!r}).")
        if not math.isfinite(options[name]):
            raise ConfigError(f"--algo-opt {name} must be a finite number (Received: {raw!r}). "
                              "Write it as --algo-opt lambda0=2,momentum=0.9.")
    return options


def parse_slowdown(value: str | Sequence[float] | None) -> tuple[float, ...] | None:
    """'1,2,4' -> (1.0, 2.0, 4.0); each factor in [1, MAX_SLOWDOWN]."""
    if value is None or value == "":
        return None
    parts = value.split(",") if isinstance(value, str) else list(value)
    try:
        factors = tuple(float(p) for p in parts)
    except (TypeError, ValueError):
        raise ConfigError(f"--slowdown expects numbers, one per worker (Received: {value!r}). "
                          "Example: --slowdown 1,2,4.") from None
    bad = [f for f in factors if not (math.isfinite(f) and 1.0 <= f <= MAX_SLOWDOWN)]
    if bad:
        raise ConfigError(
            f"--slowdown factors must be between 1 (full speed) and {MAX_SLOWDOWN:g} "
            f"(Received: {bad}). A factor k makes a worker behave k times slower."
        )
    return factors
