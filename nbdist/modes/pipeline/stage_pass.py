"""A stage's forward and backward passes on the kernel's Keras backend, NumPy in and out.

A stage receives activations (NumPy) from the stage before, runs its part of the model, sends
its outputs on, and later gets their gradients back; it returns the gradients of its inputs
and keeps the sum of its variables' gradients over the mini-batch's micro-batches for one
step of the cell's optimizer (`apply`). Each backend differentiates its own way:

- TensorFlow: a `tf.GradientTape` held from the forward pass to the backward one, the forward
  pass compiled with `tf.function`;
- PyTorch: autograd, eager, as Keras's own PyTorch trainer runs: the forward pass records the
  graph, the backward pass is `torch.autograd.grad` with the upstream gradients;
- JAX: Keras's stateless calls (the variables' values passed in, as the workers' step does,
  `nbdist.engine.flat_step`), compiled with `jax.jit`. The pullback `jax.vjp` gives is a new
  function at every call, which `jax.jit` would compile again each time, so the compiled
  backward pass runs the forward pass again inside `jax.vjp` (GPipe's re-materialisation: about
  a third more compute on the stage, no activations held between the passes), on the same
  values and random state as the first one, so it computes the same function.

The last stage's forward pass ends in the cell's compiled loss (and its layers' penalties),
weighted by the micro-batch's share of the mini-batch.
"""

from __future__ import annotations

import numpy as np

from nbdist.engine.keras_backend import backend_name


def stage_pass(sub, model, *, input_grads: bool):
    """The passes of stage model `sub` (`graph.StageModel`) of `model` on this process's Keras
    backend (the last stage calls `forward_loss`, the others `forward`); `input_grads`: the
    backward pass returns its inputs' gradients (every stage but the first sends them back)."""
    kind = {"tensorflow": TensorFlowPass, "jax": JaxPass, "torch": TorchPass}[backend_name()]
    return kind(sub, model, input_grads=input_grads)


def prediction(model, outs: list):
    """The model's output structure from the last cut's tensors."""
    if len(outs) == 1:
        return outs[0]
    from keras import tree  # Keras: after the cell picks its backend

    functional = getattr(model, "_functional", None) or model
    return tree.pack_sequence_as(functional._outputs_struct, outs)  # noqa: SLF001


def _is_float(array) -> bool:
    """Whether an array or any backend's tensor holds floats (gradients flow into it)."""
    from keras import backend  # Keras: after the cell picks its backend

    return "float" in backend.standardize_dtype(array.dtype)


class StagePass:
    """What every backend's passes share: the held forward passes by key, the gradient sum."""

    def __init__(self, sub, model, *, input_grads: bool):
        self.sub, self.model, self.input_grads = sub, model, input_grads
        self.trainable = sub.trainable
        self.held: dict = {}  # key -> what the backward pass of that forward pass needs
        self._grads: list | None = None

    def forward(self, inputs: list, key) -> list[np.ndarray]:
        """The stage's outputs (NumPy) for `inputs`, training; held under `key` for `backward`."""
        raise NotImplementedError

    def forward_loss(self, inputs: list, y, weight: float, key) -> tuple[float, object]:
        """The last stage: (its weighted loss, the model's prediction, a backend tensor for the
        compiled metrics), training; held under `key` for `backward`."""
        raise NotImplementedError

    def backward(self, key, upstream: list | None) -> list[np.ndarray]:
        """The backward pass of the forward pass held under `key`, with `upstream` (the
        gradients of its outputs; None on the last stage, whose output is the loss): adds the
        variables' gradients to the step's sum and returns the inputs' gradients (float32
        zeros for an input that is not a float), or [] without `input_grads`."""
        raise NotImplementedError

    def evaluate(self, inputs: list) -> list:
        """The stage's outputs for `inputs` in inference mode (backend tensors)."""
        raise NotImplementedError

    def apply(self, optimizer) -> None:
        """One step of `optimizer` on the stage's variables with the summed gradients."""
        if self.trainable and self._grads is not None:
            optimizer.apply(self._grads, self.trainable)
        self._grads = None

    def _add(self, grads: list) -> None:
        self._grads = (list(grads) if self._grads is None
                       else [a + g for a, g in zip(self._grads, grads, strict=True)])

    def _input_grads(self, inputs: list, grads) -> list[np.ndarray]:
        """NumPy gradients of `inputs` from those of their float ones (`grads`, in order)."""
        if not self.input_grads:
            return []
        it = iter(grads)
        return [np.asarray(next(it), np.float32) if _is_float(a)
                else np.zeros(np.shape(a), np.float32) for a in inputs]


