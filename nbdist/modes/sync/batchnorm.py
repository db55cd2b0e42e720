"""BatchNormalization over the global batch in `--mode sync` (`--sync-batchnorm`).

Without it, each Horovod rank normalises over its own share of the batch (64 samples in a
2 x 64 run). That is not what `model.fit` does at batch 128, and it costs accuracy on
BatchNorm networks. `SyncBatchNorm(model, hvd)` changes how every BatchNormalization layer of
the model computes its batch statistics on this engine (layers inside nested sub-models
included) without changing the model's class: in training, each rank allreduces (sums) its
per-channel sample count, sum and sum of squares, and every rank normalises with the global
mean and variance, as Horovod's `SyncBatchNormalization` does. Sums and counts rather than
means, because with `--dbs` the ranks' batches differ; the sums are taken around the moving
mean (the same on every rank), which keeps E[x^2] - E[x]^2 precise in float32. The moving
statistics then come out the same on every rank.

Gradients flow through the allreduce. Horovod's allreduce op has a registered gradient (an
allreduce of the incoming gradient), but it names that collective after the gradient
tensor, whose name carries Keras's per-process layer counters (`batch_normalization_3`), and
Horovod matches collectives across ranks by name: two engines that ran different cells
before would wait for each other until the stall timeout. So both directions are wrapped in
one `tf.custom_gradient` whose collectives have fixed names (`nbdist_batchnorm_<i>`, by the
layer's position in the model).

Weighting. sync.py multiplies rank r's gradient by its share w_r of the global batch after
the backward pass (the loss is each rank's own mean). The statistics' gradient must instead
be the sum over ranks of w_r' * dL_r'/dS, so the backward allreduce sums w_r * g_r and divides
by this rank's w_r (which sync.py multiplies back). A rank left without samples at the end of
an epoch (w_r = 0, one placeholder sample) contributes nothing, forward or backward.

`TorchSyncBatchNorm(model, group)` does the same on Keras's PyTorch backend with
`--collective torch`: the sums go through the rank's Gloo group in a `torch.autograd.Function`
(forward: their allreduce; backward: the allreduce of the batch-share-weighted gradient), in
the layers' fixed order, the same on every rank. On Keras's JAX backend the forward pass is one
compiled function: there the sums leave it through `jax.pure_callback` for the same Gloo
allreduce on the host, inside a `jax.custom_vjp` whose backward pass is the allreduce of the
weighted gradient (the rank's share is read on the host at each call, so a compiled step
follows --dbs). The calls come in the layers' order, each one's input depending on the one
before, the same on every rank. TensorFlow has Horovod's, so TensorFlow through torch refuses
it (the sync mode's start).
"""

from __future__ import annotations

import numpy as np

from nbdist.errors import DependencyError


def batchnorm_layers(model) -> list:
    """Every BatchNormalization layer in `model`, nested sub-models included, in a fixed order
    (the same on every rank, since every rank runs the same cell)."""
    import keras  # Keras: after the cell picks its backend

    return [layer for layer in model._flatten_layers(include_self=False, recursive=True)  # noqa: SLF001
            if isinstance(layer, keras.layers.BatchNormalization)]


class SyncBatchNorm:
    """The model's BatchNormalization layers, switched to global-batch statistics in training.

    Example (on a rank, after `hvd.init()`):
        >>> bn = SyncBatchNorm(model, hvd)      # doctest: +SKIP
        >>> bn.set_share(64 / 128)              # before each step's forward pass
    """

    def __init__(self, model, hvd):
        import tensorflow as tf  # TensorFlow: only where a rank runs

        self.layers = batchnorm_layers(model)
        self.share = tf.Variable(1.0, trainable=False, dtype=tf.float32, name="nbdist_batch_share")
        self._share = 1.0
        for index, layer in enumerate(self.layers):
            if not callable(getattr(layer, "_moments", None)):
                raise DependencyError(
                    f"--sync-batchnorm replaces BatchNormalization._moments, which this Keras "
                    f"({keras_version()}) does not have (layer {layer.name!r}). Use Keras 3.x as "
                    "pinned by nbdist, or train with --no-sync-batchnorm.")
            # an instance attribute: only this model's layers on this engine change
            object.__setattr__(layer, "_moments", _global_moments(layer, index, hvd, self.share))

    def set_share(self, share: float) -> None:
        """This rank's share of the global batch for the next step (0: no samples)."""
        if share != self._share:
            self._share = float(share)
            self.share.assign(np.float32(share))


