"""The worker's step on Keras's JAX backend: `jax.jit` of `jax.value_and_grad` of Keras's
stateless loss with respect to the flat parameter buffer (`nbdist.engine.flat_step`), so the
gradient comes out flat from one compiled call. JAX compiles once per batch shape: the worker
traces its batch size and half of it before it starts; another size (an epoch's last chunk, a
--dbs batch) compiles once when it first comes.
"""

from __future__ import annotations

from nbdist.engine.flat_step import StatelessFlatModel


class JaxFlatModel(StatelessFlatModel):
    """Compiled flat-buffer gradients for one Keras model on JAX."""

    def __init__(self, model):
        super().__init__(model)
        import jax

        parts = self.parts
        value_and_grad = jax.value_and_grad(parts.loss, has_aux=True)

        def step(params, non_trainable, ints, x, y, sw):
            (loss, aux), grad = value_and_grad(params, non_trainable, ints, x, y, sw)
            return parts.outputs(loss, grad, aux, x, y, sw)

        def step_at(params, non_trainable, ints, held, index):
            return step(params, non_trainable, ints, *jax.tree_util.tree_map(lambda t: t[index], held))

        self._compiled, self._compiled_at = jax.jit(step), jax.jit(step_at)

    def _finish(self, result) -> tuple:
        *out, ints = result
        self.parts.write_ints(ints)
        return tuple(out)

    def _step(self, params, non_trainable, x, y, sample_weight) -> tuple:
        return self._finish(self._compiled(params, non_trainable, self.parts.int_values(), x, y, sample_weight))

    def _hold(self, x, y, sample_weight) -> tuple:
        import jax

        return jax.device_put((x, y, sample_weight))

    def _step_at(self, params, non_trainable, index) -> tuple:
        return self._finish(self._compiled_at(params, non_trainable, self.parts.int_values(), self._held, index))
