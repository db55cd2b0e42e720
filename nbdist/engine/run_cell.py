"""Running the user's cell on an engine: the one way every mode does it.

An async worker, a sync rank and the local worker thread all start the same way: Keras on the
kernel's backend (`nbdist.engine.keras_backend`), the backend's threads and the engine's GPU (by
local rank) set before it runs anything, run
the cell in the engine's interactive namespace (as `%px` would) with the values the kernel
sent, find the model and the data by the names the kernel found, and build the model's
variables as the kernel did. `portable` is the kernel's half: values from the notebook's
`__main__` travel by value, and `unpack` restores them on the engine.

`spec` is a worker spec (`nbdist.modes.common.worker.WorkerSpec` or a sync rank's): this
module reads only its cell fields (source, pushed, model_name, data, validation, stream,
preloaded, seed, num_samples, num_workers, worker, engine, threads, local_rank, keras_backend).
"""

from __future__ import annotations

import os
import pickle
import types
from dataclasses import dataclass

import cloudpickle
import numpy as np

from nbdist.engine.cell_traceback import cell_errors_shown, compile_cell, engine_tag
from nbdist.engine.data import (
    ArraySource,
    ShardStream,
    as_float32,
    load,
    map_nested,
    validation_arrays,
)
from nbdist.engine.fit_call import FitReached, fit_intercepted, stop_at_fit
from nbdist.engine.fit_data import place
from nbdist.engine.flat_layout import ensure_built
from nbdist.engine.keras_backend import check_engine, configure_engine, use_on_engine
from nbdist.errors import CellError


@dataclass(frozen=True)
class ByValue:
    """A notebook function or class, pickled by value (see `portable`)."""

    data: bytes


def portable(values: dict) -> dict:
    """Functions and classes defined in the notebook live in its `__main__`, which plain pickle
    only names, so an engine could not load them: pickle those by value (cloudpickle)."""
    return {k: ByValue(cloudpickle.dumps(v)) if isinstance(v, types.FunctionType | type)
            and v.__module__ == "__main__" else v for k, v in values.items()}


def unpack(values: dict) -> dict:
    """The inverse of `portable` (on the engine)."""
    return {k: pickle.loads(v.data) if isinstance(v, ByValue) else v  # noqa: S301 - from our own kernel, via ipyparallel
            for k, v in values.items()}


def engine_namespace() -> dict:
    """The engine's interactive namespace (what `%px` cells see), or a fresh dict."""
    try:
        from IPython import get_ipython  # IPython: only in a shell

        shell = get_ipython()
    except ImportError:
        shell = None
    return shell.user_ns if shell is not None else {}


def execute_cell(source: str | None, pushed: dict, threads: int | None, local_rank: int = 0,
                 namespace: dict | None = None, *, backend: str = "tensorflow",
                 engine: int | None = None) -> dict:
    """Ready this engine (Keras on the kernel's `backend`, its threads, its own GPU) and run the
    user's cell in its namespace with the values it reads from earlier cells (`pushed`);
    returns the namespace. Every mode runs the cell on an engine through here. `source` None:
    the namespace already holds the cell's results (--mode local, in-process tests)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    use_on_engine(backend, engine)
    configure_engine(backend, threads, local_rank)
    ns = engine_namespace() if namespace is None else namespace
    if source is not None:
        ns.update(unpack(pushed))
        run_until_fit(source, ns)
        check_engine(backend, engine)
    return ns


def run_until_fit(source: str, ns: dict):
    """Run the cell in `ns` up to its `model.fit(...)` call, if it makes one (nothing trains:
    `nbdist.engine.fit_call`; with several, up to this run's, the earlier ones answered as
    `ns[EARLIER_FITS]` says), and put what the call names into `ns` (`fit_data.place`).
    Returns the placed `FitData`, or None for a cell without a fit call. On an engine, an
    error of the cell shows the cell's own lines, tagged with the engine and its host
    (`nbdist.engine.cell_traceback`)."""
    earlier = ns.pop(EARLIER_FITS, ())  # the cell's fit calls before this run's
    with fit_intercepted(stop_at_fit(ns, FIT_KEY, earlier)), cell_errors_shown(engine_tag()):
        try:
            exec(compile_cell(source), ns)  # noqa: S102 - the user's own cell
        except FitReached:
            pass  # the statements after the call run in the kernel only, after training
    call = ns.pop(FIT_KEY, None)
    if call is None:
        return None

    return place(call, ns)


FIT_KEY = "_nbdist_fit_call"  # where an engine keeps the cell's fit call until it is placed
# what the cell's earlier fit calls returned in the kernel (`earlier_fit`), sent with a run of a
# later one: the engines answer those calls with it and stop at the run's own
EARLIER_FITS = "_nbdist_earlier_fits"


def run_cell(spec, namespace: dict | None = None) -> tuple:
    """Ready this engine, run the cell (unless `spec.source` is None: the namespace already
    holds its results, as in --mode local) and return (model, training data as a batch
    source, validation arrays or None), the model built."""
    ns = execute_cell(spec.source, spec.pushed, spec.threads, spec.local_rank, namespace,
                      backend=spec.keras_backend, engine=spec.engine)
    model, data, validation = find_training(ns, spec)

    ensure_built(model, *data.head(2))  # as the kernel did: variables, compiled loss and metrics
    return model, data, validation


def find_training(ns: dict, spec) -> tuple:
    """The model, the training data as a batch source, the validation arrays (or None)."""
    missing = [n for n in (spec.model_name, *spec.data, *(spec.validation or ())) if n not in ns]
    if missing:
        raise CellError(
            f"On engine {spec.engine} the cell did not define {', '.join(missing)}. "
            "Define them inside the %%distribute cell (engines do not see other cells)."
        )
    model = ns[spec.model_name]
    if spec.stream:
        loaded = load(ns[spec.data[0]], spec.data[0], "--data", model, limit=0, count=False,
                      take_batches=spec.take_batches)
        data = ShardStream(loaded.dataset, spec.num_workers, spec.worker)
    else:
        if spec.preloaded is not None:
            arrays = spec.preloaded
        elif len(spec.data) == 1:  # a dataset that fits in memory: read once, on this engine
            loaded = load(ns[spec.data[0]], spec.data[0], "--data", model, limit=None,
                          take_batches=spec.take_batches)
            arrays = (loaded.x, loaded.y, loaded.sample_weight)
        else:
            arrays = tuple(as_arrays(ns[n]) for n in spec.data)
        x, y, sw = (*arrays, None)[:3]
        data = ArraySource(as_float32(x), y, spec.num_samples, spec.seed, sw, shuffle=spec.shuffle,
                           epoch_size=spec.epoch_size)
    return model, data, validation_arrays(ns, spec.validation, model)


def as_arrays(value):
    """An array, or a list or dict of them (several inputs or outputs), as NumPy arrays."""
    return map_nested(np.asarray, value)
