"""What a `%%distribute` cell provides: its model, its arrays, the names it defines.

Runs in the kernel, after the cell has run there, so a mistake is reported before any engine
is touched. The cell is parsed (never `eval`ed) to learn which names it assigns: arrays it
reads but does not define (parameters, arrays, helper functions from earlier cells) are sent
to the engines with the run; modules are not (import them in the cell).
"""

from __future__ import annotations

import ast
import builtins
import re
import types
from dataclasses import dataclass, field

import numpy as np

from nbdist.config import Mode, TrainConfig
from nbdist.errors import (
    AmbiguousModelError,
    CellError,
    DataError,
    ModelNotCompiledError,
    ModelNotFoundError,
)

DEFAULT_VALIDATION = ("x_test", "y_test")


def assigned_names(source: str) -> set[str]:
    """Names bound at the cell's top level (assignments, imports, defs, for/with targets).

    Example:
        >>> sorted(assigned_names("import keras\\n(a, b), c = f()\\ndef g(): z = 1"))
        ['a', 'b', 'c', 'g', 'keras']
    """
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise CellError(f"The cell is not valid Python: {exc}. Fix the syntax and run it again.") from None
    names: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            return  # their bodies are another scope
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            return
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return names


def read_names(source: str) -> set[str]:
    """Every name the cell reads anywhere (a superset of what it needs from outside)."""
    return {n.id for n in ast.walk(ast.parse(source))
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def outside_values(source: str, namespace: dict, defined: set[str]) -> dict:
    """Values the cell reads from the notebook but does not define itself."""
    wanted = read_names(source) - defined - set(dir(builtins))
    return {n: namespace[n] for n in sorted(wanted)
            if n in namespace and not n.startswith("_") and n not in ("In", "Out")
            and not isinstance(namespace[n], types.ModuleType)}


@dataclass
class CellContents:
    """The model and data training will use, by name, as found in the kernel."""

    model_name: str
    model: object
    data: tuple[str, ...]  # arrays: (inputs, labels); one name: a tf.data.Dataset or generator
    validation: tuple[str, ...] | None
    num_samples: int
    pushed: dict  # name -> value: read by the cell, defined by an earlier cell
    arrays: tuple | None = None  # (x, y) in this kernel; None when the data is streamed
    validation_arrays: tuple | None = None
    streamed: bool = False  # the dataset is larger than --in-memory-limit: workers read shards
    notes: list[str] = field(default_factory=list)  # what nbdist chose (run.events)
    warnings: list[str] = field(default_factory=list)  # how it trains unlike the cell (run.warnings)


def inspect_cell(source: str, namespace: dict, config: TrainConfig) -> CellContents:
    """Find the model and data the run needs, or raise a CellError saying what to fix."""
    defined = assigned_names(source)
    notes: list[str] = []
    model_name = config.model or _the_model(namespace, defined, notes)
    model = namespace.get(model_name)
    if model is None or not _is_keras_model(model):
        raise ModelNotFoundError(
            f"--model {model_name} names no keras.Model in the notebook (Received: "
            f"{type(model).__name__ if model is not None else 'nothing'}). "
            "Pass the name of the variable that holds your model."
        )
    if getattr(model, "optimizer", None) is None or not getattr(model, "compiled", False):
        raise ModelNotCompiledError(
            f"The model {model_name!r} is not compiled, so there is no optimizer or loss to train "
            f"with. Add e.g. {model_name}.compile(optimizer=keras.optimizers.SGD(0.05), "
            "loss='sparse_categorical_crossentropy', metrics=['accuracy']) to the cell."
        )
    _check_shippable(namespace, config, defined)
    train = _training_data(namespace, config, model)
    _check_fit(model, *train.head, config.data, whole=(train.x, train.y) if train.x is not None else None)
    warnings: list[str] = []
    if train.streamed:
        from nbdist.engine.data import streaming_note

        warnings.append(streaming_note(config.data[0], train.num_samples, config.in_memory_limit))
    validation, validation_arrays = _validation(namespace, config, model)
    pushed = outside_values(source, namespace, defined)
    pushed.update({n: namespace[n] for n in (*config.data, *(validation or ())) if n not in defined})
    return CellContents(model_name, model, config.data, validation, train.num_samples, pushed,
                        arrays=None if train.streamed else (train.x, train.y),
                        validation_arrays=validation_arrays, streamed=train.streamed, notes=notes,
                        warnings=warnings)


def _training_data(namespace: dict, config: TrainConfig, model):
    """The training data as `nbdist.engine.data.Loaded`: arrays checked, a dataset materialised or
    (beyond --in-memory-limit) counted and left to stream."""
    from nbdist.engine.data import Loaded

    if len(config.data) == 2:
        x, y = _arrays(namespace, config.data, "--data")
        if len(x) != len(y):
            raise DataError(
                f"{config.data[0]} has {len(x)} samples but {config.data[1]} has {len(y)}. "
                "Inputs and labels must have the same length."
            )
        if len(x) == 0:
            raise DataError(f"{config.data[0]} is empty: there is nothing to train on.")
        return Loaded(x, y, len(x), head=(x[:2], y[:2]))
    return _dataset(namespace, config.data[0], "--data", model, config.in_memory_limit)


def _dataset(namespace: dict, name: str, flag: str, model, limit: int | None):
    from nbdist.engine.data import kind_of, load

    if name not in namespace:
        raise DataError(f"{flag} names {name}, which the notebook does not define. Define it in the "
                        f"cell, or pass the names of your arrays: {flag} X,Y.")
    value = namespace[name]
    if kind_of(value) not in ("dataset", "generator"):
        raise DataError(
            f"{flag} {name} is a {type(value).__name__}, expected a tf.data.Dataset or a generator "
            f"function yielding (inputs, labels). For arrays pass two names: {flag} X,Y.")
    loaded = load(value, name, flag, model, limit)
    for what, a in zip(("inputs", "labels"), loaded.head, strict=True):
        if a.dtype.kind not in "biuf":
            raise DataError(f"{flag} {name} yields {what} of dtype {a.dtype}, expected numbers. Map "
                            f"them to numbers, e.g. {name}.map(lambda x, y: (tf.cast(x, 'float32'), y)).")
    return loaded


def _check_shippable(namespace: dict, config: TrainConfig, defined: set[str]) -> None:
    """A tf.data.Dataset cannot travel to the engines: it must be built by the cell there."""
    from nbdist.engine.data import kind_of

    if config.mode not in (Mode.ASYNC, Mode.SYNC):
        return
    for name in (*config.data, *(config.validation or ())):
        if name not in defined and kind_of(namespace.get(name)) == "dataset":
            raise DataError(
                f"{name} is a tf.data.Dataset from another cell; a dataset cannot be sent to the "
                f"engines. Build {name} inside the %%distribute cell (or pass arrays).")


def _check_fit(model, x: np.ndarray, y: np.ndarray, names: tuple[str, ...], whole: tuple | None = None) -> None:
    """The model's loss on the first two samples `x`, `y`, computed here, so wrong shapes or
    dtypes between the data and the model are reported in the kernel, with the shapes of the
    user's data (`whole`, when it is in memory), instead of as a TensorFlow error inside every
    engine."""
    if len(names) == 1:
        names = (f"{names[0]}'s inputs", "its labels")
    wx, wy = whole if whole is not None else (x, y)
    what = (f"{names[0]} (shape {wx.shape}, dtype {wx.dtype}) and {names[1]} (shape {wy.shape}, "
            f"dtype {wy.dtype})")
    for n, a in zip(names, (x, y), strict=True):
        if a.dtype.kind not in "biuf":
            raise DataError(f"{what}: {n} holds {a.dtype} values, expected numbers. Convert it, e.g. "
                            f"{n} = {n}.astype('float32'), or class names to integer ids with "
                            f"{n} = np.unique({n}, return_inverse=True)[1].")
    try:
        from nbdist.engine.flatmodel import ensure_built

        ensure_built(model, x[:2])  # as every worker does before comparing variables
        y_pred = model(x[:2], training=False)
        loss = float(model.compute_loss(x=x[:2], y=y[:2], y_pred=y_pred, training=False))
    except Exception as exc:  # noqa: BLE001 - Keras/TensorFlow raise many kinds here
        detail = _first_line(str(exc)) or type(exc).__name__
        expects = getattr(model, "input_shape", None)
        raise DataError(
            f"{what} do not fit the model{f' (it expects inputs of shape {expects})' if expects else ''}: "
            f"{type(exc).__name__}: {detail}. Reshape or convert the arrays, or change the model's "
            "Input and output layers to match them."
        ) from None
    if not np.isfinite(loss):
        raise DataError(f"The loss on the first samples of {what} is {loss} before any training. "
                        "Check the labels match the loss (e.g. class ids within the output size) and "
                        "normalise the inputs.")


def _first_line(message: str) -> str:
    """The line of a Keras error that says what is wrong (not its preamble or arguments)."""
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line).strip() for line in message.splitlines()]
    lines = [line for line in lines if line and not line.startswith(("Exception encountered", "Arguments"))]
    return lines[0][:300] if lines else ""