def keras_version() -> str:
    import keras  # Keras: after the cell picks its backend

    return keras.__version__


def _global_moments(layer, index: int, hvd, share):
    """A replacement for `layer._moments(inputs, mask)`: the global batch's mean and variance."""
    import tensorflow as tf  # TensorFlow: only where a rank runs

    name = f"nbdist_batchnorm_{index}"

    @tf.custom_gradient
    def global_sum(local, weight):
        total = hvd.allreduce(local, op=hvd.Sum, name=name, ignore_name_scope=True)

        def grad(upstream):
            summed = hvd.allreduce(upstream * weight, op=hvd.Sum, name=name + "_grad",
                                   ignore_name_scope=True)
            return tf.math.divide_no_nan(summed, weight), tf.zeros_like(weight)

        return total, grad

    def moments(inputs, mask=None):
        x = tf.cast(inputs, tf.float32)
        ndim = len(x.shape)
        axis = layer.axis % ndim
        axes = [a for a in range(ndim) if a != axis]
        broadcast = [-1 if a == axis else 1 for a in range(ndim)]
        shift = tf.reshape(tf.stop_gradient(tf.cast(layer.moving_mean, tf.float32)), broadcast)
        weight = share.read_value()
        active = tf.cast(weight > 0, tf.float32)  # a rank with no samples adds nothing
        if mask is None:
            counts = tf.ones_like(x)
        else:
            counts = tf.broadcast_to(tf.expand_dims(tf.cast(mask, tf.float32), -1), tf.shape(x))
        d = (x - shift) * counts
        local = tf.stack([tf.reduce_sum(counts, axes), tf.reduce_sum(d, axes),
                          tf.reduce_sum(d * (x - shift), axes)]) * active
        count, total, squares = tf.unstack(global_sum(local, weight))
        mean_d = tf.math.divide_no_nan(total, count)
        variance = tf.maximum(tf.math.divide_no_nan(squares, count) - tf.square(mean_d), 0.0)
        mean = mean_d + tf.reshape(shift, [-1])
        return tf.cast(mean, inputs.dtype), tf.cast(variance, inputs.dtype)

    return moments


class TorchSyncBatchNorm:
    """`SyncBatchNorm` on Keras's PyTorch or JAX backend, over a torch.distributed process
    group (a rank's `TorchCollective.group`)."""

    def __init__(self, model, group):
        import keras  # Keras: after the cell picks its backend

        self.layers = batchnorm_layers(model)
        self.share = [1.0]  # this rank's share of the global batch, read in each forward pass
        global_moments = (_jax_global_moments if keras.backend.backend() == "jax"
                          else _torch_global_moments)
        for layer in self.layers:
            if not callable(getattr(layer, "_moments", None)):
                raise DependencyError(
                    f"--sync-batchnorm replaces BatchNormalization._moments, which this Keras "
                    f"({keras_version()}) does not have (layer {layer.name!r}). Use Keras 3.x as "
                    "pinned by nbdist, or train with --no-sync-batchnorm.")
            object.__setattr__(layer, "_moments", global_moments(layer, group, self.share))

    def set_share(self, share: float) -> None:
        """This rank's share of the global batch for the next step (0: no samples)."""
        self.share[0] = float(share)


