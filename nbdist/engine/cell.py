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

from nbdist.config import TrainConfig
from nbdist.engine.data import (
    ArrayAdapter,
    Loaded,
    data_adapter,
    format_size,
    load,
    num_rows,
    streaming_note,
    take,
)
from nbdist.engine.fit_call import RESERVED, shown_name
from nbdist.engine.flat_layout import ensure_built
from nbdist.errors import (
    AmbiguousModelError,
    CellError,
    DataError,
    ModelNotCompiledError,
    ModelNotFoundError,
)
from nbdist.modes import mode_spec

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
        raise CellError(f"The cell is not valid Python: {exc}. Fix the syntax and run it "
                        "again.") from None
    names: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            return  # their bodies are another scope
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp,
                               ast.GeneratorExp)):
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
    # arrays: (inputs, labels[, weights]); one name: a tf.data.Dataset or generator
    data: tuple[str, ...]
    validation: tuple[str, ...] | None
    num_samples: int
    pushed: dict  # name -> value: read by the cell, defined by an earlier cell
    arrays: tuple | None = None  # (x, y) in this kernel; None when the data is streamed
    validation_arrays: tuple | None = None
    streamed: bool = False  # the dataset is larger than --in-memory-limit: workers read shards
    notes: list[str] = field(default_factory=list)  # what nbdist chose (run.events)
    # how it trains unlike the cell (run.warnings)
    warnings: list[str] = field(default_factory=list)
    batch_hint: int | None = None  # a batched dataset's own batch size (its first batch)


def inspect_cell(source: str, namespace: dict, config: TrainConfig, *,
                 data: tuple[str, ...] | None = None, validation: tuple[str, ...] | None = None,
                 model_name: str | None = None, take_batches: int | None = None) -> CellContents:
    """Find the model and data the run needs, or raise a CellError saying what to fix.

    `data`, `validation` and `model_name` name what the cell's own `model.fit(...)` call gave
    (`nbdist.engine.fit_data`), where no flag overrides it: `data` is (inputs, labels[, sample
    weights]) or one dataset; `validation` () means none. `take_batches`: how many batches of a
    repeating dataset make the training data (`fit(steps_per_epoch=...)`)."""
    defined = assigned_names(source)
    notes: list[str] = []
    model_name = config.model or model_name or _the_model(namespace, defined, notes)
    model = namespace.get(model_name)
    if model is None or not _is_keras_model(model):
        raise ModelNotFoundError(
            f"--model {model_name} names no keras.Model in the notebook (Received: "
            f"{type(model).__name__ if model is not None else 'nothing'}). "
            "Pass the name of the variable that holds your model."
        )
    shown = shown_name(model_name)
    if getattr(model, "optimizer", None) is None or not getattr(model, "compiled", False):
        raise ModelNotCompiledError(
            f"The model {shown!r} is not compiled, so there is no optimizer or loss to train "
            f"with. Add e.g. {shown}.compile(optimizer=keras.optimizers.SGD(0.05), "
            "loss='sparse_categorical_crossentropy', metrics=['accuracy']) to the cell."
        )
    _check_train_step(model, shown)
    data = config.data if data is None else data
    _check_shippable(namespace, config, defined, data, validation)
    train = _training_data(namespace, config, model, data, take_batches)
    _check_fit(model, train.head, data, whole=(train.x, train.y) if train.x is not None else None)
    warnings: list[str] = []
    if train.streamed:
        warnings.append(streaming_note(shown_name(data[0]), train.num_samples,
                                       config.in_memory_limit))
    validation, validation_arrays = _validation(namespace, config, model, validation)
    pushed = outside_values(source, namespace, defined)
    pushed.update({n: namespace[n] for n in (*data, *(validation or ())) if n not in defined
                   and n not in RESERVED})
    if train.streamed:
        arrays = None
    else:
        arrays = ((train.x, train.y) if train.sample_weight is None
                  else (train.x, train.y, train.sample_weight))
    return CellContents(model_name, model, data, validation, train.num_samples, pushed,
                        arrays=arrays, validation_arrays=validation_arrays, streamed=train.streamed,
                        notes=notes, warnings=warnings, batch_hint=train.batch_hint)


def _check_train_step(model, name: str) -> None:
    """A model whose class overrides `train_step` trains differently from what nbdist computes
    (the gradient of `compute_loss`): refuse it rather than train it another way."""
    import keras  # Keras: after the cell picks its backend

    own = type(model).train_step
    if (own is not keras.Model.train_step
            and getattr(own, "__module__", "").split(".")[0] != "keras"):
        raise CellError(
            f"The model {name!r} ({type(model).__name__}) overrides train_step, a training step "
            "of its own, and nbdist computes each step's gradient from compute_loss instead, so it "
            "would train differently from model.fit. Move the custom loss into compute_loss "
            "(nbdist calls it), or run the cell without %%distribute.")


