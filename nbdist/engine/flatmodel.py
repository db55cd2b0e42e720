"""A Keras model seen as flat float32 vectors: the only place a Keras backend meets the hub.

`FlatModel(model)` is the worker's step on the model's own backend, and the one module the
modes ask for it (they never import TensorFlow, JAX or PyTorch themselves):
- TensorFlow: `tf.function`s (`nbdist.engine.flat_tf`);
- JAX: `jax.jit` of `jax.value_and_grad` (`nbdist.engine.flat_jax`);
- PyTorch: autograd (`nbdist.engine.flat_torch`).
Each computes the same thing from Keras's stateless API (`model.stateless_call` and
`model.stateless_compute_loss`, as Keras's own JAX trainer does): the loss, the gradient of the
flat parameter buffer, its norm, the float non-trainable state after the step, and the step's
metric increments (`nbdist.engine.step_metrics`), with sample weights and nested inputs and
outputs, so the same cell trains the same way on every backend.

Non-trainable state is merged like a gradient: each push carries the change one step made to
it (`after - before`), and the hub adds that change to its copy. Sequential training would
apply exactly these changes one after another; asynchronous training applies them in arrival
order. Integer state (dropout seed counters) stays local to each worker; every worker starts
it from the kernel's model (`rng_state`, `write_rng_state`), so one worker draws the same dropout
masks on an engine as in the kernel (--mode local).

Which variables the buffers hold, in what order, and how they are read and written, is
backend-neutral: `nbdist.engine.flat_layout`, which the steps and every mode import.
"""

from __future__ import annotations

from nbdist.engine.flat_jax import JaxFlatModel
from nbdist.engine.flat_tf import TensorFlowFlatModel
from nbdist.engine.flat_torch import TorchFlatModel
from nbdist.engine.keras_backend import backend_name


def FlatModel(model):  # noqa: N802 - callers construct it like the class it returns
    """The compiled flat-buffer step for `model` on this process's Keras backend."""
    backend = backend_name()
    # each step imports its backend's framework: only the one this process runs is loaded
    if backend == "jax":
        return JaxFlatModel(model)
    if backend == "torch":
        return TorchFlatModel(model)
    return TensorFlowFlatModel(model)
