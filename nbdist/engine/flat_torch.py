"""The worker's step on Keras's PyTorch backend: Keras's stateless loss on the flat parameter
buffer as one leaf tensor (`nbdist.engine.flat_step`), differentiated by autograd with respect
to that tensor, so the gradient comes out flat. Eager, as Keras's own PyTorch trainer runs
(`torch.compile` is not used: it recompiles per batch shape and gains little at these sizes).
"""

from __future__ import annotations

import numpy as np

from nbdist.engine.flat_step import StatelessFlatModel


class TorchFlatModel(StatelessFlatModel):
    """Flat-buffer gradients for one Keras model on PyTorch."""

    def __init__(self, model):
        super().__init__(model)
        import torch  # PyTorch: only on its backend

        first = next(iter(model.variables), None)
        self.device = first.value.device if first is not None else torch.device("cpu")

    def _tensors(self, data):
        import keras  # Keras: after the cell picks its backend
        import torch  # PyTorch: only on its backend

        return keras.tree.map_structure(
            lambda a: None if a is None else torch.as_tensor(np.asarray(a), device=self.device),
            data)

    def _step(self, params, non_trainable, x, y, sample_weight) -> tuple:
        return self._compute(params, non_trainable, *self._tensors((x, y, sample_weight)))

    def _hold(self, x, y, sample_weight) -> tuple:
        return self._tensors((x, y, sample_weight))

    def _step_at(self, params, non_trainable, index) -> tuple:
        import keras  # Keras: after the cell picks its backend
        import torch  # PyTorch: only on its backend

        at = torch.as_tensor(index, device=self.device)
        x, y, sw = keras.tree.map_structure(lambda t: None if t is None else t[at], self._held)
        return self._compute(params, non_trainable, x, y, sw)

    def _compute(self, params, non_trainable, x, y, sw) -> tuple:
        import torch  # PyTorch: only on its backend

        parts = self.parts
        flat = torch.tensor(params, dtype=torch.float32, device=self.device, requires_grad=True)
        nt = torch.tensor(non_trainable, dtype=torch.float32, device=self.device)
        with torch.enable_grad():
            loss, aux = parts.loss(flat, nt, parts.int_values(), x, y, sw)
        grad = torch.autograd.grad(loss, flat, allow_unused=True)[0]
        if grad is None:  # no variable reaches the loss
            grad = torch.zeros_like(flat)
        with torch.no_grad():
            loss, grad, norm, nt_after, metrics, ints = parts.outputs(loss.detach(), grad, aux,
                                                                      x, y, sw)
            parts.write_ints(ints)
        return (loss.item(), grad.cpu().numpy(), norm.item(), nt_after.detach().cpu().numpy(),
                metrics.detach().cpu().numpy())
