"""The worker's step on Keras's JAX backend: `jax.jit` of `jax.value_and_grad` of Keras's
stateless loss (`nbdist.engine.flat_step`) with respect to the variables' values, cut from the
flat parameter buffer inside the compiled call; the gradients are joined into one flat buffer
on the host (XLA's CPU code for the gradient of the cut, one flat buffer, made the MLP's step
about ten times slower than Keras's own). JAX compiles once per batch shape: the worker
traces its batch size and half of it before it starts; another size (an epoch's last chunk, a
--dbs batch) compiles once when it first comes.
"""

from __future__ import annotations

import numpy as np

from nbdist.engine.flat_step import StatelessFlatModel


class JaxFlatModel(StatelessFlatModel):
    """Compiled flat-buffer gradients for one Keras model on JAX."""

    def __init__(self, model):
        super().__init__(model)
        import jax  # JAX: only on its backend

        parts = self.parts
        value_and_grad = jax.value_and_grad(parts.loss_of_values, has_aux=True)

        def step(params, non_trainable, ints, x, y, sw):
            (loss, aux), grads = value_and_grad(parts.split(params), non_trainable, ints, x, y, sw)
            return parts.outputs(loss, list(grads), aux, x, y, sw)

        def step_at(params, non_trainable, ints, held, index):
            return step(params, non_trainable, ints,
                        *jax.tree_util.tree_map(lambda t: t[index], held))

        self._compiled, self._compiled_at = jax.jit(step), jax.jit(step_at)

    def _finish(self, result) -> tuple:
        loss, grads, norm, nt_after, metrics, ints = result
        self.parts.write_ints(ints)
        flat = np.concatenate([np.asarray(g, np.float32).ravel() for g in grads]) if grads \
            else np.zeros(0, np.float32)
        return loss, flat, norm, nt_after, metrics

    def _step(self, params, non_trainable, x, y, sample_weight) -> tuple:
        return self._finish(self._compiled(params, non_trainable, self.parts.int_values(), x, y,
                                           sample_weight))

    def _hold(self, x, y, sample_weight) -> tuple:
        import jax  # JAX: only on its backend

        return jax.device_put((x, y, sample_weight))

    def _step_at(self, params, non_trainable, index) -> tuple:
        return self._finish(self._compiled_at(params, non_trainable, self.parts.int_values(),
                                              self._held, index))
