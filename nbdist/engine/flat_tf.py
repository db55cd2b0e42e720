"""The worker's step on Keras's TensorFlow backend: compiled `tf.function`s, no Python loop
over variables (`nbdist.engine.flatmodel` says what the step computes; this is how).

`gradients(x, y)` returns the loss, all gradients concatenated into one flat buffer, and the
float non-trainable state (BatchNorm moving statistics and the like) as another flat buffer;
`assign(params, non_trainable)` splits flat buffers back into the variables; the hot path uses
`assign_and_gradients`, both in one call.

Where the model allows it (`stateless`, checked once when the functions are made), that hot
path writes no variable at all: the flat parameters go into `model.stateless_call` as one
watched tensor, split into the variables' shapes, and the gradient is taken with respect to
that tensor, so it comes out flat (no assign, no concat). The model's variables then lag behind
the weights it computed on until `assign` (the worker calls it before evaluating or taking
local steps); only integer state (dropout seeds) is written back, so each step draws new masks
exactly as the variable path does. `gradients_tensor` (a sync rank's allreduce input) is
TensorFlow's alone.
"""

from __future__ import annotations

import logging

import numpy as np

from nbdist.engine.flat_layout import variables_of
from nbdist.engine.flat_step import stateless_loss
from nbdist.engine.learning_rate import set_constant_lr
from nbdist.engine.step_metrics import increments
from nbdist.env import switch

log = logging.getLogger(__name__)


