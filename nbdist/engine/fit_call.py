"""A cell's own `model.fit(...)` call: the run's specification, never a training run.

Responsible for:
- catching the call wherever the cell makes it (`history = model.fit(...)`, inside a `with`
  block or a helper function): while a `%%distribute` cell runs, in the kernel and on every
  engine, `keras.Model.fit` is replaced (`fit_intercepted`), so Keras's own training loop never
  runs. `train_on_batch` is refused the same way: nothing trains single-machine;
- binding the call's arguments exactly as Keras would (`FitCall.bind`), and refusing, with a
  clear error, the ones nbdist cannot honour;
- handing the call to whoever waits for it: in the kernel, the distributed run, which returns
  the Keras `History` the call returns, so the statements after it run on the trained model;
  on an engine, the cell stops there (`FitReached`) and the worker trains on what the call named.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from nbdist.engine.keras_backend import when_imported
from nbdist.errors import CellError

# Keras 3's `Model.fit` parameters, in order (positional calls bind in this order).
FIT_PARAMETERS = ("x", "y", "batch_size", "epochs", "verbose", "callbacks", "validation_split",
                  "validation_data", "shuffle", "class_weight", "sample_weight", "initial_epoch",
                  "steps_per_epoch", "validation_steps", "validation_batch_size", "validation_freq")
FIT_DEFAULTS = {"x": None, "y": None, "batch_size": None, "epochs": 1, "verbose": "auto",
                "callbacks": None, "validation_split": 0.0, "validation_data": None,
                "shuffle": True, "class_weight": None, "sample_weight": None, "initial_epoch": 0,
                "steps_per_epoch": None, "validation_steps": None, "validation_batch_size": None,
                "validation_freq": 1}
KERAS_DEFAULT_BATCH = 32  # what `fit` uses when the call gives no batch_size


# a signal, not an error: `except Exception` must not catch it
class FitReached(BaseException):
    """Raised on an engine when the cell reaches its `fit` call: the cell stops there."""


@dataclass
class FitCall:
    """The arguments of one `model.fit(...)` call, bound as Keras binds them.

    Example:
        >>> call = FitCall.bind("m", ("X", "Y"), {"epochs": 3, "validation_split": 0.1})
        >>> call.x, call.epochs, call.batch_size, sorted(call.given)
        ('X', 3, None, ['epochs', 'validation_split', 'x', 'y'])
    """

    model: object
    x: object = None
    y: object = None
    batch_size: int | None = None
    epochs: int = 1
    verbose: object = "auto"
    callbacks: object = None
    validation_split: float = 0.0
    validation_data: object = None
    shuffle: object = True
    class_weight: dict | None = None
    sample_weight: object = None
    initial_epoch: int = 0
    steps_per_epoch: int | None = None
    validation_steps: int | None = None
    validation_batch_size: int | None = None
    validation_freq: object = 1
    given: frozenset[str] = field(default_factory=frozenset)  # the arguments the cell passed

    @classmethod
    def bind(cls, model: object, args: tuple, kwargs: dict) -> FitCall:
        """Bind `model.fit(*args, **kwargs)`; a call Keras would reject is refused the same way."""
        if len(args) > len(FIT_PARAMETERS):
            raise CellError(f"model.fit() takes at most {len(FIT_PARAMETERS)} positional arguments "
                            f"(Received: {len(args)}). Pass them by name, as Keras's docs do.")
        bound = dict(zip(FIT_PARAMETERS, args, strict=False))
        twice = sorted(set(bound) & set(kwargs))
        unknown = sorted(set(kwargs) - set(FIT_PARAMETERS))
        if twice or unknown:
            what = (f"got {', '.join(twice)} twice" if twice
                    else f"has no argument {', '.join(unknown)}")
            raise CellError(f"model.fit() {what} (Received: fit({_shown_call(args, kwargs)})). "
                            f"Keras's fit takes: {', '.join(FIT_PARAMETERS)}. Fix the call in "
                            "the cell.")
        bound.update(kwargs)
        return cls(model=model, **{**FIT_DEFAULTS, **bound}, given=frozenset(bound))

    @property
    def batch(self) -> int:
        """The batch size the call trains with (Keras's default 32 when it gives none)."""
        return self.batch_size if self.batch_size is not None else KERAS_DEFAULT_BATCH

    def settings(self) -> dict:
        """The run options this call gives (`nbdist.train` names): epochs and batch size."""
        settings = {"epochs": self.epochs}
        if self.batch_size is not None:
            settings["batch_size"] = self.batch_size
        return settings

    def check(self) -> None:
        """Refuse what nbdist cannot honour, before anything trains: each message names the
        argument, says why, and what to do instead."""
        for name in ("epochs", "initial_epoch"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise CellError(f"model.fit({name}=...) must be a whole number >= 0 (Received: "
                                f"{value!r}).")
        if self.initial_epoch >= self.epochs:
            raise CellError(f"model.fit(initial_epoch={self.initial_epoch}, epochs={self.epochs}) "
                            "trains no epoch: `epochs` is the index of the last epoch plus one, as "
                            "in Keras. Use epochs > initial_epoch, e.g. "
                            f"epochs={self.initial_epoch + 1}.")
        if self.batch_size is not None and (isinstance(self.batch_size, bool)
                                            or not isinstance(self.batch_size, int)
                                            or self.batch_size < 1):
            raise CellError(f"model.fit(batch_size=...) must be a whole number >= 1 (Received: "
                            f"{self.batch_size!r}).")
        split = self.validation_split
        if isinstance(split, bool) or not isinstance(split, (int, float)) or not (0 <= split < 1) \
                or not math.isfinite(split):
            raise CellError(f"model.fit(validation_split=...) must be a fraction in [0, 1) "
                            f"(Received: {split!r}). Example: validation_split=0.1.")
        if self.shuffle not in (True, False):
            raise CellError(
                f"model.fit(shuffle={self.shuffle!r}) is not supported: nbdist shuffles each epoch "
                "(shuffle=True) or keeps the order (shuffle=False). 'batch' shuffling is for HDF5 "
                "files in Keras 2. Pass shuffle=True or False.")
        if self.class_weight is not None and self.sample_weight is not None:
            raise CellError(
                "model.fit() got both class_weight and sample_weight; Keras refuses that too. "
                "Fold the class weights into the sample weights, or drop one.")
        if self.class_weight is not None and not isinstance(self.class_weight, dict):
            raise CellError(f"model.fit(class_weight=...) must be a dict from class index to "
                            f"weight (Received: {type(self.class_weight).__name__}). Example: "
                            "class_weight={0: 1.0, 1: 5.0}.")
        for name in ("steps_per_epoch", "validation_steps", "validation_batch_size"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 1):
                raise CellError(f"model.fit({name}=...) must be a whole number >= 1 or None "
                                f"(Received: {value!r}).")
        freq = self.validation_freq
        if not (isinstance(freq, int) and not isinstance(freq, bool) and freq >= 1) and not (
                isinstance(freq, (list, tuple, set)) and all(isinstance(e, int) for e in freq)):
            raise CellError(f"model.fit(validation_freq=...) must be a whole number >= 1 or a list "
                            f"of epochs (Received: {freq!r}), as in Keras.")

    @property
    def saves_whole_model(self) -> bool:
        """A `ModelCheckpoint` among the callbacks saves the whole model, its optimizer's state
        with it (`save_weights_only=False`): the run then gives the kernel's optimizer that
        state at each epoch's end (`nbdist.fit.optimizer_state`)."""
        import keras  # Keras: after the cell picks its backend

        return any(isinstance(cb, keras.callbacks.ModelCheckpoint) and not cb.save_weights_only
                   for cb in self.callbacks or [])

    def should_validate(self, epoch: int) -> bool:
        """Whether epoch `epoch` (0-based) is validated, as Keras's `validation_freq` says."""
        freq = self.validation_freq
        if isinstance(freq, int):
            return (epoch + 1) % freq == 0
        return (epoch + 1) in set(freq)


def _shown_call(args: tuple, kwargs: dict) -> str:
    parts = [_shown(a) for a in args] + [f"{k}={_shown(v)}" for k, v in kwargs.items()]
    return ", ".join(parts)


def _shown(value: object) -> str:
    shape = getattr(value, "shape", None)
    if shape is not None:
        return f"<{type(value).__name__} {tuple(shape)}>"
    text = repr(value)
    return text if len(text) <= 40 else f"<{type(value).__name__}>"


@contextlib.contextmanager
def fit_intercepted(on_fit: Callable[[FitCall], object]) -> Iterator[list[FitCall]]:
    """While the block runs, `model.fit(...)` calls `on_fit(FitCall)` and returns what it
    returns, and `model.train_on_batch` is refused: Keras's own training loop never runs.
    Yields the list of calls seen. Keras is not imported here: a cell that imports it first
    has it patched as soon as it is imported (`nbdist.engine.keras_backend.when_imported`),
    so the cell's own KERAS_BACKEND line still chooses the backend."""
    calls: list[FitCall] = []
    saved: dict = {}

    def fit(model, *args, **kwargs):
        call = FitCall.bind(model, args, kwargs)
        calls.append(call)
        return on_fit(call)

    def train_on_batch(model, *args, **kwargs):
        raise CellError(
            "The cell calls model.train_on_batch(), a training loop of its own, which nbdist "
            "cannot distribute (it would train single-machine on every engine). Call "
            "model.fit(...) once instead, or run the cell without %%distribute.")

    def patch(keras) -> None:
        model_class = saved["class"] = keras.Model
        saved["methods"] = {name: model_class.__dict__.get(name)
                            for name in ("fit", "train_on_batch")}
        model_class.fit, model_class.train_on_batch = fit, train_on_batch

    try:
        with when_imported(patch):
            yield calls
    finally:
        for name, original in saved.get("methods", {}).items():
            if original is None:
                delattr(saved["class"], name)
            else:
                setattr(saved["class"], name, original)


def stop_at_fit(namespace: dict, key: str,
                earlier: Sequence[dict] = ()) -> Callable[[FitCall], object]:
    """The engines' `on_fit`: keep the call in `namespace[key]` and stop the cell there. A cell
    with several fit calls trains one run per call: the calls before this run's (`earlier`,
    `earlier_fit` of what each returned in the kernel) are answered with their History, without
    training, so the cell's code between them runs as it did in the kernel."""
    answers = list(earlier)

    def on_fit(call: FitCall) -> object:
        if answers:
            return answered_fit(call.model, answers.pop(0))
        namespace[key] = call
        raise FitReached

    return on_fit


def earlier_fit(history) -> dict:
    """What an engine needs to answer one of the cell's earlier fit calls as the kernel's run
    did: its History's epochs, logs and params, as plain values (they travel with the run)."""
    return {"epoch": [int(e) for e in history.epoch],
            "history": {k: [float(v) for v in values] for k, values in history.history.items()},
            "params": dict(history.params or {})}


def answered_fit(model, earlier: dict):
    """A Keras `History` holding `earlier` (`earlier_fit`), set on `model` as `fit` sets it."""
    import keras  # Keras: after the cell picks its backend

    history = keras.callbacks.History()
    history.set_model(model)
    history.set_params(dict(earlier["params"]))
    history.epoch = list(earlier["epoch"])
    history.history = {k: list(v) for k, v in earlier["history"].items()}
    model.history = history
    return history


# Names under which a fit call's data and model are kept in a namespace (kernel and engines
# alike), so the rest of nbdist finds them by name as it finds `x_train`; how messages show them.
MODEL, X, Y, SW = "_nbdist_model", "_nbdist_x", "_nbdist_y", "_nbdist_sw"
VAL_X, VAL_Y, VAL_SW = "_nbdist_val_x", "_nbdist_val_y", "_nbdist_val_sw"
RESERVED = {
    MODEL: "the model model.fit() was called on",
    X: "model.fit's x",
    Y: "model.fit's y",
    SW: "model.fit's sample weights",
    VAL_X: "the validation inputs",
    VAL_Y: "the validation labels",
    VAL_SW: "the validation sample weights",
}


def shown_name(name: str) -> str:
    """How a message names data or a model: the user's variable, or what the fit call gave."""
    return RESERVED.get(name, name)
