"""Finding a model's layers of one kind, nested models and wrapped layers (Bidirectional,
TimeDistributed) where asked, for the choices a run makes about its model at the start: precise
BatchNorm statistics (`nbdist.engine.batchnorm`) and the warning for recurrent nets under
asynchronous plain SGD (`nbdist.job.Job.recurrent_notices`)."""

from __future__ import annotations

from collections.abc import Callable


def layers_where(model, wanted: Callable[[object], bool], wrappers: bool = False) -> list:
    """Every layer of `model` for which `wanted(layer)` holds, in order, looking inside nested
    models (their `layers`) and, with `wrappers`, inside wrappers (their `layer`, a
    Bidirectional's `forward_layer`)."""
    found, stack = [], [model]
    while stack:
        layer = stack.pop()
        if wanted(layer):
            found.append(layer)
        inner = list(getattr(layer, "layers", []))
        if wrappers:
            inner += [w for w in (getattr(layer, n, None) for n in ("layer", "forward_layer"))
                      if w is not None and w is not layer]
        stack.extend(reversed(inner))
    return found


def recurrent_layers(model) -> list:
    """Every recurrent layer of `model` (LSTM, GRU, SimpleRNN, any keras.layers.RNN)."""
    import keras  # Keras: after the cell picks its backend

    return layers_where(model, lambda layer: isinstance(layer, keras.layers.RNN), wrappers=True)
