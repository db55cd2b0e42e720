"""The learning rate when the cell's optimizer has a schedule, in every mode.

A `keras.optimizers.schedules.*` rate runs as Keras runs it: on the hub, at the shard's number
of applied updates (`nbdist.algorithms.schedules`); in sync mode and on --local-steps workers,
at the Keras optimizer's own `iterations`. Two things cannot mean what they mean for a constant:

- `--lr X` (which replaces the cell's constant rate) is refused before any engine is used:
  silently dropping the schedule, or silently ignoring `--lr`, would both train with
  something the user did not ask for.
- `run.set_lr(x)` during the run replaces the schedule with the constant x from then on (on
  the hub, or on every rank or worker); `Run.set_lr` records that in `run.warnings`.
"""

from __future__ import annotations

from nbdist.errors import ConfigError

REPLACED = "The run replaced the cell's"


def schedule_name(optimizer) -> str | None:
    """The class name of the optimizer's learning-rate schedule, or None for a constant rate."""
    # Keras: after the cell picks its backend
    from keras.optimizers.schedules import LearningRateSchedule

    rate = getattr(optimizer, "_learning_rate", None)
    return type(rate).__name__ if isinstance(rate, LearningRateSchedule) else None


def check_lr(lr: float | None, optimizer) -> None:
    """Refuse `--lr` when the cell's optimizer follows a schedule.

    Example:
        >>> check_lr(0.01, keras.optimizers.Adam(0.001))   # doctest: +SKIP
    """
    name = schedule_name(optimizer)
    if lr is not None and name is not None:
        raise ConfigError(
            f"--lr {lr:g} replaces a constant learning rate, but the cell's optimizer "
            f"({type(optimizer).__name__}) uses the schedule {name}. Drop --lr, or change the "
            "schedule in the cell.")


def set_constant_lr(optimizer, lr: float) -> str | None:
    """Set the optimizer's rate to `lr`; a schedule is replaced by the constant.

    Returns the name of the replaced schedule (None if the rate was already a constant).
    A compiled function that applies gradients must be traced again after a replacement:
    the old one evaluates the schedule in its graph.
    """
    name = schedule_name(optimizer)
    if name is None:
        optimizer.learning_rate.assign(lr)
        return None
    import keras  # Keras: after the cell picks its backend

    # not through the `learning_rate` setter, which refuses a number once a schedule is set;
    # untracked, so the optimizer's variables (and a checkpoint's slots) stay as they were
    optimizer._learning_rate = keras.Variable(lr, name="learning_rate", dtype="float32",  # noqa: SLF001
                                              trainable=False)
    return name


def schedule_replaced(optimizer, lr: float, warnings: list[str]) -> str | None:
    """The `run.warnings` entry for `run.set_lr(lr)` replacing the cell's schedule (once)."""
    name = schedule_name(optimizer)
    if name is None or any(w.startswith(REPLACED) for w in warnings):
        return None
    return (f"{REPLACED} {name} schedule: run.set_lr({lr:g}) set the constant rate {lr:g} from "
            "the next step on")