class TensorFlowPass(StagePass):
    """`tf.GradientTape` around a `tf.function` forward pass."""

    def __init__(self, sub, model, **kwargs):
        super().__init__(sub, model, **kwargs)
        import tensorflow as tf  # TensorFlow: only on its backend

        def forward(inputs):
            return sub.forward(inputs, training=True)

        def forward_loss(inputs, y, weight):
            pred = prediction(model, sub.forward(inputs, training=True))
            loss = model._compile_loss(y, pred)  # noqa: SLF001 - the compiled loss, without model.losses
            return weight * (loss + sub.regularization()), pred

        def evaluate(inputs):
            return sub.forward(inputs, training=False)

        self._forward = tf.function(forward, reduce_retracing=True)
        self._forward_loss = tf.function(forward_loss, reduce_retracing=True)
        self._evaluate = tf.function(evaluate, reduce_retracing=True)

    def _taped(self, inputs: list, run):
        import tensorflow as tf  # TensorFlow: only on its backend

        tensors = [tf.convert_to_tensor(a) for a in inputs]
        watched = [t for t in tensors if t.dtype.is_floating] if self.input_grads else []
        with tf.GradientTape() as tape:
            tape.watch(watched)
            out = run(tensors)
        return tape, tensors, watched, out

    def forward(self, inputs: list, key) -> list[np.ndarray]:
        tape, tensors, watched, out = self._taped(inputs, self._forward)
        self.held[key] = (tape, tensors, watched, out)
        return [o.numpy() for o in out]

    def forward_loss(self, inputs: list, y, weight: float, key) -> tuple[float, object]:
        import tensorflow as tf  # TensorFlow: only on its backend

        y, weight = tf.convert_to_tensor(y), tf.constant(weight, tf.float32)
        tape, tensors, watched, (loss, pred) = self._taped(
            inputs, lambda t: self._forward_loss(t, y, weight))
        self.held[key] = (tape, tensors, watched, loss)
        return float(loss), pred

    def backward(self, key, upstream: list | None) -> list[np.ndarray]:
        import tensorflow as tf  # TensorFlow: only on its backend

        tape, tensors, watched, out = self.held.pop(key)
        if upstream is not None:
            upstream = [tf.convert_to_tensor(a) for a in upstream]
        result = tape.gradient(out, [*watched, *self.trainable], output_gradients=upstream,
                               unconnected_gradients=tf.UnconnectedGradients.ZERO)
        grads = result[len(watched):]
        self._grads = (list(grads) if self._grads is None
                       else [_tf_sum(a, g) for a, g in zip(self._grads, grads, strict=True)])
        return self._input_grads(tensors, [g.numpy() for g in result[:len(watched)]])

    def evaluate(self, inputs: list) -> list:
        import tensorflow as tf  # TensorFlow: only on its backend

        return self._evaluate([tf.convert_to_tensor(a) for a in inputs])


def _tf_sum(a, b):
    """a + b for TensorFlow gradients; an Embedding's sparse ones (IndexedSlices) stay sparse,
    their rows joined, so the optimizer updates them as it updates one batch's in `fit`."""
    import tensorflow as tf  # TensorFlow: only on its backend

    if isinstance(a, tf.IndexedSlices) and isinstance(b, tf.IndexedSlices):
        return tf.IndexedSlices(tf.concat([a.values, b.values], 0),
                                tf.concat([a.indices, b.indices], 0), a.dense_shape)
    return tf.convert_to_tensor(a) + tf.convert_to_tensor(b)


class TorchPass(StagePass):
    """Autograd, eager: the forward pass records the graph that `backward` runs back."""

    def _tensors(self, inputs: list) -> list:
        from keras import ops  # Keras: after the cell picks its backend

        tensors = [ops.convert_to_tensor(a) for a in inputs]
        if self.input_grads:
            for t in tensors:
                if t.is_floating_point():
                    t.requires_grad_(True)
        return tensors

    def forward(self, inputs: list, key) -> list[np.ndarray]:
        import torch  # PyTorch: only on its backend

        tensors = self._tensors(inputs)
        with torch.enable_grad():
            out = self.sub.forward(tensors, training=True)
        self.held[key] = (tensors, out)
        return [o.detach().cpu().numpy() for o in out]

    def forward_loss(self, inputs: list, y, weight: float, key) -> tuple[float, object]:
        import torch  # PyTorch: only on its backend
        from keras import ops, tree  # Keras: after the cell picks its backend

        tensors = self._tensors(inputs)
        with torch.enable_grad():
            pred = prediction(self.model, self.sub.forward(tensors, training=True))
            loss = self.model._compile_loss(ops.convert_to_tensor(y), pred)  # noqa: SLF001
            loss = weight * (loss + self.sub.regularization())
        self.held[key] = (tensors, [loss])
        return float(loss.detach()), tree.map_structure(lambda t: t.detach(), pred)

    def backward(self, key, upstream: list | None) -> list[np.ndarray]:
        import torch  # PyTorch: only on its backend
        from keras import ops  # Keras: after the cell picks its backend

        tensors, out = self.held.pop(key)
        sources = [t for t in tensors if t.requires_grad]
        params = [v.value for v in self.trainable]
        upstream = [None] * len(out) if upstream is None else [
            ops.convert_to_tensor(u) for u in upstream]
        pairs = [(o, u) for o, u in zip(out, upstream, strict=True) if o.requires_grad]
        wanted = [*sources, *params]
        grads = [None] * len(wanted)
        if pairs and wanted:  # else nothing of this stage reaches its outputs: all zero
            outs, ups = zip(*pairs, strict=True)
            grads = torch.autograd.grad(outs, wanted, grad_outputs=None if upstream[0] is None
                                        else ups, allow_unused=True)
        grads = [torch.zeros_like(w) if g is None else g for g, w in zip(grads, wanted,
                                                                       strict=True)]
        self._add(grads[len(sources):])
        return self._input_grads(tensors, [g.detach().cpu().numpy()
                                           for g in grads[:len(sources)]])

    def evaluate(self, inputs: list) -> list:
        import torch  # PyTorch: only on its backend
        from keras import ops  # Keras: after the cell picks its backend

        with torch.no_grad():
            return self.sub.forward([ops.convert_to_tensor(a) for a in inputs], training=False)