def _training_data(namespace: dict, config: TrainConfig, model, data: tuple[str, ...],
                   take_batches: int | None = None):
    """The training data as `nbdist.engine.data.Loaded`: arrays checked, a dataset materialised or
    (beyond --in-memory-limit) counted and left to stream."""
    if len(data) > 1:
        arrays = _arrays(namespace, data, "--data")
        n = num_rows(arrays[0])
        if n == 0:
            raise DataError(f"{shown_name(data[0])} is empty: there is nothing to train on.")
        return Loaded(arrays[0], arrays[1], n, head=tuple(take(a, slice(0, 2)) for a in arrays),
                      sample_weight=arrays[2] if len(arrays) > 2 else None)
    return _dataset(namespace, data[0], "--data", model, config.in_memory_limit, take_batches)


def _dataset(namespace: dict, name: str, flag: str, model, limit: int | None,
             take_batches: int | None = None):
    import keras  # Keras: after the cell picks its backend

    if name not in namespace:
        raise DataError(f"{flag} names {name}, which the notebook does not define. Define it in "
                        f"the cell, or pass the names of your arrays: {flag} X,Y.")
    value = namespace[name]
    adapter = data_adapter(value)
    if not adapter.streams:
        raise DataError(
            f"{flag} {shown_name(name)} is a {type(value).__name__}, expected a tf.data.Dataset, a "
            "torch DataLoader or a generator function yielding (inputs, labels). For arrays pass "
            f"two names: {flag} X,Y.")
    loaded = load(adapter, shown_name(name), flag, model, limit, take_batches=take_batches)
    for what, part in zip(("inputs", "labels", "sample weights"), loaded.head, strict=False):
        for a in keras.tree.flatten(part):
            if a.dtype.kind not in "biuf":
                raise DataError(f"{flag} {shown_name(name)} yields {what} of dtype {a.dtype}, "
                                "expected numbers. Map them to numbers, e.g. "
                                "ds.map(lambda x, y: (tf.cast(x, 'float32'), y)).")
    return loaded


def _check_shippable(namespace: dict, config: TrainConfig, defined: set[str],
                     data: tuple[str, ...], validation: tuple[str, ...] | None) -> None:
    """A tf.data.Dataset cannot travel to the engines: it must be built by the cell there."""
    if not mode_spec(config.mode).cell_on_engines:
        return
    for name in (*data, *(config.validation or validation or ())):
        if name in defined or name in RESERVED:
            continue
        adapter = data_adapter(namespace.get(name))
        if not adapter.ships:
            raise DataError(
                f"{name} is a {adapter.name} from another cell; a dataset cannot be sent to the "
                f"engines. Build {name} inside the %%distribute cell (or pass arrays).")


def _check_fit(model, head: tuple, names: tuple[str, ...], whole: tuple | None = None) -> None:
    """The model's loss on the first two samples (`head`: x, y[, sample weights]), computed
    here, so wrong shapes or dtypes between the data and the model are reported in the kernel,
    with the shapes of the user's data (`whole`, when it is in memory), instead of as a
    TensorFlow error inside every engine. Builds the compiled metrics' variables too."""
    import keras  # Keras: after the cell picks its backend

    names = tuple(shown_name(n) for n in names)
    if len(names) == 1:
        names = (f"{names[0]}'s inputs", "its labels")
    described = [f"{n} ({_describe(a)})"
                 for n, a in zip(names, whole if whole is not None else head[:2], strict=False)]
    what = " and ".join(described)
    for n, part in zip(names, head[:2], strict=False):
        for a in keras.tree.flatten(part):
            if a.dtype.kind not in "biuf":
                raise DataError(f"{what}: {n} holds {a.dtype} values, expected numbers. Convert "
                                "it, e.g. with .astype('float32'), or class names to integer "
                                "ids with np.unique(labels, return_inverse=True)[1].")
    x, y = head[0], head[1]
    sw = head[2] if len(head) > 2 else None
    try:
        ensure_built(model, x, y, sw)  # as every worker does before comparing variables
        y_pred = model(x, training=False)
        loss = float(keras.ops.convert_to_numpy(
            model.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sw, training=False)))
    except Exception as exc:  # noqa: BLE001 - Keras/TensorFlow raise many kinds here
        detail = _first_line(str(exc)) or type(exc).__name__
        expects = getattr(model, "input_shape", None)
        raise DataError(
            f"{what} do not fit the model"
            f"{f' (it expects inputs of shape {expects})' if expects else ''}: "
            f"{type(exc).__name__}: {detail}. Reshape or convert the arrays, or change the model's "
            "Input and output layers to match them."
        ) from None
    if not np.isfinite(loss):
        raise DataError(f"The loss on the first samples of {what} is {loss} before any training. "
                        "Check the labels match the loss (e.g. class ids within the output size) "
                        "and normalise the inputs.")


