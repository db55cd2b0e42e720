"""The cell's compiled Keras optimizer read into a spec for the hub (kernel side).

`describe_optimizer` turns the optimizer into a JSON-able spec that `HubOptimizer`
(`nbdist.algorithms.optimizers`) reproduces exactly, and refuses, before the run starts, what
the hub cannot reproduce: another class (a subclass included), mixed-precision wrappers,
`use_ema`, gradient accumulation, a loss scale, custom schedules. `describe_constraints` reads
the variables' Keras constraints, which `optimizer.apply` enforces after each update, for the
hub to apply too (`nbdist.algorithms.constraints`), and refuses custom ones.
Keras is imported lazily, inside the functions.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from nbdist.algorithms.constraints import SUPPORTED_CONSTRAINTS, checked_constraint
from nbdist.algorithms.optimizer_rules import FORMULAS
from nbdist.algorithms.optimizers import (
    BASE_DEFAULTS,
    SUPPORTED_OPTIMIZERS,
    HubOptimizer,
    checked_segments,
    server_optimizer_spec,
    unsupported,
)
from nbdist.algorithms.schedules import (
    HOW_TO_PROCEED,
    SCHEDULE_DEFAULTS,
    SUPPORTED_SCHEDULES,
    checked_schedule,
    jsonable,
)
from nbdist.config import TrainConfig
from nbdist.core.updater import check_composition, describe_spec
from nbdist.errors import ConfigError, UnsupportedOptimizerError
from nbdist.modes import mode_spec

__all__ = ["choose_constraints", "choose_optimizer", "describe_constraints", "describe_optimizer",
           "describe_schedule"]


def describe_optimizer(optimizer: Any, segments: list[int], variables: list | None = None) -> dict:
    """The spec of the cell's compiled Keras optimizer, for `HubOptimizer` (kernel side).

    `segments` are the sizes of the model's trainable variables in flat order. `variables`,
    those variables (`model.trainable_variables`), are optional but let it check more: which
    ones `exclude_from_weight_decay(...)` excludes (needed if the cell called it), and that they
    match the segments. (Their constraints are `describe_constraints`'s.)

    The spec's keys: `class_name`; `config`, the class's hyper-parameters with `weight_decay`,
    `clipnorm`, `clipvalue` and `global_clipnorm`; `learning_rate`, a float or a schedule spec
    (`describe_schedule`); `segments`; and `decay_mask`, one flag per segment, only when some
    variables are excluded from weight decay.

    Raises `UnsupportedOptimizerError` (a `ConfigError`) for anything the hub cannot reproduce
    exactly: another class (a subclass of a supported class included, since nbdist cannot see
    what it changes), a `LossScaleOptimizer` (mixed precision), `use_ema`,
    `gradient_accumulation_steps`, `loss_scale_factor`, a learning rate given as a function or a
    custom schedule.

    Example:
        >>> import keras
        >>> spec = describe_optimizer(keras.optimizers.Adam(clipnorm=1.0), [6, 2])
        >>> spec["class_name"], spec["config"]["clipnorm"], spec["segments"]
        ('Adam', 1.0, [6, 2])
    """
    import keras  # Keras: after the cell picks its backend

    cls = type(optimizer)
    received = f"{cls.__module__}.{cls.__qualname__}"
    # PyTorch's keras.optimizers.Adam is Keras's own subclass
    if cls.__module__.startswith("keras.src.backend."):
        cls = next((c for c in cls.__mro__[1:]
                    if not c.__module__.startswith("keras.src.backend.")), cls)
    name = cls.__name__
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        raise unsupported("it is wrapped in a LossScaleOptimizer (mixed precision: the hub "
                           "applies float32 gradients and keeps no loss scale)", received)
    if name not in SUPPORTED_OPTIMIZERS or getattr(keras.optimizers, name, None) is not cls:
        keras_base = next((c for c in cls.__mro__[1:] if c.__name__ in SUPPORTED_OPTIMIZERS
                           and getattr(keras.optimizers, c.__name__, None) is c), None)
        what = (f"it is a subclass of keras.optimizers.{keras_base.__name__}, and nbdist cannot "
                f"know what the subclass changes" if keras_base else "it is not a built-in "
                "Keras optimizer nbdist reproduces")
        raise unsupported(what, received)
    if optimizer.use_ema:
        raise unsupported("use_ema=True (the hub keeps no moving average of the weights)",
                           f"{name}(use_ema=True)")
    if optimizer.gradient_accumulation_steps:
        steps = optimizer.gradient_accumulation_steps
        raise unsupported("gradient accumulation (the hub's update rule decides when "
                           "gradients are applied)",
                           f"{name}(gradient_accumulation_steps={steps!r})")
    if optimizer.loss_scale_factor is not None:
        raise unsupported("a loss scale factor", f"{name}(loss_scale_factor="
                           f"{optimizer.loss_scale_factor!r})")
    segments = checked_segments(segments)
    if variables is not None:
        _check_variables(list(variables), segments)
    # the schedule or the variable, not its current value
    lr = optimizer._learning_rate  # noqa: SLF001
    if isinstance(lr, keras.optimizers.schedules.LearningRateSchedule):
        lr = describe_schedule(lr)
    elif isinstance(lr, keras.Variable) or not callable(lr):
        lr = float(np.asarray(lr))
    else:
        raise unsupported("its learning rate is a function nbdist cannot evaluate on the hub",
                           f"learning_rate={lr!r}")
    # attributes, not get_config(): that serializes the learning rate, and fails on some
    keys = (*BASE_DEFAULTS, *FORMULAS[name].defaults)
    config = {key: _plain(getattr(optimizer, key)) for key in keys}
    spec: dict[str, Any] = {"class_name": name, "config": config, "learning_rate": lr,
                            "segments": segments}
    mask = _decay_mask(optimizer, segments, variables)
    if mask is not None:
        spec["decay_mask"] = mask
    HubOptimizer(spec, 0)  # the same checks the hub makes, now, on the kernel
    return spec


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (np.bool_,)):
        return bool(value)
    return float(value)


def _decay_mask(optimizer: Any, segments: list[int], variables: list | None) -> list[bool] | None:
    """Which variables Keras decays, when `exclude_from_weight_decay` excluded some (else None:
    all of them, Keras's default, biases and normalisation scales included)."""
    excluded = getattr(optimizer, "_exclude_from_weight_decay", None)
    pattern = getattr(optimizer, "_exclude_from_weight_decay_pattern", None)
    if optimizer.weight_decay is None or (not excluded and pattern is None):
        return None
    if variables is None and optimizer.built:
        variables = optimizer._trainable_variables  # noqa: SLF001
    if variables is None:
        raise unsupported("exclude_from_weight_decay(...) was called, and nbdist was not given "
                           "the variables to tell which ones it excludes",
                           f"{type(optimizer).__name__}(weight_decay={optimizer.weight_decay!r})")
    _check_variables(list(variables), segments)
    return [bool(optimizer._use_weight_decay(v)) for v in variables]  # noqa: SLF001


def _check_variables(variables: list, segments: list[int]) -> None:
    """The variables match the segments, and Keras's `apply` would do nothing to them beyond
    the optimizer's update and their constraints (no float8 `overwrite_with_gradient`)."""
    sizes = [int(np.prod(v.shape)) for v in variables]
    if sizes != segments:
        raise ConfigError(f"The variables given to describe_optimizer do not match the segments. "
                          f"Received: sizes {sizes} vs segments {segments}. Expected the model's "
                          f"trainable variables in flat order.")
    for v in variables:
        name = _name(v)
        if getattr(v, "overwrite_with_gradient", False):
            raise UnsupportedOptimizerError(
                f"The hub cannot train a variable that Keras overwrites with its gradient "
                f"(float8 training). Received: variable {name!r} with "
                f"overwrite_with_gradient=True. Train this model without float8 layers.")


def _name(variable: Any) -> str:
    return getattr(variable, "path", None) or variable.name


def describe_constraints(variables: list) -> list[dict]:
    """The Keras constraints on `variables` (the model's trainable variables, in flat order),
    as JSON-able entries the hub applies after each update (`nbdist.algorithms.constraints`);
    [] when none has one.

    Each entry: `variable` (its path), `start` (where its floats begin in the flat vector),
    `shape`, `class_name`, `config` (the constraint's `get_config()`) and `epsilon` (Keras's
    `backend.epsilon()` now, which the formulas use). Raises `UnsupportedOptimizerError` for
    a constraint that is not exactly one of Keras's built-in classes: a subclass or a plain
    function could compute anything, which nbdist cannot see. Keras's base `Constraint` does
    nothing and needs no entry.

    Example:
        >>> import keras
        >>> v = keras.Variable(np.ones((3, 2), "float32"), name="kernel")
        >>> v.constraint = keras.constraints.MaxNorm(2.0)
        >>> entry = describe_constraints([v])[0]
        >>> entry["class_name"], entry["config"], entry["start"], entry["shape"]
        ('MaxNorm', {'max_value': 2.0, 'axis': 0}, 0, [3, 2])
    """
    import keras  # Keras: after the cell picks its backend

    entries, start = [], 0
    for v in variables:
        constraint, shape = getattr(v, "constraint", None), [int(d) for d in v.shape]
        cls = type(constraint)
        if constraint is not None and cls is not keras.constraints.Constraint:
            if (cls.__name__ not in SUPPORTED_CONSTRAINTS
                    or getattr(keras.constraints, cls.__name__) is not cls):
                raise _custom_constraint(v, constraint)
            config = {k: jsonable(value) for k, value in constraint.get_config().items()}
            entries.append(checked_constraint({
                "variable": _name(v), "start": start, "shape": shape, "class_name": cls.__name__,
                "config": config, "epsilon": float(keras.config.epsilon())}))
        start += int(np.prod(shape))
    return entries


def _custom_constraint(variable: Any, constraint: Any) -> UnsupportedOptimizerError:
    import keras  # Keras: after the cell picks its backend

    cls = type(constraint)
    base = next((c for c in cls.__mro__[1:] if c.__name__ in SUPPORTED_CONSTRAINTS
                 and getattr(keras.constraints, c.__name__, None) is c), None)
    what = (f"a subclass of keras.constraints.{base.__name__}, which may change what it computes"
            if base is not None else "a custom keras.constraints.Constraint"
            if isinstance(constraint, keras.constraints.Constraint) else "a function")
    shown = getattr(constraint, "__qualname__", cls.__qualname__)  # a function's own name
    return UnsupportedOptimizerError(
        f"The hub cannot apply this weight constraint: it applies Keras's built-in constraints "
        f"keras.constraints.{', '.join(SUPPORTED_CONSTRAINTS)} (exactly these classes) after each "
        f"update, and cannot see what another one computes. Received: variable {_name(variable)!r} "
        f"with the constraint {shown} ({what}). Use one of the built-in constraints, or train "
        f"with --mode sync (or --mode pipeline), where the cell's own Keras optimizer applies "
        f"any constraint after each step.")


def choose_constraints(config: TrainConfig, variables: list) -> list[dict]:
    """The constraints the hubs apply for this run: the model's (`describe_constraints`), or []
    in `--mode sync` and `pipeline`, where each rank or stage applies the cell's own optimizer,
    which enforces every constraint itself, a custom one included."""
    if mode_spec(config.mode).lr_owner == "workers":  # no hub holds the weights
        return []
    return describe_constraints(variables)


def describe_schedule(schedule: Any) -> dict:
    """The spec `{"class_name", "config"}` of a Keras schedule object, for `schedule_value`.

    Kernel side. The class must be exactly one of Keras's built-in schedules: a subclass could
    change `__call__`, which nbdist cannot see, so it is refused like any unknown class.

    Example:
        >>> import keras
        >>> schedule = keras.optimizers.schedules.ExponentialDecay(0.1, 100, 0.5)
        >>> describe_schedule(schedule)["class_name"]
        'ExponentialDecay'
    """
    from keras.optimizers import schedules  # Keras: after the cell picks its backend

    cls = type(schedule)
    name = cls.__name__
    if name not in SCHEDULE_DEFAULTS or getattr(schedules, name, None) is not cls:
        what = f"{cls.__module__}.{cls.__qualname__}"
        kind = ("a subclass of a Keras schedule"
                if isinstance(schedule, schedules.LearningRateSchedule)
                else "a callable" if callable(schedule) else "an object")
        raise UnsupportedOptimizerError(
            f"nbdist cannot reproduce this learning-rate schedule on the hub. Received: {what} "
            f"({kind}). Supported: keras.optimizers.schedules."
            f"{', '.join(SUPPORTED_SCHEDULES)}. {HOW_TO_PROCEED}")
    config = {k: jsonable(v) for k, v in schedule.get_config().items() if k != "name"}
    spec = {"class_name": name, "config": config}
    checked_schedule(spec)
    return spec


def choose_optimizer(config: TrainConfig, optimizer, segments: list[int],
                     variables: list | None = None) -> tuple[dict | None, list[str]]:
    """The optimizer spec the hub applies for this run, and warnings for `run.warnings`.

    - the cell's compiled optimizer, as it is (`--lr` replaces a constant rate);
    - `--local-steps K`: the workers step with the cell's optimizer and the hub applies their
      deltas with `--server-optimizer` (SGD at rate 1 by default);
    - `--server-optimizer NAME` without local steps: NAME at the cell's rate, with a warning;
    - `easgd`: none (the hub only adds elastic differences);
    - `--mode sync` and `pipeline`: none (each rank or stage applies the cell's optimizer;
      no hub holds weights).
    `segments` are the trainable variables' sizes in flat order, `variables` the variables
    (for `exclude_from_weight_decay`). Raises `UnsupportedOptimizerError` for an optimizer
    nbdist cannot reproduce.
    """
    if mode_spec(config.mode).lr_owner == "workers":  # no hub holds the weights
        return None, []
    algorithm = config.rule_name
    chosen = config.server_optimizer.value if config.server_optimizer is not None else None
    if algorithm == "easgd":
        if chosen is not None:
            raise ConfigError(f"--server-optimizer {chosen} does not apply to --algorithm easgd: "
                              "its hub adds elastic differences with no optimizer (the cell's "
                              "optimizer runs on the workers). Drop --server-optimizer.")
        return None, []
    if config.local_steps > 1:
        return server_optimizer_spec(chosen or "sgd", None, segments), []
    warnings = []
    if chosen is not None:
        lr = config.lr if config.lr is not None else float(np.asarray(optimizer.learning_rate))
        spec = server_optimizer_spec(chosen, lr, segments)
        warnings.append(f"--server-optimizer {chosen}: the hub trains with {describe_spec(spec)}, "
                        f"not with the cell's {type(optimizer).__name__} as compiled.")
    else:
        spec = describe_optimizer(optimizer, segments, variables)
        # (over a schedule it is refused: nbdist.engine.learning_rate.check_lr)
        if config.lr is not None:
            warnings.append(f"--lr {config.lr:g} replaces the cell's learning rate "
                            f"{spec['learning_rate']:g}.")
            spec = {**spec, "learning_rate": float(config.lr)}
    check_composition(algorithm, spec)
    return spec, warnings
