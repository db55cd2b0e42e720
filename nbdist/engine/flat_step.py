"""The worker's step as every backend computes it, and what the JAX and PyTorch steps share.

`StepParts` is the step's maths in `keras.ops` only (so it runs inside `tf.function`, `jax.jit`
or torch autograd alike): the flat buffers split into the variables' values, Keras's training
loss on them from the stateless API (`stateless_loss`, as Keras's own JAX trainer computes it:
forward-pass losses included, nothing written), and the step's outputs (the gradient's norm,
the float non-trainable state after the step, the metric increments, the new integer state).

`StatelessFlatModel` is the NumPy-facing part of the JAX and PyTorch steps: the same methods as
the TensorFlow one (`nbdist.engine.flat_tf`), always stateless. The model's variables lag
behind the weights a step computed on until `assign` (the worker calls it before evaluating or
taking local steps); integer state (dropout seeds) is written back after every step, so each
step draws new masks as Keras's `fit` does.
"""

from __future__ import annotations

import numpy as np

from nbdist.engine.flat_layout import read_flat, variables_of, write_flat
from nbdist.engine.learning_rate import set_constant_lr
from nbdist.engine.step_metrics import increments, zero_metrics


def stateless_loss(model, values: list, nt_values: list, x, y, sample_weight=None) -> tuple:
    """(loss, y_pred, non-trainable values after the forward pass, metric variables after the
    loss trackers' update from zero) of one training batch, writing no variable."""
    training = {"training": True} if getattr(model, "_call_has_training_arg", True) else {}
    y_pred, nt_new, losses = model.stateless_call(values, nt_values, x, return_losses=True,
                                                  **training)
    # add_loss / activity terms, as Keras's JAX trainer
    model._losses_override = list(losses)  # noqa: SLF001
    try:
        loss, (_, nt_new, metrics_new) = model.stateless_compute_loss(
            values, nt_new, zero_metrics(model), x=x, y=y, y_pred=y_pred,
            sample_weight=sample_weight, training=True)
    finally:
        model._losses_override = []  # noqa: SLF001
    return loss, y_pred, nt_new, metrics_new


class StepParts:
    """The backend-neutral pieces of one step of `model` (see the module docstring)."""

    def __init__(self, model):
        self.model = model
        self.trainable, self.float_nt = variables_of(model)
        self.all_nt = list(model.non_trainable_variables)
        self.is_float = ["float" in str(v.dtype) for v in self.all_nt]
        self.ints = [v for v, f in zip(self.all_nt, self.is_float, strict=True) if not f]
        self.sizes = [int(np.prod(v.shape)) for v in self.trainable]
        self.nt_sizes = [int(np.prod(v.shape)) for v in self.float_nt]

    def loss(self, params, non_trainable, ints: list, x, y, sample_weight=None) -> tuple:
        """(loss, (y_pred, nt_new, metrics_new)) on the flat `params` and `non_trainable`, the
        integer state `ints`: the function a backend differentiates with respect to `params`."""
        return self.loss_of_values(self.split(params), non_trainable, ints, x, y, sample_weight)

    def split(self, params) -> list:
        """The flat `params` as the trainable variables' values."""
        return _split(params, self.sizes, self.trainable)

    def loss_of_values(self, values: list, non_trainable, ints: list, x, y,
                       sample_weight=None) -> tuple:
        """`loss` on the trainable values already split (JAX differentiates with respect to
        them: the transpose of a split into one flat gradient is slow in XLA on CPU)."""
        floats, others = iter(_split(non_trainable, self.nt_sizes, self.float_nt)), iter(ints)
        nt_values = [next(floats) if f else next(others) for f in self.is_float]
        loss, y_pred, nt_new, metrics_new = stateless_loss(self.model, values, nt_values, x, y,
                                                           sample_weight)
        return loss, (y_pred, nt_new, metrics_new)

    def outputs(self, loss, grad, aux: tuple, x, y, sample_weight=None) -> tuple:
        """(loss, grad, its norm, float non-trainable state after the step as one flat buffer,
        metric increments, new integer state) from a differentiated `loss`; `grad` is flat, or
        a list of the variables' gradients (JAX's), and is returned as it came."""
        from keras import ops  # Keras: after the cell picks its backend

        y_pred, nt_new, metrics_new = aux
        metrics = increments(self.model, loss, x, y, y_pred, sample_weight, after_loss=metrics_new)
        floats = [ops.reshape(ops.cast(n, "float32"), (-1,))
                  for n, f in zip(nt_new, self.is_float, strict=True) if f]
        nt_flat = ops.concatenate(floats, axis=0) if floats else ops.zeros((0,), "float32")
        ints = [n for n, f in zip(nt_new, self.is_float, strict=True) if not f]
        squares = (sum(ops.sum(ops.square(g)) for g in grad) if isinstance(grad, list)
                   else ops.sum(ops.square(grad)))
        return loss, grad, ops.sqrt(squares), nt_flat, metrics, ints

    def int_values(self) -> list:
        return [v.value for v in self.ints]

    def write_ints(self, values: list) -> None:
        for v, value in zip(self.ints, values, strict=True):
            v.assign(value)


