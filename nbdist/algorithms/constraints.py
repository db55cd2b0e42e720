"""Keras's built-in weight constraints, applied by the hub after each update as Keras does.

Keras's `optimizer.apply` ends with `variable.assign(variable.constraint(variable))` for every
variable that has a constraint. The hub does the same after every update it applies (an
optimizer step, a group step, a local-steps delta, an EASGD elastic sum), on each constrained
variable: its flat segment viewed in the variable's shape, in place. The formulas, their order
and their float32 casts follow Keras 3.15 (`keras/src/constraints/constraints.py`):

    norms   = sqrt(Σ_axis w²)                             (keepdims, float32)
    MaxNorm     w · (clip(norms, 0, max_value) / (ε + norms))
    MinMaxNorm  w · ((rate · clip(norms, min_value, max_value) + (1 − rate) · norms) / (ε + norms))
    UnitNorm    w / (ε + norms)
    NonNeg      max(w, 0)

`ε` is Keras's `backend.epsilon()` (1e-7 unless the cell set another), read on the kernel.
The squares are summed in float32 16 at a time and those partial sums in float64, rounded to
float32 once: within about 1e-7 of the exact sum of the float32 squares, which TensorFlow's
own reduction approximates too (a float32 sum of 784 squares one after another is up to 3e-6
off). Over the leading axes (a Dense kernel's axis 0, a convolution's [0, 1, 2], a bias) that
takes one pass over the variable, without storing the squares.

A constraint is described by a JSON-able entry (`nbdist.engine.optimizer_spec.
describe_constraints` reads them from the model's variables, kernel side):
`{"variable": "dense/kernel", "start": 0, "shape": [784, 128], "class_name": "MaxNorm",
"config": {"max_value": 2.0, "axis": 0}, "epsilon": 1e-7}`, `start` being where the variable's
floats begin in the flat vector. Its norms need the whole variable, so a shard holds all of a
constrained variable or none of it (`constrained_ranges` gives the ranges a shard cut must not
fall inside; `nbdist.core.sharding.shard_bounds` respects them). Importing this module loads
NumPy only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from nbdist.errors import ConfigError

__all__ = ["DEFAULTS", "SUPPORTED_CONSTRAINTS", "ShardConstraints", "checked_constraint",
           "constrain", "constrained_ranges"]

_F = np.float32
_ROWS = 16  # squares summed in float32 before the float64 sum

# Keras's constructor defaults, by class (MaxNorm's max_value=2 is an int in Keras; the same number)
DEFAULTS: dict[str, dict[str, Any]] = {
    "MaxNorm": {"max_value": 2.0, "axis": 0},
    "MinMaxNorm": {"min_value": 0.0, "max_value": 1.0, "rate": 1.0, "axis": 0},
    "NonNeg": {},
    "UnitNorm": {"axis": 0},
}
SUPPORTED_CONSTRAINTS: tuple[str, ...] = tuple(DEFAULTS)
_ENTRY_KEYS = {"variable", "start", "shape", "class_name", "config", "epsilon"}


def _norms(w: np.ndarray, axes: tuple[int, ...] | None) -> np.ndarray:
    """`sqrt(sum(square(w), axes, keepdims=True))` in float32, as Keras computes it."""
    axes = tuple(range(w.ndim)) if axes is None else axes
    lead = len(axes)
    if axes != tuple(range(lead)):  # not the leading axes: NumPy's reduction, in float64
        total = np.add.reduce(np.square(w), axis=axes, dtype=np.float64, keepdims=True)
        return np.sqrt(total.astype(_F))
    rows, cols = math.prod(w.shape[:lead]), math.prod(w.shape[lead:])
    flat = w.reshape(rows, cols)
    whole = rows - rows % _ROWS
    blocks = flat[:whole].reshape(-1, _ROWS, cols)
    total = np.einsum("bij,bij->bj", blocks, blocks).sum(axis=0, dtype=np.float64)
    total += np.einsum("ij,ij->j", flat[whole:], flat[whole:])  # the last rows % 16
    return np.sqrt(total.astype(_F)).reshape((1,) * lead + w.shape[lead:])


def _scale(w: np.ndarray, desired: np.ndarray, norms: np.ndarray, epsilon: np.float32) -> None:
    """`w *= desired / (ε + norms)`, the factor first, as Keras."""
    np.add(norms, epsilon, out=norms)
    np.divide(desired, norms, out=desired)
    np.multiply(w, desired, out=w)


def max_norm(w: np.ndarray, max_value: float = 2.0, axis: Any = 0, epsilon: float = 1e-7) -> None:
    """Keras's `MaxNorm`, in place on `w` (the variable's shape).

    Example:
        >>> w = np.array([[3.0, 0.5], [4.0, 0.0]], np.float32)  # column norms 5 and 0.5
        >>> max_norm(w, 2.0); np.round(w.astype(float), 6).tolist()
        [[1.2, 0.5], [1.6, 0.0]]
    """
    norms = _norms(w, _axes(axis, w.ndim))
    desired = np.clip(norms, _F(0), _F(max_value))
    _scale(w, desired, norms, _F(epsilon))


def min_max_norm(w: np.ndarray, min_value: float = 0.0, max_value: float = 1.0, rate: float = 1.0,
                 axis: Any = 0, epsilon: float = 1e-7) -> None:
    """Keras's `MinMaxNorm`, in place: norms moved `rate` of the way into [min_value, max_value].

    Example:
        >>> w = np.array([[0.3], [0.4]], np.float32)  # norm 0.5, raised to 1
        >>> min_max_norm(w, 1.0, 2.0); np.round(w.astype(float), 6).tolist()
        [[0.6], [0.8]]
    """
    norms = _norms(w, _axes(axis, w.ndim))
    desired = np.clip(norms, _F(min_value), _F(max_value))
    np.multiply(desired, _F(rate), out=desired)
    desired += _F(1 - rate) * norms  # (1 - rate) in Python, then float32, as Keras
    _scale(w, desired, norms, _F(epsilon))


def unit_norm(w: np.ndarray, axis: Any = 0, epsilon: float = 1e-7) -> None:
    """Keras's `UnitNorm`, in place: `w / (ε + norms)` (a division, as Keras).

    Example:
        >>> w = np.array([[3.0], [4.0]], np.float32)
        >>> unit_norm(w); np.round(w.astype(float), 6).tolist()
        [[0.6], [0.8]]
    """
    norms = _norms(w, _axes(axis, w.ndim))
    np.add(norms, _F(epsilon), out=norms)
    np.divide(w, norms, out=w)


def non_neg(w: np.ndarray, epsilon: float = 1e-7) -> None:
    """Keras's `NonNeg`, in place: `max(w, 0)`.

    Example:
        >>> w = np.array([-1.0, 2.0], np.float32); non_neg(w); w.tolist()
        [0.0, 2.0]
    """
    np.maximum(w, _F(0), out=w)


_FUNCTIONS: dict[str, Callable[..., None]] = {
    "MaxNorm": max_norm, "MinMaxNorm": min_max_norm, "NonNeg": non_neg, "UnitNorm": unit_norm}


def constrain(w: np.ndarray, class_name: str, config: dict, epsilon: float = 1e-7) -> None:
    """Apply the constraint `class_name(**config)` to `w` (the variable's shape) in place."""
    _FUNCTIONS[class_name](w, **config, epsilon=epsilon)


def _axes(axis: Any, ndim: int) -> tuple[int, ...] | None:
    """Keras's `axis` (an int, a list of ints, or None: all) as non-negative axes, or refuse."""
    if axis is None:
        return None
    axes = [axis] if isinstance(axis, (int, np.integer)) and not isinstance(axis, bool) else axis
    if not isinstance(axes, (list, tuple)) or not all(
            isinstance(a, (int, np.integer)) and not isinstance(a, bool) and -ndim <= a < ndim
            for a in axes):
        raise ConfigError(f"A constraint's axis must be an int or a list of ints within the "
                          f"variable's {ndim} dimension(s). Received: axis={axis!r}.")
    return tuple(sorted({int(a) % ndim for a in axes}))


def checked_constraint(entry: Any) -> dict:
    """`entry` with Keras's defaults filled into its config, or a `ConfigError` that says what is
    wrong with it (the hub checks what the kernel described before applying anything).

    Example:
        >>> e = {"variable": "k", "start": 0, "shape": [3, 2], "class_name": "MaxNorm",
        ...      "config": {"max_value": 3}, "epsilon": 1e-7}
        >>> checked_constraint(e)["config"]
        {'max_value': 3, 'axis': 0}
    """
    if not isinstance(entry, dict) or set(entry) != _ENTRY_KEYS:
        raise ConfigError(f"A constraint entry needs exactly the keys {sorted(_ENTRY_KEYS)}. "
                          f"Received: {entry!r}.")
    name, where = entry["class_name"], f"variable {entry['variable']!r}"
    if name not in DEFAULTS:
        raise ConfigError(f"The hub applies the constraints {', '.join(SUPPORTED_CONSTRAINTS)}. "
                          f"Received: {name!r} on {where}.")
    shape, start, epsilon = entry["shape"], entry["start"], entry["epsilon"]
    if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)
            and isinstance(start, int) and start >= 0):
        raise ConfigError(f"A constraint entry's shape must be a list of sizes and its start a "
                          f"non-negative int. Received: shape={shape!r}, start={start!r} on "
                          f"{where}.")
    if not (isinstance(epsilon, (int, float)) and math.isfinite(epsilon) and epsilon >= 0):
        raise ConfigError(f"A constraint's epsilon must be a finite number >= 0. Received: "
                          f"{epsilon!r} on {where}.")
    given = dict(entry["config"] or {})
    unknown = sorted(set(given) - set(DEFAULTS[name]))
    if unknown:
        raise ConfigError(f"Unknown setting(s) {', '.join(unknown)} for the {name} constraint on "
                          f"{where}. Valid: {', '.join(DEFAULTS[name]) or '(none)'}.")
    config = {**DEFAULTS[name], **given}
    for key, value in config.items():
        if key == "axis":
            _axes(value, len(shape))
        elif isinstance(value, bool) or not (isinstance(value, (int, float))
                                             and math.isfinite(value)):
            raise ConfigError(f"The {name} constraint's {key} must be a finite number. Received: "
                              f"{value!r} on {where}.")
    return {**entry, "config": config}


