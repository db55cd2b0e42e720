"""The run's Keras backend (TensorFlow, JAX or PyTorch): which one it is, and an engine readied
for it.

Keras 3 picks its backend once per process, when `keras` is first imported (`KERAS_BACKEND`,
else `~/.keras/keras.json`, else TensorFlow), and a process cannot switch afterwards. The
kernel's backend is the run's: the kernel never imports Keras before the cell does
(`when_imported`), so a cell's own `os.environ["KERAS_BACKEND"] = "jax"` line acts, and every
engine runs the cell under the same backend (`use_on_engine`). An engine whose Keras already
runs on another backend is refused with what to do (restart the engines), not restarted behind
the user's back: engines of a connected cluster, or MPI ranks, are not nbdist's to restart.

Responsible for:
- `backend_name()`: this process's Keras backend;
- `use_on_engine` / `check_engine`: before and after the cell runs on an engine;
- `configure_engine`: the thread budget and the GPU of a worker, per backend;
- `check_mode`: a mode whose engine code needs TensorFlow (sync's Horovod allreduce, pipeline's
  stages), as its spec says (`nbdist.modes.ModeSpec.backends`).

Only `nbdist.engine` imports a backend (the step: `nbdist.engine.flatmodel`); modes never do.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import os
import sys
from collections.abc import Callable, Iterator

from nbdist.engine.gpu import gpu_index, use_device
from nbdist.errors import BackendError
from nbdist.modes import BACKENDS, refuse_backend

BSP_THROUGH_HUB = "--mode async --algorithm ssp --staleness 0"


def backend_name() -> str:
    """The Keras backend of this process ("tensorflow", "jax" or "torch"); imports Keras."""
    import keras  # Keras: after the cell picks its backend

    return keras.backend.backend()


def loaded_backend() -> str | None:
    """This process's Keras backend if Keras is imported, else None (nothing is imported)."""
    keras = sys.modules.get("keras")
    if keras is None or not hasattr(keras, "backend"):
        return None
    return keras.backend.backend()


def check_mode(mode: str, backend: str) -> None:
    """Refuse a mode that cannot train on the cell's backend (its spec's `backends`)."""
    why = refuse_backend(mode, backend)
    if why is None:
        return
    raise BackendError(
        f"{why} Train bulk-synchronously through the hub instead, which works on every backend: "
        f"{BSP_THROUGH_HUB}; or run the notebook with KERAS_BACKEND=tensorflow (set before Keras "
        "is imported).")


def use_on_engine(backend: str, engine: int | None) -> None:
    """Before the cell runs on an engine: Keras there will load `backend`. An engine whose Keras
    already runs on another backend is refused (a process cannot switch)."""
    loaded = loaded_backend()
    if loaded is None:
        os.environ["KERAS_BACKEND"] = backend
        return
    if loaded != backend:
        raise BackendError(_mismatch(engine, loaded, backend))


def check_engine(backend: str, engine: int | None) -> None:
    """After the cell ran on an engine: its Keras runs on `backend` (a cell may set
    KERAS_BACKEND itself, to another value than the kernel's Keras loaded)."""
    loaded = loaded_backend()
    if loaded is not None and loaded != backend:
        raise BackendError(_mismatch(engine, loaded, backend))


def _mismatch(engine: int | None, loaded: str, backend: str) -> str:
    where = "this engine" if engine is None else f"engine {engine}"
    return (f"Keras on {where} runs on the {loaded} backend, but the kernel's runs on {backend} "
            f"(Received: {loaded}; expected {backend}). Keras picks its backend once per process. "
            "Restart the engines (%nbdist stop, then %nbdist start N; on a cluster you connected "
            "to, restart its ipengines), or set KERAS_BACKEND in the notebook to the backend the "
            "engines run, before Keras is imported. A cell that sets KERAS_BACKEND itself must set "
            "the kernel's backend.")