def _split(flat, sizes: list[int], variables: list) -> list:
    """A flat tensor cut into the variables' shapes and dtypes (keras.ops: any backend)."""
    from keras import ops  # Keras: after the cell picks its backend

    if not sizes:
        return []
    bounds = np.cumsum(sizes)[:-1].tolist()
    parts = ops.split(flat, bounds, axis=0) if bounds else [flat]
    return [ops.cast(ops.reshape(p, v.shape), v.dtype)
            for p, v in zip(parts, variables, strict=True)]


class StatelessFlatModel:
    """The NumPy side of a JAX or PyTorch step. A subclass gives `_step(params, nt, x, y, sw)`,
    `_hold(x, y, sw)` and `_step_at(params, nt, index)`, each returning NumPy-convertible
    (loss, grad, norm, nt_after, metrics) with the integer state already written back."""

    stateless = True  # the worker passes the pulled weights into every call
    stateless_error: Exception | None = None

    def __init__(self, model):
        self.model = model
        self.parts = StepParts(model)
        self.trainable, self.non_trainable = self.parts.trainable, self.parts.float_nt
        self.size, self.nt_size = sum(self.parts.sizes), sum(self.parts.nt_sizes)
        self.last_metrics = np.zeros(0, np.float32)  # the last step's metric increments
        self._held = None

    @property
    def holds_data(self) -> bool:
        """True after `hold`: the `_at` methods take indices."""
        return self._held is not None

    def hold(self, x, y, sample_weight=None) -> None:
        """Keep the training arrays as the backend's tensors; a step then takes the batch's
        indices and gathers them itself (no host gather, no copy of the batch per step)."""
        self._held = self._hold(x, y, sample_weight)

    def _out(self, result) -> tuple[float, np.ndarray, float, np.ndarray]:
        loss, grad, norm, nt, metrics = result
        self.last_metrics = np.asarray(metrics, np.float32)
        return float(loss), np.asarray(grad, np.float32), float(norm), np.asarray(nt, np.float32)

    def gradients(self, x, y, sample_weight=None) -> tuple[float, np.ndarray, float, np.ndarray]:
        """(loss, flat gradient, its norm, non-trainable state after the step) for one batch,
        on the weights the variables hold."""
        return self.assign_and_gradients(*self.read(), x, y, sample_weight)

    def gradients_at(self, index: np.ndarray) -> tuple[float, np.ndarray, float, np.ndarray]:
        """`gradients(x[index], y[index])` of the arrays given to `hold`."""
        return self.assign_and_gradients_at(*self.read(), index)

    def assign_and_gradients(self, params: np.ndarray, non_trainable: np.ndarray, x, y,
                             sample_weight=None) -> tuple[float, np.ndarray, float, np.ndarray]:
        """The gradients on the weights `params` and `non_trainable`, without writing them into
        the variables."""
        return self._out(self._step(params, non_trainable, x, y, sample_weight))

    def assign_and_gradients_at(self, params: np.ndarray, non_trainable: np.ndarray,
                                index: np.ndarray) -> tuple[float, np.ndarray, float, np.ndarray]:
        """`assign_and_gradients(params, non_trainable, x[index], y[index])` of the held arrays."""
        return self._out(self._step_at(params, non_trainable, np.asarray(index, np.int64)))

    def assign(self, params: np.ndarray, non_trainable: np.ndarray) -> None:
        write_flat(self.model, params, non_trainable)

    def read(self) -> tuple[np.ndarray, np.ndarray]:
        """The current flat trainable and non-trainable values."""
        return read_flat(self.model)

    def local_step(self, x, y, sample_weight=None) -> float:
        """One step with the cell's own optimizer, on this worker only (--local-steps): the
        stateless gradient on the variables' weights, the non-trainable state it left written
        back, then the optimizer's update; its metric increments go to `last_metrics`."""
        params, non_trainable = self.read()
        loss, grad, _, nt_after = self.assign_and_gradients(params, non_trainable, x, y,
                                                            sample_weight)
        self.assign(params, nt_after)
        from keras import ops  # Keras: after the cell picks its backend

        offsets = np.cumsum([0, *self.parts.sizes])
        grads = [ops.convert_to_tensor(grad[a:b].reshape(v.shape), v.dtype)
                 for a, b, v in zip(offsets[:-1], offsets[1:], self.trainable, strict=True)]
        self.model.optimizer.apply_gradients(zip(grads, self.trainable, strict=True))
        return loss

    def set_learning_rate(self, lr: float) -> None:
        """The cell optimizer's rate (local steps follow `run.set_lr`); it replaces a schedule."""
        set_constant_lr(self.model.optimizer, lr)
