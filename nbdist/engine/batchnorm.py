"""Precise BatchNorm statistics: the moving mean and variance recomputed at the weights a run
hands the notebook, instead of the moving averages gathered while the weights moved.

A BatchNormalization layer evaluates with its moving statistics, an exponential average
(momentum 0.99: about the last 100 steps) of batch statistics taken at the weights of those
steps. When the weights move fast (SGD(0.05) on a BatchNorm CNN, 2 epochs), the averages lag the
final weights and the evaluation swings from run to run: on that cell `model.fit` itself landed
0.64-0.81 over six seeds, two async workers 0.73-0.79, and both 0.80-0.835 with statistics
recomputed at their final weights (docs/rules.md, "BatchNorm statistics").
In an async run the hub's statistics are also the sum of each worker's changes, each taken at a
read one or more updates old. So nbdist recomputes them ("precise BN", Wu & Johnson 2021,
"Rethinking 'Batch' in BatchNorm"): a forward pass in training mode over `PRECISE_SAMPLES`
training samples, each layer's moving statistics the running mean of its batch statistics.

Backend-neutral Keras 3 (eager calls); the kernel runs it on the notebook's model
(`nbdist.job.Job.settle_model`), never an engine.
"""

from __future__ import annotations

from nbdist.engine.data import num_rows, take
from nbdist.engine.layer_search import layers_where

PRECISE_SAMPLES = 8192  # about 100 batches at a batch size of 64, as precise BN uses


def batchnorm_layers(model) -> list:
    """Every BatchNormalization layer of `model`, nested models included, in order."""
    import keras  # Keras: after the cell picks its backend

    return layers_where(model, lambda layer: isinstance(layer, keras.layers.BatchNormalization))


def recompute_batchnorm(model, x, batch_size: int, samples: int = PRECISE_SAMPLES) -> int:
    """Set each BatchNormalization layer's moving statistics to the mean of its batch
    statistics over the first `samples` rows of `x` (nested for several inputs), in batches of
    `batch_size`, at the model's current weights; returns the rows used (0: no such layer).

    Each layer keeps its own momentum: it is lowered to (k − 1)/k for the k-th batch only while
    this runs, which makes the moving statistics the running mean."""
    layers = batchnorm_layers(model)
    if not layers:
        return 0
    rows = min(int(samples), num_rows(x))
    size = max(1, int(batch_size))
    kept = [layer.momentum for layer in layers]
    try:
        for k, start in enumerate(range(0, rows, size), start=1):
            for layer in layers:
                layer.momentum = (k - 1) / k
            model(take(x, slice(start, min(start + size, rows))), training=True)
    finally:
        for layer, momentum in zip(layers, kept, strict=True):
            layer.momentum = momentum
    return rows