def kernel_backend(mode: str) -> str:
    """After the cell ran in the kernel: the run's backend, checked against the mode and
    against the cell's KERAS_BACKEND (set after Keras was imported, it would act on the engines
    but not here)."""
    loaded, wanted = backend_name(), os.environ.get("KERAS_BACKEND")
    if wanted is not None and wanted != loaded:
        raise BackendError(
            f"KERAS_BACKEND is {wanted}, but Keras was already imported in this kernel with the "
            f"{loaded} backend (Received: KERAS_BACKEND={wanted}; Keras runs {loaded}). Keras "
            "picks its backend once per process. Restart the kernel and set KERAS_BACKEND before "
            "the first `import keras` (the cell's first lines, or the notebook's first cell).")
    if loaded not in BACKENDS:
        raise BackendError(
            f"Keras runs on the {loaded} backend here (Received: {loaded}), which computes no "
            f"gradients nbdist can train with. Expected one of {', '.join(BACKENDS)}: set "
            "KERAS_BACKEND before the first `import keras` and restart the kernel.")
    check_mode(mode, loaded)
    return loaded


def configure_engine(backend: str, threads: int | None, local_rank: int) -> None:
    """A worker's thread budget and GPU (by local rank), before its backend computes anything."""
    if backend == "tensorflow":
        configure_tensorflow(threads, local_rank)
    elif backend == "torch":
        import torch  # PyTorch: only on its backend

        if threads:
            torch.set_num_threads(threads)
        if torch.cuda.is_available():
            count = torch.cuda.device_count()
            use_device(local_rank, count)
            torch.cuda.set_device(gpu_index(local_rank, count))
    elif backend == "jax":
        configure_jax(threads, local_rank)


def configure_jax(threads: int | None, local_rank: int) -> None:
    """XLA's flags (read once, when JAX starts), then the GPU of this local rank as JAX's
    default device, where Keras's JAX backend puts the model's variables and its steps."""
    if "jax" not in sys.modules:
        # engines share a GPU with others (workers beyond the GPU count, the notebook's own
        # Keras): no 75% of the device's memory taken by each at start
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
        flags = os.environ.get("XLA_FLAGS", "")
        if threads == 1 and "xla_cpu_multi_thread_eigen" not in flags:
            # one core: no Eigen thread pool (several cores: --pin auto's cores bound it)
            os.environ["XLA_FLAGS"] = (flags + " --xla_cpu_multi_thread_eigen=false "
                                       "intra_op_parallelism_threads=1").strip()
    import jax  # JAX: only on its backend

    try:
        gpus = jax.devices("gpu")
    except RuntimeError:  # a CPU build of jaxlib, or no driver: the CPU
        return
    use_device(local_rank, len(gpus))
    jax.config.update("jax_default_device", gpus[gpu_index(local_rank, len(gpus))])


def configure_tensorflow(threads: int | None, local_rank: int) -> None:
    """Thread budget and device pinning (one GPU per worker on a GPU node, chosen by local
    rank); must run before TensorFlow executes anything."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # no oneDNN/CPU-feature INFO lines
    import tensorflow as tf  # TensorFlow: only on its backend

    try:
        if threads:
            tf.config.threading.set_intra_op_parallelism_threads(threads)
            tf.config.threading.set_inter_op_parallelism_threads(min(threads, 2))
        gpus = tf.config.list_physical_devices("GPU")
        if gpus:
            use_device(local_rank, len(gpus))  # the GPU monitor reads this device, not the first
            tf.config.set_visible_devices(gpus[gpu_index(local_rank, len(gpus))], "GPU")
    except RuntimeError:  # already initialised by an earlier run in this engine: keep it
        pass


@contextlib.contextmanager
def when_imported(callback: Callable[[object], None]) -> Iterator[None]:
    """While the block runs, call `callback(keras)` once Keras is imported: at once if it is,
    else right after the block's code first imports it (so nbdist never fixes the backend
    before the cell's own KERAS_BACKEND line)."""
    keras = sys.modules.get("keras")
    if keras is not None:
        callback(keras)
        yield
        return
    finder = _AfterImport(callback)
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(finder)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds `keras` as Python would, and runs a callback once its module has executed."""

    def __init__(self, callback: Callable[[object], None]):
        self.callback, self.searching = callback, False

    def find_spec(self, name, path, target=None):
        if name != "keras" or self.searching:
            return None
        self.searching = True
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self.searching = False
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _Loader(spec.loader, self)
        return spec

    def done(self, module) -> None:
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)
        self.callback(module)


class _Loader(importlib.abc.Loader):
    """Keras's own loader, then the callback."""

    def __init__(self, inner, finder: _AfterImport):
        self._inner, self._finder = inner, finder

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module) -> None:
        self._inner.exec_module(module)
        self._finder.done(module)