class _OwnRetracingFilter(logging.Filter):
    """Drops TensorFlow's "triggered tf.function retracing" warning about these functions.

    Each model gets its own functions, traced once; a sweep or a study builds a model per run.
    TensorFlow counts the traces by the Python code, not by the function, so from the sixth
    model on it warns of "excessive" retracing that is none. Its warning about any other
    function (the cell's own) still shows."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not ("triggered tf.function retracing" in message
                    and "TensorFlowFlatModel.__init__" in message)


_RETRACING_FILTER = _OwnRetracingFilter()


class TensorFlowFlatModel:
    """Compiled flat-buffer gradient and assignment functions for one Keras model (TensorFlow).

    Every gradient call also computes the step's metric increments (`nbdist.engine.step_metrics`:
    the loss tracker's and every compiled metric's state after this step's update from zero),
    kept in `last_metrics` for the caller to push; `sample_weight` (or None) weighs the loss
    and the metrics as in `fit`. Inputs and labels may be nested (several inputs or outputs).
    """

    def __init__(self, model):
        import tensorflow as tf  # TensorFlow: only on its backend

        tf.get_logger().addFilter(_RETRACING_FILTER)  # once: a logger holds a filter once
        self.model = model
        self.trainable, self.non_trainable = variables_of(model)
        sizes = [int(np.prod(v.shape)) for v in self.trainable]
        nt_sizes = [int(np.prod(v.shape)) for v in self.non_trainable]
        self.size, self.nt_size = sum(sizes), sum(nt_sizes)
        self.last_metrics = np.zeros(0, np.float32)  # the last step's metric increments
        trainable, nt_vars = self.trainable, self.non_trainable

        def flatten(tensors):
            if not tensors:
                return tf.zeros([0], tf.float32)
            return tf.concat([tf.reshape(tf.cast(t, tf.float32), [-1]) for t in tensors], 0)

        def write(params, non_trainable):
            for v, part in zip(trainable, tf.split(params, sizes) if sizes else [], strict=True):
                v.assign(tf.reshape(part, v.shape))
            for v, part in zip(nt_vars, tf.split(non_trainable, nt_sizes) if nt_sizes else [],
                               strict=True):
                v.assign(tf.reshape(part, v.shape))

        def grads_of(x, y, sw=None):
            with tf.GradientTape() as tape:
                y_pred = model(x, training=True)
                loss = model.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sw, training=True)
            grads = tape.gradient(loss, trainable)
            grads = [tf.zeros_like(v) if g is None else tf.convert_to_tensor(g)
                     for g, v in zip(grads, trainable, strict=True)]
            flat = flatten(grads)
            metrics = increments(model, loss, x, y, y_pred, sw)
            return loss, flat, tf.norm(flat), flatten([v.value for v in nt_vars]), metrics

        @tf.function(reduce_retracing=True)
        def gradients(x, y, sw=None):
            return grads_of(x, y, sw)

        @tf.function(reduce_retracing=True)
        def assign_and_gradients(params, non_trainable, x, y, sw=None):
            # one call instead of two: a separate assign call costs ~1 ms per step
            write(params, non_trainable)
            return grads_of(x, y, sw)

        @tf.function(reduce_retracing=True)
        def assign(params, non_trainable):
            write(params, non_trainable)

        @tf.function
        def read():
            return flatten([v.value for v in trainable]), flatten([v.value for v in nt_vars])

        self._gradients, self._assign, self._read = gradients, assign, read
        self._assign_and_gradients = assign_and_gradients
        stateless_of = self._stateless_of = self._make_stateless(tf, sizes, nt_sizes, flatten)
        self.stateless = stateless_of is not None  # False again if it fails to trace (_call)

        @tf.function(reduce_retracing=True)
        def stateless_gradients(params, non_trainable, x, y, sw=None):
            return stateless_of(params, non_trainable, x, y, sw)

        self._stateless_gradients = stateless_gradients
        self._stateless_at = None
        self.stateless_error: Exception | None = None  # why the stateless path was given up
        self._local_step = self._make_local_step()
        self._grads_of, self._write = grads_of, write
        self._gradients_at = self._assign_and_gradients_at = None

    def hold(self, x, y, sample_weight=None) -> None:
        """Keep the training arrays (nested for several inputs or outputs) as TensorFlow tensors,
        so a step takes the batch's indices and gathers inside its one compiled call
        (`gradients_at`, `assign_and_gradients_at`): no host gather and no copy of the batch into
        TensorFlow per step."""
        import tensorflow as tf  # TensorFlow: only on its backend

        with tf.device("/CPU:0"):  # host memory, as model.fit's input pipeline keeps it
            xs, ys = tf.nest.map_structure(tf.convert_to_tensor, (x, y))
            ws = (None if sample_weight is None
                  else tf.nest.map_structure(tf.convert_to_tensor, sample_weight))
        grads_of, write = self._grads_of, self._write

        def take(index):
            gathered = tf.nest.map_structure(lambda t: tf.gather(t, index), (xs, ys))
            return (*gathered, None if ws is None
                    else tf.nest.map_structure(lambda t: tf.gather(t, index), ws))

        @tf.function(reduce_retracing=True)
        def gradients_at(index):
            return grads_of(*take(index))

        @tf.function(reduce_retracing=True)
        def assign_and_gradients_at(params, non_trainable, index):
            write(params, non_trainable)
            return grads_of(*take(index))

        stateless_of = self._stateless_of

        @tf.function(reduce_retracing=True)
        def stateless_at(params, non_trainable, index):
            return stateless_of(params, non_trainable, *take(index))

        self._gradients_at, self._assign_and_gradients_at = gradients_at, assign_and_gradients_at
        self._stateless_at = stateless_at

    def _make_stateless(self, tf, sizes: list[int], nt_sizes: list[int], flatten):
        """The stateless gradient function (see the module docstring), or None when the model
        has no `stateless_call` (not a Keras 3 layer) or nbdist's NBDIST_STATELESS=0 says so."""
        model = self.model
        if not switch("NBDIST_STATELESS") or not hasattr(model, "stateless_call") \
                or not hasattr(model, "stateless_compute_loss"):
            return None
        trainable, all_nt = self.trainable, list(model.non_trainable_variables)
        is_float = ["float" in str(v.dtype) for v in all_nt]

        def grads_of(params, non_trainable, x, y, sw=None):
            with tf.GradientTape() as tape:
                tape.watch(params)
                parts = tf.split(params, sizes) if sizes else []
                values = [tf.cast(tf.reshape(p, v.shape), v.dtype)
                          for p, v in zip(parts, trainable, strict=True)]
                nt_parts = iter(tf.split(non_trainable, nt_sizes) if nt_sizes else [])
                nt_values = [tf.cast(tf.reshape(next(nt_parts), v.shape), v.dtype) if f else v.value
                             for v, f in zip(all_nt, is_float, strict=True)]
                loss, y_pred, nt_new, metrics_new = stateless_loss(model, values, nt_values,
                                                                   x, y, sw)
            grad = tape.gradient(loss, params)
            if grad is None:  # no variable reaches the loss
                grad = tf.zeros_like(params)
            for v, new, f in zip(all_nt, nt_new, is_float, strict=True):
                if not f:  # dropout seeds advance as they do in the variable path
                    v.assign(new)
            metrics = increments(model, loss, x, y, y_pred, sw, after_loss=metrics_new)
            return (loss, grad, tf.norm(grad),
                    flatten([n for n, f in zip(nt_new, is_float, strict=True) if f]), metrics)

        return grads_of

    @property
    def holds_data(self) -> bool:
        """True after `hold`: the `_at` methods take indices."""
        return self._gradients_at is not None

    def _make_local_step(self):
        """One compiled step with the cell's own optimizer (--local-steps)."""
        import tensorflow as tf  # TensorFlow: only on its backend

        model, trainable, optimizer = self.model, self.trainable, self.model.optimizer

        @tf.function(reduce_retracing=True)
        def local_step(x, y, sw=None):
            with tf.GradientTape() as tape:
                y_pred = model(x, training=True)
                loss = model.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sw, training=True)
            grads = tape.gradient(loss, trainable)
            optimizer.apply_gradients(zip(grads, trainable, strict=True))
            return loss, increments(model, loss, x, y, y_pred, sw)

        return local_step

    def _out(self, result) -> tuple[float, np.ndarray, float, np.ndarray]:
        loss, grad, norm, nt, metrics = result
        self.last_metrics = metrics.numpy()
        return float(loss), grad.numpy(), float(norm), nt.numpy()

    def gradients(self, x, y, sample_weight=None) -> tuple[float, np.ndarray, float, np.ndarray]:
        """(loss, flat gradient, its norm, non-trainable state after the step) for one batch.

        The norm is computed in the graph: one number that is NaN/inf if any element is."""
        return self._out(self._gradients(x, y, sample_weight))

    def gradients_tensor(self, x, y, sample_weight=None) -> tuple[float, object, float]:
        """(loss, flat gradient as a TensorFlow tensor, its norm): for a caller whose next
        compiled call takes the gradient as it is (a sync rank's allreduce), without a host copy."""
        loss, grad, norm, _, metrics = self._gradients(x, y, sample_weight)
        self.last_metrics = metrics.numpy()
        return float(loss), grad, float(norm)

    def assign_and_gradients(self, params: np.ndarray, non_trainable: np.ndarray, x, y,
                             sample_weight=None) -> tuple[float, np.ndarray, float, np.ndarray]:
        """`assign(params, non_trainable)` then `gradients(x, y)`, in one compiled call; with
        `stateless`, the same gradients on those weights without writing the variables."""
        return self._call(self._stateless_gradients, self._assign_and_gradients, params,
                          non_trainable, x, y, sample_weight)

    def _call(self, stateless, assigning, *args) -> tuple[float, np.ndarray, float, np.ndarray]:
        if self.stateless:
            try:
                return self._out(stateless(*args))
            except Exception as exc:  # noqa: BLE001
                # a layer stateless_call cannot trace: the variable path
                self.stateless, self.stateless_error = False, exc
                log.info("stateless gradients unavailable for this model (%s: %s); assigning "
                         "variables instead", type(exc).__name__, exc)
        return self._out(assigning(*args))

    def gradients_at(self, index: np.ndarray) -> tuple[float, np.ndarray, float, np.ndarray]:
        """`gradients(x[index], y[index])` of the arrays given to `hold`, gathered in the graph."""
        return self._out(self._gradients_at(index))

    def assign_and_gradients_at(self, params: np.ndarray, non_trainable: np.ndarray,
                                index: np.ndarray) -> tuple[float, np.ndarray, float, np.ndarray]:
        """`assign_and_gradients(params, non_trainable, x[index], y[index])` in one compiled
        call."""
        return self._call(self._stateless_at, self._assign_and_gradients_at, params, non_trainable,
                          index)

    def assign(self, params: np.ndarray, non_trainable: np.ndarray) -> None:
        self._assign(params, non_trainable)

    def local_step(self, x, y, sample_weight=None) -> float:
        """One step with the cell's own optimizer, on this worker only (--local-steps); its
        metric increments go to `last_metrics`."""
        loss, metrics = self._local_step(x, y, sample_weight)
        self.last_metrics = metrics.numpy()
        return float(loss)

    def read(self) -> tuple[np.ndarray, np.ndarray]:
        """The current flat trainable and non-trainable values."""
        params, non_trainable = self._read()
        return params.numpy(), non_trainable.numpy()

    def set_learning_rate(self, lr: float) -> None:
        """The cell optimizer's rate (local steps follow `run.set_lr`); it replaces a schedule,
        and the compiled local step is traced again, since it evaluated the schedule."""
        if set_constant_lr(self.model.optimizer, lr) is not None:
            self._local_step = self._make_local_step()