def _torch_global_moments(layer, group, share: list):
    """`_global_moments` in torch: the global batch's mean and variance, gradients through."""
    import torch  # PyTorch: only where a torch rank runs
    from keras import ops  # Keras: after the cell picks its backend

    class GlobalSum(torch.autograd.Function):
        @staticmethod
        def forward(ctx, local, weight):
            total = local.detach().cpu().contiguous().clone()
            group.allreduce([total]).wait()
            ctx.save_for_backward(weight)
            return total.to(local.device)

        @staticmethod
        def backward(ctx, upstream):
            (weight,) = ctx.saved_tensors
            summed = (upstream * weight).detach().cpu().contiguous().clone()
            group.allreduce([summed]).wait()
            summed = summed.to(upstream.device)
            back = summed / weight if float(weight) > 0 else torch.zeros_like(summed)
            return back, None

    def moments(inputs, mask=None):
        x = inputs.float()
        ndim = x.dim()
        axis = layer.axis % ndim
        axes = [a for a in range(ndim) if a != axis]
        broadcast = [-1 if a == axis else 1 for a in range(ndim)]
        shift = ops.convert_to_tensor(layer.moving_mean).detach().float().reshape(broadcast)
        weight = torch.tensor(share[0], dtype=torch.float32, device=x.device)
        active = 1.0 if share[0] > 0 else 0.0  # a rank with no samples adds nothing
        counts = (torch.ones_like(x) if mask is None
                  else mask.float().unsqueeze(-1).expand_as(x))
        d = (x - shift) * counts
        local = torch.stack([counts.sum(axes), d.sum(axes), (d * (x - shift)).sum(axes)]) * active
        count, total, squares = GlobalSum.apply(local, weight).unbind(0)
        safe = torch.where(count > 0, count, torch.ones_like(count))
        mean_d = torch.where(count > 0, total / safe, torch.zeros_like(total))
        variance = torch.clamp(torch.where(count > 0, squares / safe, torch.zeros_like(squares))
                               - mean_d * mean_d, min=0.0)
        mean = mean_d + shift.reshape(-1)
        return mean.to(inputs.dtype), variance.to(inputs.dtype)

    return moments


def _jax_global_moments(layer, group, share: list):
    """`_torch_global_moments` inside JAX's compiled step: the sums' allreduce on the host
    (`jax.pure_callback`), its gradient the allreduce of the weighted upstream gradient."""
    import jax  # JAX: only where a JAX rank runs
    import jax.numpy as jnp
    import torch  # PyTorch: the Gloo group's tensors
    from keras import ops  # Keras: after the cell picks its backend

    def allreduce(values: np.ndarray, scale: float) -> np.ndarray:
        summed = np.array(values, np.float32) * np.float32(scale)
        group.allreduce([torch.from_numpy(summed)]).wait()
        return summed

    def forward_sum(local):  # a rank with no samples adds nothing
        return allreduce(local, 1.0 if share[0] > 0 else 0.0)

    def backward_sum(upstream):
        weight = share[0]
        summed = allreduce(upstream, weight)
        return summed / np.float32(weight) if weight > 0 else np.zeros_like(summed)

    def on_host(function, values):
        return jax.pure_callback(function, jax.ShapeDtypeStruct(values.shape, jnp.float32),
                                 values)

    @jax.custom_vjp
    def global_sum(local):
        return on_host(forward_sum, local)

    def global_sum_forward(local):
        return global_sum(local), None

    def global_sum_backward(_, upstream):
        return (on_host(backward_sum, upstream),)

    global_sum.defvjp(global_sum_forward, global_sum_backward)

    def moments(inputs, mask=None):
        x = inputs.astype(jnp.float32)
        ndim = x.ndim
        axis = layer.axis % ndim
        axes = tuple(a for a in range(ndim) if a != axis)
        broadcast = [-1 if a == axis else 1 for a in range(ndim)]
        shift = jax.lax.stop_gradient(
            ops.convert_to_tensor(layer.moving_mean).astype(jnp.float32).reshape(broadcast))
        counts = (jnp.ones_like(x) if mask is None
                  else jnp.broadcast_to(mask.astype(jnp.float32)[..., None], x.shape))
        d = (x - shift) * counts
        local = jnp.stack([counts.sum(axes), d.sum(axes), (d * (x - shift)).sum(axes)])
        count, total, squares = global_sum(local)
        safe = jnp.where(count > 0, count, 1.0)
        mean_d = jnp.where(count > 0, total / safe, 0.0)
        variance = jnp.maximum(jnp.where(count > 0, squares / safe, 0.0) - mean_d * mean_d, 0.0)
        mean = mean_d + shift.reshape(-1)
        return mean.astype(inputs.dtype), variance.astype(inputs.dtype)

    return moments