class JaxPass(StagePass):
    """Stateless calls under `jax.jit`; the backward pass re-runs the forward one in `jax.vjp`
    (see the module docstring). The forward pass's new state (BatchNorm's moving statistics,
    the dropout seeds) is written into the variables after it, as a stateful call would."""

    def __init__(self, sub, model, **kwargs):
        super().__init__(sub, model, **kwargs)
        import jax  # JAX: only on its backend

        self.state = [v for op in sub.ops for v in getattr(op, "non_trainable_variables", [])]
        self._kinds: list[bool] = []  # which inputs are floats (the same at every call)
        wrt = (0, 2) if self.input_grads else (0,)  # the values, and the float inputs
        self._forward = jax.jit(self._run, static_argnames="training")
        self._forward_loss = jax.jit(self._loss)
        self._backward = jax.jit(self._pullback)
        self._loss_grad = jax.jit(jax.grad(lambda *a: self._loss(*a)[0], argnums=wrt))

    def _scope(self, values, state, **kwargs):
        import keras  # Keras: after the cell picks its backend

        return keras.StatelessScope(state_mapping=[*zip(self.trainable, values, strict=True),
                                                   *zip(self.state, state, strict=True)],
                                    **kwargs)

    def _run(self, values, state, floats, others, training=True):
        """(outputs, new state, the layers' penalties) of the stage on these values."""
        with self._scope(values, state, collect_losses=True) as scope:
            outs = self.sub.forward(self._merge(floats, others), training=training)
            penalty = self.sub.regularization()
            new_state = [scope.get_current_value(v) for v in self.state]
        return (outs, [s if n is None else n for s, n in zip(state, new_state, strict=True)],
                penalty)

    def _loss(self, values, state, floats, others, y, weight):
        outs, new_state, penalty = self._run(values, state, floats, others)
        pred = prediction(self.model, outs)
        with self._scope(values, state):  # what the loss's trackers write stays in the scope
            loss = self.model._compile_loss(y, pred)  # noqa: SLF001 - the compiled loss
        return weight * (loss + penalty), (pred, new_state)

    def _pullback(self, values, state, floats, others, upstream):
        import jax  # JAX: only on its backend

        if not self.input_grads:
            _, pullback = jax.vjp(lambda vs: self._run(vs, state, floats, others)[0], values)
            return pullback(upstream)[0], []
        _, pullback = jax.vjp(lambda vs, fs: self._run(vs, state, fs, others)[0], values,
                              floats)
        return pullback(upstream)

    def _merge(self, floats: list, others: list) -> list:
        it_f, it_o = iter(floats), iter(others)
        return [next(it_f) if f else next(it_o) for f in self._kinds]

    def _begin(self, inputs: list) -> tuple:
        """(values, state, float inputs, other inputs): what the forward pass runs on, held
        for the backward one."""
        self._kinds = [_is_float(a) for a in inputs]
        return ([v.value for v in self.trainable], [v.value for v in self.state],
                [a for a in inputs if _is_float(a)], [a for a in inputs if not _is_float(a)])

    def _end(self, new_state: list) -> None:
        for variable, value in zip(self.state, new_state, strict=True):
            variable.assign(value)

    def forward(self, inputs: list, key) -> list[np.ndarray]:
        args = self._begin(inputs)
        outs, new_state, _ = self._forward(*args)
        self._end(new_state)
        self.held[key] = args
        return [np.asarray(o) for o in outs]

    def forward_loss(self, inputs: list, y, weight: float, key) -> tuple[float, object]:
        args = (*self._begin(inputs), y, np.float32(weight))
        loss, (pred, new_state) = self._forward_loss(*args)
        self._end(new_state)
        self.held[key] = args
        return float(loss), pred

    def backward(self, key, upstream: list | None) -> list[np.ndarray]:
        held = self.held.pop(key)
        if upstream is None:  # the last stage: the loss's gradient
            grads = self._loss_grad(*held)
            grad_values, grad_floats = grads if self.input_grads else (grads[0], [])
        else:
            grad_values, grad_floats = self._backward(*held[:4], list(upstream))
        self._add(list(grad_values))
        if not self.input_grads:
            return []
        zeros = [np.zeros(np.shape(o), np.float32) for o in held[3]]
        return [np.asarray(g, np.float32) for g in self._merge(list(grad_floats), zeros)]

    def evaluate(self, inputs: list) -> list:
        values, state, floats, others = self._begin(inputs)
        return self._forward(values, state, floats, others, training=False)[0]
