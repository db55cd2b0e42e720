"""Keras's learning-rate schedules, evaluated in NumPy at the hub's global step.

Responsible for:
- `schedule_value`: the learning rate of a spec at a step, as Keras's `schedule(step)` computes it;
- `SUPPORTED_SCHEDULES`: the classes nbdist reproduces.
A cell's Keras schedule object becomes a spec in `nbdist.engine.optimizer_spec.describe_schedule`.

The formulas, their float32 arithmetic and their operation order follow Keras 3's source
(`keras/src/optimizers/schedules/learning_rate_schedule.py`), so values agree to float32 noise.
The hub evaluates a schedule at its number of applied updates, as Keras's optimizer evaluates
it at `optimizer.iterations`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from nbdist.errors import UnsupportedOptimizerError

__all__ = ["SUPPORTED_SCHEDULES", "schedule_value"]

_F = np.float32

# Each schedule's constructor defaults in Keras 3 (`None`: a required argument).
SCHEDULE_DEFAULTS: dict[str, dict[str, Any]] = {
    "ExponentialDecay": {"initial_learning_rate": None, "decay_steps": None, "decay_rate": None,
                         "staircase": False},
    "PiecewiseConstantDecay": {"boundaries": None, "values": None},
    "CosineDecay": {"initial_learning_rate": None, "decay_steps": None, "alpha": 0.0,
                    "warmup_target": None, "warmup_steps": 0},
    "CosineDecayRestarts": {"initial_learning_rate": None, "first_decay_steps": None, "t_mul": 2.0,
                            "m_mul": 1.0, "alpha": 0.0},
    "InverseTimeDecay": {"initial_learning_rate": None, "decay_steps": None, "decay_rate": None,
                         "staircase": False},
    "PolynomialDecay": {"initial_learning_rate": None, "decay_steps": None,
                        "end_learning_rate": 0.0001, "power": 1.0, "cycle": False},
}
_OPTIONAL_NONE = {("CosineDecay", "warmup_target")}  # defaults that are None on purpose

SUPPORTED_SCHEDULES: tuple[str, ...] = tuple(SCHEDULE_DEFAULTS)

HOW_TO_PROCEED = ("Use one of these schedules, or a constant learning rate; or pass "
                   "--server-optimizer sgd to train with SGD at a constant rate on purpose.")


def jsonable(value: Any) -> Any:
    """Plain Python numbers, lists and strings (schedule configs may hold NumPy scalars)."""
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value)
    if value is None or isinstance(value, str):
        return value
    try:  # a 0-d tensor or array
        return float(value)
    except (TypeError, ValueError):
        raise UnsupportedOptimizerError(
            f"A learning-rate schedule holds a value nbdist cannot read. Received: {value!r} "
            f"({type(value).__name__}). Expected numbers. {HOW_TO_PROCEED}") from None


def checked_schedule(spec: dict) -> tuple[str, dict[str, Any]]:
    """(class name, config with Keras's defaults filled in); refuses unknown or incomplete specs."""
    name = spec.get("class_name") if isinstance(spec, dict) else None
    if name not in SCHEDULE_DEFAULTS:
        raise UnsupportedOptimizerError(
            f"Unknown learning-rate schedule. Received: {name!r}. Supported: "
            f"{', '.join(SUPPORTED_SCHEDULES)}. {HOW_TO_PROCEED}")
    given = dict(spec.get("config") or {})
    config = {**SCHEDULE_DEFAULTS[name],
              **{k: v for k, v in given.items() if k in SCHEDULE_DEFAULTS[name]}}
    missing = [k for k, v in config.items() if v is None and (name, k) not in _OPTIONAL_NONE]
    if missing:
        raise UnsupportedOptimizerError(
            f"The {name} schedule's config lacks {', '.join(missing)}. Received: {given!r}. "
            f"Expected the config of keras.optimizers.schedules.{name} "
            f"(describe_schedule gives it).")
    return name, config


def schedule_value(spec: dict, step: int) -> float:
    """The learning rate of the schedule `spec` at `step`, equal to Keras's `schedule(step)`.

    Example:
        >>> spec = {"class_name": "ExponentialDecay",
        ...         "config": {"initial_learning_rate": 0.1, "decay_steps": 10, "decay_rate": 0.5}}
        >>> round(schedule_value(spec, 20), 6)
        0.025
    """
    name, config = checked_schedule(spec)
    return float(_FORMULAS[name](config, int(step)))


# -- the formulas, in float32 like Keras (the initial rate is a float32 tensor; all is cast to it)


def _exponential(c: dict, step: int) -> np.float32:
    p = _F(step) / _F(c["decay_steps"])
    if c["staircase"]:
        p = np.floor(p)
    return _F(c["initial_learning_rate"]) * np.power(_F(c["decay_rate"]), p)


def _inverse_time(c: dict, step: int) -> np.float32:
    p = _F(step) / _F(c["decay_steps"])
    if c["staircase"]:
        p = np.floor(p)
    return _F(c["initial_learning_rate"]) / (_F(1) + _F(c["decay_rate"]) * p)


def _piecewise(c: dict, step: int) -> np.float32:
    # Keras casts the boundaries to the step's integer dtype (a float boundary truncates), then
    # sums indicator * value over the ranges: (-inf, b0], (b0, b1], ..., (b_last, inf).
    b = [math.trunc(x) for x in c["boundaries"]]
    values = [_F(v) for v in c["values"]]
    result = _F(0)
    result += _F(step <= b[0]) * values[0]
    result += _F(step > b[-1]) * values[-1]
    for low, high, value in zip(b[:-1], b[1:], values[1:-1], strict=True):
        result += _F(low < step <= high) * value
    return result


def _cosine_decay(step: np.float32, decay_steps: np.float32, decay_from: np.float32,
                  alpha: float) -> np.float32:
    completed = step / decay_steps
    cosine = _F(0.5) * (_F(1) + np.cos(_F(math.pi) * completed))
    decayed = _F(1 - alpha) * cosine + _F(alpha)
    return decay_from * decayed


def _cosine(c: dict, step: int) -> np.float32:
    lr0, decay_steps, s = _F(c["initial_learning_rate"]), _F(c["decay_steps"]), _F(step)
    if c["warmup_target"] is None:
        return _cosine_decay(min(s, decay_steps), decay_steps, lr0, c["alpha"])
    target, warmup = _F(c["warmup_target"]), _F(c["warmup_steps"])
    s = min(s, decay_steps + warmup)
    if s < warmup:
        return (target - lr0) * (s / warmup) + lr0
    return _cosine_decay(s - warmup, decay_steps, target, c["alpha"])


def _cosine_restarts(c: dict, step: int) -> np.float32:
    lr0, alpha = _F(c["initial_learning_rate"]), _F(c["alpha"])
    t_mul, m_mul = _F(c["t_mul"]), _F(c["m_mul"])
    completed = _F(step) / _F(c["first_decay_steps"])
    if t_mul == _F(1):
        i_restart = np.floor(completed)
        completed = completed - i_restart
    else:  # the periods grow geometrically: find the restart from the sum of the series
        i_restart = np.floor(np.log(_F(1) - completed * (_F(1) - t_mul)) / np.log(t_mul))
        sum_r = (_F(1) - np.power(t_mul, i_restart)) / (_F(1) - t_mul)
        completed = (completed - sum_r) / np.power(t_mul, i_restart)
    cosine = _F(0.5) * np.power(m_mul, i_restart) * (_F(1) + np.cos(_F(math.pi) * completed))
    return lr0 * ((_F(1) - alpha) * cosine + alpha)


def _polynomial(c: dict, step: int) -> np.float32:
    lr0, end, power = _F(c["initial_learning_rate"]), _F(c["end_learning_rate"]), _F(c["power"])
    s, decay_steps = _F(step), _F(c["decay_steps"])
    if c["cycle"]:  # decay over the first multiple of decay_steps past the step (1 at step 0)
        multiplier = _F(1) if s == 0 else np.ceil(s / _F(c["decay_steps"]))
        decay_steps = decay_steps * multiplier
    else:
        s = min(s, decay_steps)
    p = s / decay_steps
    return (lr0 - end) * np.power(_F(1) - p, power) + end


_FORMULAS: dict[str, Callable[[dict, int], np.float32]] = {
    "ExponentialDecay": _exponential,
    "PiecewiseConstantDecay": _piecewise,
    "CosineDecay": _cosine,
    "CosineDecayRestarts": _cosine_restarts,
    "InverseTimeDecay": _inverse_time,
    "PolynomialDecay": _polynomial,
}