def _is_keras_model(obj: object) -> bool:
    cls = type(obj)
    return any(c.__name__ == "Model" and c.__module__.startswith("keras") for c in cls.__mro__)


def _the_model(namespace: dict, defined: set[str], notes: list[str]) -> str:
    """The one model the cell defines, or the outermost one: the model no other model of the
    cell contains (a frozen `base` inside `model`). Two unrelated models need --model."""
    found = sorted(n for n in defined if _is_keras_model(namespace.get(n)))
    if not found:
        raise ModelNotFoundError(
            "The cell defines no keras.Model. Build and compile one in the cell, e.g. "
            "model = keras.Sequential([...]); model.compile(...), or name it with --model."
        )
    inner = {n: sorted(m for m in found if m != n and _contains(namespace[n], namespace[m])) for n in found}
    outermost = [n for n in found if not any(n in inner[o] for o in found)]
    if len(outermost) > 1:
        raise AmbiguousModelError(
            f"The cell defines several models: {', '.join(found)}, and none contains "
            f"{'the others' if len(outermost) == len(found) else ', '.join(outermost)}, so it is not "
            f"clear which to train. Say which one with --model (e.g. --model {outermost[0]})."
        )
    name = outermost[0]
    if inner[name]:
        notes.append(f"Training `{name}` (it contains {', '.join(f'`{m}`' for m in inner[name])}); "
                     "pass --model to choose another.")
    return name


