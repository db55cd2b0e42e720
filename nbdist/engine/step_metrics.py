"""A training step's compiled metrics, as Keras's `fit` keeps them, across many workers.

Keras's `fit` updates, at every step, the loss tracker (the batch loss, weighted by the batch
size), the per-output loss trackers of a multi-output model and every compiled metric, and logs
their results at each epoch end. Every built-in Keras metric keeps its state as sums (totals,
counts, confusion-matrix cells), so a step's contribution is the state one update leaves from
zero, and an epoch's state is the sum of its steps' contributions, whichever worker took them.

Responsible for:
- `increments(...)`: inside a compiled step, the state one step's update leaves from zero, as
  one flat float32 vector in `model.metrics_variables` order (nothing is written to the
  model's own metric variables);
- `MetricLayout` / `epoch_logs(...)`: in the kernel, the summed vector of an epoch back into
  Keras's logs (`{"loss": ..., "accuracy": ..., "output_a_loss": ...}`), read by the kernel
  model's own metric objects, so the names and the arithmetic are Keras's;
- `build_metrics(...)`: creating the compiled metrics' variables the same way in the kernel and
  on every worker (Keras creates them on the first update), so the layouts agree.
"""

from __future__ import annotations

import numpy as np


def build_metrics(model, x, y, y_pred, sample_weight=None) -> None:
    """Create the variables of the compiled loss and metrics (eagerly, on a sample or two),
    then reset them: what `fit` does before its first step. Safe to call twice."""
    model.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=False)
    model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)
    model.reset_metrics()


def metric_sizes(model) -> list[int]:
    """The sizes of `model.metrics_variables`, in order."""
    return [int(np.prod(v.shape)) for v in model.metrics_variables]


def increments(model, loss, x, y, y_pred, sample_weight=None, after_loss=None):
    """The metrics' state after one step's update from zero, as one flat float32 tensor (graph
    code: call it inside the compiled step, after the loss). `after_loss`: the metric variables
    as `stateless_compute_loss` left them from zeros (per-output loss trackers updated); None
    recomputes the compiled loss in a stateless scope when the model has per-output trackers."""
    import keras  # Keras: after the cell picks its backend
    from keras import ops  # Keras: after the cell picks its backend

    variables = list(model.metrics_variables)
    if not variables:
        return ops.zeros((0,), "float32")
    start = (after_loss if after_loss is not None
             else [ops.zeros(v.shape, v.dtype) for v in variables])
    with keras.StatelessScope(state_mapping=list(zip(variables, start, strict=True))) as scope:
        compile_loss = getattr(model, "_compile_loss", None)
        if after_loss is None and compile_loss is not None and compile_loss.metrics:
            model.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True)
        batch = ops.shape(next(leaf for leaf in keras.tree.flatten(x) if leaf is not None))[0]
        model._loss_tracker.update_state(loss, sample_weight=batch)  # noqa: SLF001 - as Keras's train_step
        model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)
    values = []
    for v, first in zip(variables, start, strict=True):
        value = scope.get_current_value(v)
        values.append(ops.reshape(ops.cast(first if value is None else value, "float32"), (-1,)))
    return ops.concatenate(values, axis=0)


def zero_metrics(model) -> list:
    """Zeros for every metric variable (the start of a step's update)."""
    from keras import ops  # Keras: after the cell picks its backend

    return [ops.zeros(v.shape, v.dtype) for v in model.metrics_variables]


def epoch_logs(model, sums: np.ndarray) -> dict[str, float]:
    """Keras's epoch logs from an epoch's summed metric state: the kernel model's own metric
    objects read it (their variables are set, read, then reset).

    Example (a model compiled with metrics=["accuracy"]: loss total, count, accuracy total, count):
        >>> epoch_logs(model, np.array([6.0, 4.0, 3.0, 4.0], np.float32))   # doctest: +SKIP
        {'loss': 1.5, 'accuracy': 0.75}
    """
    variables = list(model.metrics_variables)
    sizes = metric_sizes(model)
    if sums.size != sum(sizes):
        raise ValueError(f"metric state of {sums.size} floats for {sum(sizes)} metric values")
    offset = 0
    for v, n in zip(variables, sizes, strict=True):
        v.assign(np.asarray(sums[offset:offset + n]).reshape(v.shape).astype(v.dtype))
        offset += n
    try:
        return {name: float(np.asarray(value))
                for name, value in model.get_metrics_result().items()}
    finally:
        model.reset_metrics()
