"""The cell's own Keras optimizer applied to one flat float32 gradient buffer, compiled on the
model's backend: what a `--collective torch` sync rank does after its allreduce.

Keras's `optimizer.apply_gradients`, called eagerly on TensorFlow or JAX, costs far more than
the allreduce it follows on a small model (`benchmarks/sync_exchange.py`: 8-16 ms against 1-2 ms
for the quickstart MLP), so those backends compile the split of the buffer into the variables'
shapes and the update, as `fit`'s own train step does:
- TensorFlow: one `tf.function`;
- JAX: `jax.jit` of `optimizer.stateless_apply`, the new values written back into the
  variables;
- PyTorch: eager (Keras's torch optimizers update in place with `torch._foreach_*` ops), each
  gradient a view of the buffer (`torch.from_numpy`, no copy).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from nbdist.engine.keras_backend import backend_name


def flat_apply(model) -> Callable[[np.ndarray], None]:
    """`apply(flat_grad)`: one step of `model.optimizer` (built) on `model`'s trainable
    variables, from their gradients concatenated in the variables' order."""
    optimizer, trainable = model.optimizer, model.trainable_variables
    sizes = [int(np.prod(v.shape)) for v in trainable]
    backend = backend_name()
    if backend == "tensorflow":
        return _tensorflow(optimizer, trainable, sizes)
    if backend == "jax":
        return _jax(optimizer, trainable, sizes)
    import torch  # PyTorch: the one backend left

    offsets = np.cumsum([0, *sizes]).tolist()

    def apply(flat: np.ndarray) -> None:
        shared = torch.from_numpy(flat)  # the buffer itself: each gradient a view of it
        optimizer.apply_gradients(zip(  # (copied only onto a GPU's variables)
            [shared[a:b].view(tuple(v.shape)).to(v.value.device)
             for a, b, v in zip(offsets[:-1], offsets[1:], trainable, strict=True)],
            trainable, strict=True))

    return apply


def _tensorflow(optimizer, trainable, sizes):
    import tensorflow as tf  # TensorFlow: only on that backend

    @tf.function(reduce_retracing=True)
    def step(flat):
        parts = tf.split(flat, sizes)
        optimizer.apply_gradients(zip([tf.reshape(g, v.shape) for g, v in zip(parts, trainable,
                                                                              strict=True)],
                                      trainable, strict=True))

    return lambda flat: step(tf.convert_to_tensor(flat))


def _jax(optimizer, trainable, sizes):
    import jax  # JAX: only on that backend
    import jax.numpy as jnp

    bounds = np.cumsum(sizes)[:-1].tolist()
    shapes = [tuple(v.shape) for v in trainable]
    variables = optimizer.variables

    @jax.jit
    def step(optimizer_values, trainable_values, flat):
        parts = jnp.split(flat, bounds) if bounds else [flat]
        grads = [p.reshape(s) for p, s in zip(parts, shapes, strict=True)]
        return optimizer.stateless_apply(optimizer_values, grads, trainable_values)

    def apply(flat: np.ndarray) -> None:
        new_trainable, new_optimizer = step([v.value for v in variables],
                                            [v.value for v in trainable], flat)
        for v, value in zip(trainable, new_trainable, strict=True):
            v.assign(value)
        for v, value in zip(variables, new_optimizer, strict=True):
            v.assign(value)

    return apply