def contained_layers(model) -> list:
    """Every layer inside `model`, at any depth (a model used as a layer, and its layers)."""
    found, todo = [], list(getattr(model, "layers", []) or [])
    while todo:
        layer = todo.pop()
        found.append(layer)
        todo.extend(getattr(layer, "layers", []) or [])
    return found


def _contains(outer, inner) -> bool:
    return outer is not inner and any(layer is inner for layer in contained_layers(outer))


def _arrays(namespace: dict, names: tuple[str, str], flag: str) -> tuple:
    missing = [n for n in names if n not in namespace]
    if missing:
        raise DataError(
            f"{flag} names {', '.join(missing)}, which the notebook does not define. "
            f"Define them in the cell, or pass the names of your arrays: {flag} X,Y."
        )
    arrays = []
    for n in names:
        value = namespace[n]
        if not hasattr(value, "__len__") or not hasattr(value, "shape"):
            raise DataError(
                f"{n} is a {type(value).__name__}, expected a NumPy array. "
                f"Convert it with np.asarray({n}), or pass a tf.data.Dataset or generator "
                f"function as one name: {flag} NAME."
            )
        array = np.asarray(value)
        if array.dtype.kind == "f" and not np.isfinite(array).all():
            bad = np.flatnonzero(~np.isfinite(array.reshape(len(array), -1)).all(axis=1))
            raise DataError(
                f"{n} contains NaN or inf in {bad.size} sample(s) (first at index {bad[0]}). "
                f"Clean or drop them before training, e.g. {n} = np.nan_to_num({n})."
            )
        arrays.append(array)
    return tuple(arrays)


def _validation(namespace: dict, config: TrainConfig, model) -> tuple[tuple[str, ...] | None, tuple | None]:
    """The validation names and arrays (a dataset is always held in memory; beyond
    --in-memory-limit it is refused)."""
    if config.no_validation:
        return None, None
    if config.validation is None:
        if not all(n in namespace for n in DEFAULT_VALIDATION):
            return None, None
        names = DEFAULT_VALIDATION
    else:
        names = config.validation
    if len(names) == 1:
        loaded = _dataset(namespace, names[0], "--validation", model, config.in_memory_limit)
        if loaded.streamed:
            from nbdist.engine.data import format_size

            raise DataError(
                f"--validation {names[0]} holds more than --in-memory-limit "
                f"{format_size(config.in_memory_limit)} of decoded tensors; validation data is "
                f"held in memory. Validate on a part of it ({names[0]}.take(n)), or raise "
                "--in-memory-limit.")
        return names, (loaded.x, loaded.y)
    xv, yv = _arrays(namespace, names, "--validation")
    if len(xv) != len(yv):
        raise DataError(f"{names[0]} has {len(xv)} samples but {names[1]} has {len(yv)}.")
    return names, (xv, yv)
