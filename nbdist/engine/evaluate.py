"""What every mode does with a training step's numbers and the validation set: evaluate the
model on it, and stop at the first loss or gradient norm that is not finite (one message for
async workers, sync ranks and simulated workers alike)."""

from __future__ import annotations

import math

from nbdist.engine.data import num_rows
from nbdist.errors import NonFiniteLossError


def evaluate(model, validation: tuple | None, batch_size: int, one_batch_limit: int = 0) -> dict:
    """The model's metrics on the validation arrays (`{}` without any). A set of at most
    `one_batch_limit` samples is evaluated in one compiled call: `model.evaluate` builds a
    data pipeline on every call, which costs more than a small set's evaluation."""
    if validation is None:
        return {}

    xv, yv, sw = (*validation, None)[:3]
    if num_rows(xv) <= one_batch_limit:
        result = model.test_on_batch(xv, yv, sample_weight=sw, return_dict=True)
    else:
        result = model.evaluate(xv, yv, sample_weight=sw, batch_size=max(256, batch_size),
                                verbose=0, return_dict=True)
    return {k: float(v) for k, v in result.items()}


def check_finite(loss: float, grad_norm: float, *, step: int, where: str, epoch: int) -> None:
    """Raise a TrainingError when a step's loss or gradient norm is NaN or infinite.

    `where` names who computed it ("worker 2", "rank 1 (engine 4)", "virtual worker 0 at
    virtual time 1.250s").

    Example:
        >>> check_finite(float("nan"), 1.0, step=7, where="worker 2", epoch=0)
        Traceback (most recent call last):
        ...
        nbdist.errors.NonFiniteLossError: The loss became nan at step 7 on worker 2 (epoch 0). ...
    """
    if math.isfinite(loss) and math.isfinite(grad_norm):
        return
    what, value = ("loss", loss) if not math.isfinite(loss) else ("gradient norm", grad_norm)
    raise NonFiniteLossError(
        f"The {what} became {value} at step {step} on {where} (epoch {epoch}). Lower the learning "
        "rate (--lr), check the data for NaN/inf, or normalise the inputs.")
