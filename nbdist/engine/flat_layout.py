"""A Keras model's variables as flat float32 vectors: which variables, in what order, read and
written (`layout`, `variables_of`, `read_flat`, `write_flat`), and the model built the same way
in the kernel and on every worker before any of that is read (`ensure_built`).

Backend-neutral (the variables' own `numpy()` and `assign`), so the kernel's job, the modes and
each backend's compiled step (`nbdist.engine.flatmodel`) share one statement of the order.
"""

from __future__ import annotations

import numpy as np

from nbdist.engine.data import take
from nbdist.engine.step_metrics import build_metrics
from nbdist.errors import CellError


def ensure_built(model, x_sample, y_sample=None, sample_weight=None) -> None:
    """Create every variable of `model` with one forward pass in inference mode on `x_sample`
    (a sample or two; nested for several inputs), the same way in the kernel and in every
    worker, before `layout` is read; with `y_sample`, also the compiled loss's and metrics'
    variables, as `fit` creates them before its first step.

    Keras creates a subclassed model's variables on its first call: `model.build((None, 10))`
    alone may create none. Inference mode changes no state (no BatchNorm update, no dropout).
    """
    first = head(x_sample, 1)
    y_pred = model(first, training=False)
    if y_sample is not None:
        build_metrics(model, first, head(y_sample, 1), y_pred,
                      None if sample_weight is None else head(sample_weight, 1))


def head(data, n: int):
    """The first `n` samples of an array or of a nested structure of arrays."""
    return take(data, slice(0, n))


def layout(model) -> dict:
    """Shapes of the trainable and float non-trainable variables, in the order used."""
    trainable, non_trainable = variables_of(model)
    return {"trainable": [list(v.shape) for v in trainable],
            "non_trainable": [list(v.shape) for v in non_trainable]}


def variables_of(model) -> tuple[list, list]:
    """(trainable variables, float non-trainable variables), in the flat buffers' order."""
    trainable = list(model.trainable_variables)
    non_trainable = [v for v in model.non_trainable_variables if "float" in str(v.dtype)]
    return trainable, non_trainable


def read_flat(model) -> tuple[np.ndarray, np.ndarray]:
    """The model's current trainable and non-trainable values as flat float32 arrays."""
    trainable, non_trainable = variables_of(model)
    return concat_values(trainable), concat_values(non_trainable)


def write_flat(model, params: np.ndarray, non_trainable: np.ndarray) -> None:
    """Set the model's variables from flat arrays (kernel side; not on the hot path)."""
    trainable, nt_vars = variables_of(model)
    _assign_from(trainable, params)
    _assign_from(nt_vars, non_trainable)


def write_non_trainable(model, non_trainable: np.ndarray) -> None:
    """Set only the model's float non-trainable variables (BatchNorm's moving statistics)."""
    _assign_from(variables_of(model)[1], non_trainable)


def _assign_from(variables: list, flat: np.ndarray) -> None:
    offset = 0
    for v in variables:
        n = int(np.prod(v.shape))
        v.assign(np.asarray(flat[offset:offset + n]).reshape(v.shape))
        offset += n


def concat_values(variables: list) -> np.ndarray:
    """The variables' values, each flattened, in one float32 array."""
    if not variables:
        return np.zeros(0, dtype=np.float32)
    return np.concatenate([np.asarray(v.numpy(), dtype=np.float32).ravel() for v in variables])


def rng_state(model) -> list[np.ndarray]:
    """The model's integer state: the seed generators of Dropout, GaussianNoise and the random
    augmentation layers (read in the kernel, so that every worker starts from it)."""
    return [np.array(v.numpy()) for v in model.non_trainable_variables
            if "float" not in str(v.dtype)]


def write_rng_state(model, state: list[np.ndarray], worker: int) -> None:
    """Set the model's integer state to `state` (`rng_state` of the kernel's model): worker 0
    takes it as it is, so it draws the kernel's dropout masks; worker w adds w to each seed
    generator's seed, so workers draw different masks. Raises CellError when the model's
    integer variables differ from the kernel's."""
    variables = [v for v in model.non_trainable_variables if "float" not in str(v.dtype)]
    shapes = [tuple(v.shape) for v in variables]
    if shapes != [a.shape for a in state]:
        raise CellError(
            f"The model built here has other integer variables (seed generators) than the "
            f"kernel's (Received: shapes {shapes}, expected {[a.shape for a in state]}). The cell "
            "must build the same model every time it runs: avoid random architecture choices "
            "or state from other cells.")
    for v, value in zip(variables, state, strict=True):
        value = np.array(value)
        if worker and v.path.endswith("seed_generator_state") and value.shape == (2,):
            value[0] += worker  # [seed, counter]: another seed, another stream of masks
        v.assign(value)