def _describe(data) -> str:
    """'shape (60000, 784), dtype float32', or one such per input of a list or dict."""
    import keras  # Keras: after the cell picks its backend

    if isinstance(data, (list, tuple, dict)):
        leaves = keras.tree.flatten(data)
        return f"{type(data).__name__} of {len(leaves)}: " + "; ".join(_describe(a) for a in leaves)
    return f"shape {tuple(data.shape)}, dtype {data.dtype}"


def _first_line(message: str) -> str:
    """The line of a Keras error that says what is wrong (not its preamble or arguments)."""
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line).strip() for line in message.splitlines()]
    lines = [line for line in lines
             if line and not line.startswith(("Exception encountered", "Arguments"))]
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
    inner = {n: sorted(m for m in found if m != n and _contains(namespace[n], namespace[m]))
             for n in found}
    outermost = [n for n in found if not any(n in inner[o] for o in found)]
    if len(outermost) > 1:
        raise AmbiguousModelError(
            f"The cell defines several models: {', '.join(found)}, and none contains "
            f"{'the others' if len(outermost) == len(found) else ', '.join(outermost)}, so it is "
            f"not clear which to train. Say which one with --model (e.g. --model {outermost[0]})."
        )
    name = outermost[0]
    if inner[name]:
        notes.append(f"Training `{name}` (it contains "
                     f"{', '.join(f'`{m}`' for m in inner[name])}); "
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


def _arrays(namespace: dict, names: tuple[str, ...], flag: str) -> tuple:
    """(inputs, labels[, sample weights]) by name: arrays, or lists or dicts of arrays (several
    inputs or outputs), checked for equal lengths and NaN/inf."""
    import keras  # Keras: after the cell picks its backend

    missing = [n for n in names if n not in namespace]
    if missing:
        raise DataError(
            f"{flag} names {', '.join(missing)}, which the notebook does not define. "
            f"Define them in the cell, or pass the names of your arrays: {flag} X,Y."
        )
    arrays, lengths = [], {}
    for n in names:
        shown = shown_name(n)
        value = namespace[n]
        nested = isinstance(value, (list, tuple, dict))
        leaves = keras.tree.flatten(value) if nested else [value]
        bad = [type(v).__name__ for v in leaves if not ArrayAdapter.handles(v)]
        if bad or not leaves:
            holding = f" holding {bad[0]}" if bad and nested else ""
            raise DataError(
                f"{shown} is a {type(value).__name__}{holding}, expected a NumPy array, or a list "
                "or dict of arrays (one per input or output of the model). Convert each with "
                "np.asarray(...), or pass a tf.data.Dataset.")
        converted = keras.tree.map_structure(np.asarray, value) if nested else np.asarray(value)
        for leaf in keras.tree.flatten(converted) if nested else [converted]:
            lengths.setdefault(len(leaf), shown)
            if leaf.dtype.kind == "f" and not np.isfinite(leaf).all():
                rows = np.flatnonzero(~np.isfinite(leaf.reshape(len(leaf), -1)).all(axis=1))
                raise DataError(
                    f"{shown} contains NaN or inf in {rows.size} sample(s) (first at index "
                    f"{rows[0]}). Clean or drop them before training, e.g. np.nan_to_num(...).")
        arrays.append(converted)
    if len(lengths) > 1:
        (n1, first), (n2, second) = list(lengths.items())[:2]
        raise DataError(f"{first} has {n1} samples but {second} has {n2}. Inputs, labels and "
                        "sample weights must have the same length (one row per sample).")
    return tuple(arrays)


def _validation(namespace: dict, config: TrainConfig, model, names: tuple[str, ...] | None = None
                ) -> tuple[tuple[str, ...] | None, tuple | None]:
    """The validation names and arrays (a dataset is always held in memory; beyond
    --in-memory-limit it is refused). `names`: what the fit call gave (() for none), unless
    --validation or --no-validation says otherwise."""
    if config.no_validation:
        return None, None
    if config.validation is not None:
        names = config.validation
    elif names is None:
        if not all(n in namespace for n in DEFAULT_VALIDATION):
            return None, None
        names = DEFAULT_VALIDATION
    if not names:
        return None, None
    if len(names) == 1:
        loaded = _dataset(namespace, names[0], "--validation", model, config.in_memory_limit)
        if loaded.streamed:
            raise DataError(
                f"--validation {names[0]} holds more than --in-memory-limit "
                f"{format_size(config.in_memory_limit)} of decoded tensors; validation data is "
                f"held in memory. Validate on a part of it ({names[0]}.take(n)), or raise "
                "--in-memory-limit.")
        arrays = ((loaded.x, loaded.y) if loaded.sample_weight is None
                  else (loaded.x, loaded.y, loaded.sample_weight))
        return names, arrays
    return names, _arrays(namespace, names, "--validation")