def constrained_ranges(entries: Sequence[dict]) -> list[tuple[int, int]]:
    """The `[start, end)` floats of each constrained variable: no shard boundary may fall
    strictly inside one.

    Example:
        >>> constrained_ranges([{"start": 10, "shape": [3, 2]}])
        [(10, 16)]
    """
    return [(e["start"], e["start"] + math.prod(e["shape"])) for e in entries]


class ShardConstraints:
    """The constraints on the variables of one shard (floats `[offset, offset + size)` of the
    flat vector), applied after each of its updates. A constrained variable must lie wholly
    inside the shard or wholly outside it.

    Example:
        >>> entry = {"variable": "b", "start": 2, "shape": [2], "class_name": "NonNeg",
        ...          "config": {}, "epsilon": 1e-7}
        >>> cons = ShardConstraints([entry], offset=0, size=4)
        >>> w = np.array([-1, -1, -1, 3], np.float32); cons.apply(w); w.tolist()
        [-1.0, -1.0, 0.0, 3.0]
    """

    def __init__(self, entries: Sequence[dict], offset: int, size: int):
        self._parts: list[tuple[int, int, tuple[int, ...], str, dict, float]] = []
        end = offset + size
        for entry in map(checked_constraint, entries):
            ((lo, hi),) = constrained_ranges([entry])
            if hi <= offset or lo >= end or lo == hi:
                continue
            if lo < offset or hi > end:
                raise ConfigError(
                    f"The constrained variable {entry['variable']!r} (floats [{lo}, {hi})) is cut "
                    f"by the shard [{offset}, {end}); its norms need all of it on one shard. "
                    "Expected shard bounds from nbdist.core.sharding.shard_bounds with the "
                    "constrained ranges.")
            self._parts.append((lo - offset, hi - offset, tuple(entry["shape"]),
                                entry["class_name"], entry["config"], entry["epsilon"]))

    def __bool__(self) -> bool:
        return bool(self._parts)

    def apply(self, w: np.ndarray, refresh: np.ndarray | None = None) -> None:
        """Constrain the shard's variables in `w` (flat, in place). `refresh`: a copy of `w`
        made before (a reply buffer), whose constrained parts are brought up to date."""
        for lo, hi, shape, name, config, epsilon in self._parts:
            constrain(w[lo:hi].reshape(shape), name, config, epsilon)
            if refresh is not None:
                np.copyto(refresh[lo:hi], w[lo:hi])
