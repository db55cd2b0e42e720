"""What a cell's `model.fit(...)` call trains on, put where the rest of nbdist finds it.

`place(call, namespace)` runs in the kernel and on every engine alike, on the call the cell
made there, so each computes the same split and the same weights from its own copy of the
data. It keeps the model, the training data (x, y, per-sample weights) and the validation data
under the reserved names of `nbdist.engine.fit_call.RESERVED`, and returns those names:
- `validation_split` is Keras's: the last fraction of the samples, before any shuffling;
- `class_weight` becomes per-sample weights of the training part, as Keras computes them;
- `validation_data` is (x, y), (x, y, sample_weight), a dataset, or a PyDataset or an iterator
  (read once, then replayed at each validation);
- a dataset or a generator function is one name, as `--data NAME`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from nbdist.engine.data import DataAdapter, data_adapter, nbytes, num_rows, take
from nbdist.engine.fit_call import MODEL, SW, VAL_SW, VAL_X, VAL_Y, FitCall, X, Y
from nbdist.errors import CellError


@dataclass(frozen=True)
class FitData:
    """The names `place` used (and what they hold)."""

    data: tuple[str, ...]  # (x, y[, sample weights]) or one dataset / generator function
    validation: tuple[str, ...]  # () when the call validates on nothing
    take_batches: int | None = None  # batches of a repeating dataset that make an epoch
    is_dataset: bool = False
    warning: str | None = None  # how the run trains unlike the call (for run.warnings)


def place(call: FitCall, namespace: dict) -> FitData:
    """Put the call's model and data into `namespace` under the reserved names; see the module
    docstring. Raises a CellError for what the call cannot mean."""
    namespace[MODEL] = call.model
    adapter = data_adapter(call.x)
    if call.x is None:
        raise CellError("model.fit() was called without training data (Received: x=None). Pass the "
                        "inputs and labels: model.fit(x_train, y_train, ...).")
    if adapter.streams:
        return _place_dataset(call, namespace, adapter)
    if adapter.replayed:
        return _place_batches(call, namespace, adapter)
    if call.y is None:
        raise CellError("model.fit() got inputs but no labels (Received: y=None). nbdist trains on "
                        "(inputs, labels) pairs: pass y, e.g. model.fit(x_train, y_train).")
    x, y, sw = call.x, call.y, call.sample_weight
    validation: tuple[str, ...] = ()
    if call.validation_split and call.validation_data is None:
        (x, y, sw), (vx, vy, vsw) = split_last(call.validation_split, x, y, sw)
        validation = _put(namespace, (VAL_X, VAL_Y, VAL_SW), (vx, vy, vsw))
    if call.class_weight is not None:
        if isinstance(y, (list, tuple, dict)):
            raise CellError("model.fit(class_weight=...) works with one output, as in Keras "
                            f"(Received: y as a {type(y).__name__}). Pass per-sample weights "
                            "per output with sample_weight instead.")
        sw = class_weights(y, call.class_weight)
    data = _put(namespace, (X, Y, SW), (x, y, sw))
    if call.validation_data is not None:
        validation = _place_validation(call, namespace)
    return FitData(data, validation)


def _place_dataset(call: FitCall, namespace: dict, adapter: DataAdapter) -> FitData:
    given = [name for name in ("y", "sample_weight", "class_weight")
             if getattr(call, name) is not None]
    if given:
        raise CellError(
            f"model.fit() got a {adapter.name} as x and "
            f"also {', '.join(given)}; as in Keras, a dataset yields its own labels (and weights, "
            "as a third element). Drop them, or map them into the dataset.")
    if call.validation_split:
        raise CellError(
            "model.fit(validation_split=...) splits arrays, not a dataset (Keras refuses it too). "
            "Pass validation_data=val_ds, or use ds.take/ds.skip to split.")
    namespace[X] = call.x
    take_batches = None
    if call.steps_per_epoch is not None and adapter.infinite():
        take_batches = call.steps_per_epoch  # an epoch is that many batches of the endless stream
    return FitData((X,), _place_validation(call, namespace), take_batches, is_dataset=True)


MAX_ITERATOR_BYTES = 2 * 2**30  # what a generator given to fit may yield without steps_per_epoch


def _place_batches(call: FitCall, namespace: dict, adapter: DataAdapter) -> FitData:
    """A Python generator, iterator or `keras.utils.PyDataset` as x: its batches are read once
    (every engine reads its own, as the cell made it there) and replayed each epoch."""
    if call.y is not None or call.validation_split:
        raise CellError(f"model.fit() got a {type(call.x).__name__} as x, which yields its own "
                        "labels; as in Keras it takes no y and no validation_split. Drop them.")
    batches = _read_once(adapter, call.steps_per_epoch, "x", "steps_per_epoch")
    if not batches:
        raise CellError(f"model.fit() got a {type(call.x).__name__} that yields no batch: there is "
                        "nothing to train on.")
    namespace[X] = _replay(batches)
    validation = _place_validation(call, namespace)
    return FitData((X,), validation, is_dataset=True, warning=(
        f"model.fit got a {type(call.x).__name__}: nbdist read {len(batches)} batch(es) of it "
        "once and trains every epoch on them (Keras would draw new batches each epoch from an "
        "endless one)."))


def _read_once(adapter: DataAdapter, steps: int | None, what: str, steps_name: str) -> list:
    """The batches of a Python iterator or a `keras.utils.PyDataset` (`steps` of them when
    given), read once: at most MAX_ITERATOR_BYTES, so an endless one without `steps` ends."""
    batches, size = [], 0
    for batch in adapter.batches(steps):
        batches.append(tuple(batch) if isinstance(batch, (tuple, list)) else batch)
        size += nbytes(batch)
        if size > MAX_ITERATOR_BYTES:
            raise CellError(f"model.fit() got a {type(adapter.value).__name__} as {what} that "
                            f"yields more than 2 GiB without {steps_name}. Say how many batches "
                            f"it has: model.fit(..., {steps_name}=N), or pass a tf.data.Dataset.")
    return batches


def _replay(batches: list):
    """A generator function over `batches` (what `--data NAME` takes), for each pass anew."""
    def replay():
        yield from batches

    return replay


def _place_validation(call: FitCall, namespace: dict) -> tuple[str, ...]:
    """The call's `validation_data` under VAL_X (a dataset, a DataLoader, a generator function,
    or a PyDataset or an iterator read once, as a generator function) or VAL_X, VAL_Y and
    VAL_SW (arrays); () without validation data."""
    value = call.validation_data
    if value is None:
        return ()
    adapter = data_adapter(value)
    if adapter.streams:
        namespace[VAL_X] = value
        return (VAL_X,)
    if adapter.replayed:  # Keras reads the batches it holds: so does every validation here
        batches = _read_once(adapter, call.validation_steps, "validation_data",
                             "validation_steps")
        if not batches:
            raise CellError(f"model.fit(validation_data=...) got a {type(value).__name__} that "
                            "yields no batch: there is nothing to validate on.")
        namespace[VAL_X] = _replay(batches)
        return (VAL_X,)
    if not isinstance(value, (tuple, list)) or len(value) not in (2, 3):
        raise CellError(f"model.fit(validation_data=...) must be (x_val, y_val), (x_val, y_val, "
                        "val_sample_weight), a tf.data.Dataset, a keras.utils.PyDataset, a "
                        "generator or a torch DataLoader, as in Keras (Received: a "
                        f"{type(value).__name__}"
                        f"{f' of {len(value)}' if isinstance(value, (tuple, list)) else ''}).")
    return _put(namespace, (VAL_X, VAL_Y, VAL_SW),
                (*value, None) if len(value) == 2 else tuple(value))


def _put(namespace: dict, names: tuple[str, str, str], values: tuple) -> tuple[str, ...]:
    """Store x, y and (if not None) the weights; the names used."""
    used = names if values[2] is not None else names[:2]
    for name, value in zip(used, values, strict=False):
        namespace[name] = value
    return used


def split_last(fraction: float, *arrays):
    """Keras's `validation_split`: the last `fraction` of the samples (floor of the training
    part), of every array of (possibly nested) `arrays`; None stays None.

    Example:
        >>> (a, b), (va, vb) = split_last(0.25, np.arange(8), None)
        >>> a.tolist(), va.tolist(), b, vb
        ([0, 1, 2, 3, 4, 5], [6, 7], None, None)
    """
    n = num_rows(next(a for a in arrays if a is not None))
    at = int(math.floor(n * (1.0 - fraction)))
    if at == 0 or at == n:
        raise CellError(f"model.fit(validation_split={fraction}) leaves no training or no "
                        f"validation sample out of {n}. Use more data or another fraction.")
    train = tuple(take(a, slice(0, at)) for a in arrays)
    held = tuple(take(a, slice(at, n)) for a in arrays)
    return train, held


def class_weights(y, class_weight: dict) -> np.ndarray:
    """Per-sample weights from `class_weight`, as Keras computes them: the class of a sample is
    its label (one-hot labels: their argmax), rounded; classes not named weigh 1.

    Example:
        >>> class_weights(np.array([0, 1, 1, 2]), {1: 5.0}).tolist()
        [1.0, 5.0, 5.0, 1.0]
        >>> class_weights(np.eye(3)[[2, 0]], {2: 0.5}).tolist()
        [0.5, 1.0]
    """
    labels = np.asarray(y)
    if labels.ndim > 1:
        labels = (np.argmax(labels, axis=-1) if labels.shape[-1] != 1
                  else np.squeeze(labels, axis=-1))
    labels = np.round(labels).astype(np.int64)
    weights = np.ones(len(labels), dtype=np.float32)
    for cls, weight in class_weight.items():
        weights[labels == int(cls)] = weight
    return weights

