"""Every exception nbdist raises, in one tree.

Each message says what happened (with the value received), what was expected, and how to
fix it. Catch `NbdistError` to catch them all; each also derives from the built-in type a
Python user would expect (`ValueError` for bad input, `FileNotFoundError` for a missing
data set, `RuntimeError` for a failed run), so existing `except` clauses keep working.

    NbdistError
    ├── ConfigError (ValueError)            a flag or option is invalid
    │   ├── UnsupportedOptimizerError       the hub cannot reproduce the cell's optimizer/schedule/constraint
    │   └── BackendError                    the Keras backend cannot run this mode, or an engine runs another
    ├── CellError (ValueError)              the cell does not give what training needs
    │   ├── ModelNotFoundError              no compiled keras.Model in the cell
    │   ├── AmbiguousModelError             several models and no --model
    │   ├── ModelNotCompiledError           the model has no optimizer/loss
    │   └── DataError                       training/validation arrays missing or mismatched
    ├── ClusterError (RuntimeError)         the engine cluster cannot serve this run
    │   ├── NoClusterError                  no cluster started or connected
    │   ├── NotEnoughEnginesError           more workers + shards than engines
    │   ├── EngineTimeoutError              an engine did not answer within its time limit
    │   └── UnreachableHostError            a host of the cluster does not answer on its address
    ├── RemoteCellError (RuntimeError)      the cell (or training) raised on an engine
    ├── TrainingError (RuntimeError)        the run failed while training (hub lost, ...)
    │   ├── WorkersLostError                every worker (or, in sync mode, a rank) was lost
    │   └── NonFiniteLossError              a step's loss or gradient norm became NaN or inf
    ├── ProtocolError (ValueError)          a hub message was unsigned, forged, replayed, malformed
    ├── CheckpointError (ValueError)        a checkpoint is corrupt or does not fit this run
    │   └── CheckpointNotFoundError (FileNotFoundError)  no checkpoint at that path
    ├── DependencyError (ImportError)       an optional dependency (Horovod, ...) is missing
    ├── DatasetNotFoundError (FileNotFoundError)
    └── DatasetFormatError (ValueError)
"""

from __future__ import annotations

__all__ = [
    "AmbiguousModelError",
    "BackendError",
    "CellError",
    "CheckpointError",
    "CheckpointNotFoundError",
    "ClusterError",
    "ConfigError",
    "DataError",
    "DatasetFormatError",
    "DatasetNotFoundError",
    "DependencyError",
    "EngineTimeoutError",
    "ModelNotCompiledError",
    "ModelNotFoundError",
    "NbdistError",
    "NoClusterError",
    "NonFiniteLossError",
    "NotEnoughEnginesError",
    "ProtocolError",
    "RemoteCellError",
    "TrainingError",
    "UnreachableHostError",
    "UnsupportedOptimizerError",
    "WorkersLostError",
]


class NbdistError(Exception):
    """Base of every nbdist exception."""


class ConfigError(NbdistError, ValueError):
    """A flag or option has a value nbdist cannot use."""


class UnsupportedOptimizerError(ConfigError):
    """The hub cannot reproduce the cell's optimizer, learning-rate schedule or a variable's
    weight constraint exactly.

    Raised before a run starts, so nothing trains silently with another optimizer.
    """


class BackendError(ConfigError):
    """The run's Keras backend (JAX, PyTorch, TensorFlow) cannot do what was asked: a mode that
    needs TensorFlow, or an engine whose Keras already runs on another backend."""


class CellError(NbdistError, ValueError):
    """The `%%distribute` cell does not provide what training needs."""


class ModelNotFoundError(CellError):
    """The cell defines no compiled `keras.Model` (or not the one named by --model)."""


class AmbiguousModelError(CellError):
    """The cell defines several models and --model does not say which one to train."""


class ModelNotCompiledError(CellError):
    """The model was never `compile()`d, so there is no optimizer or loss to train with."""


class DataError(CellError):
    """Training or validation arrays are missing, mismatched in length, or unusable."""


class ClusterError(NbdistError, RuntimeError):
    """The ipyparallel cluster cannot serve this run."""


class NoClusterError(ClusterError):
    """No cluster was started or connected."""


class NotEnoughEnginesError(ClusterError):
    """The run asks for more workers and parameter shards than there are engines."""


class EngineTimeoutError(ClusterError):
    """An engine did not answer within its time limit (stuck, overloaded, or gone)."""

    def __init__(self, message: str, engine_id: int | None = None):
        super().__init__(message)
        self.engine_id = engine_id


class UnreachableHostError(ClusterError):
    """A host of the cluster cannot be reached on the address nbdist chose (named in the message).

    `host` and `address` say which, when known (the message always names them)."""

    def __init__(self, message: str, host: str | None = None, address: str | None = None):
        super().__init__(message)
        self.host, self.address = host, address


class RemoteCellError(NbdistError, RuntimeError):
    """Code raised on an engine; carries the engine id and its traceback text."""

    def __init__(self, message: str, engine_id: int | None = None, remote_traceback: str = ""):
        super().__init__(message)
        self.engine_id = engine_id
        self.remote_traceback = remote_traceback

    def _render_traceback_(self) -> list[str]:
        """How IPython shows it: the message, then the engine's own traceback, tagged."""
        lines = [f"RemoteCellError: {self}"]
        if self.remote_traceback:
            lines += ["", f"--- traceback on engine {self.engine_id} ---", *self.remote_traceback.splitlines()]
        return lines


class TrainingError(NbdistError, RuntimeError):
    """The run failed while training (a hub or worker was lost, the loss became NaN, ...)."""


class WorkersLostError(TrainingError):
    """Every worker of an async run died (engines killed or crashed); nobody is left to train."""


class NonFiniteLossError(TrainingError):
    """A step's loss or gradient norm became NaN or infinite (a cell's `TerminateOnNaN` callback
    turns it into the end of its fit, as in Keras)."""


class ProtocolError(NbdistError, ValueError):
    """A message on a hub socket was unsigned, wrongly signed, replayed or malformed."""


class CheckpointError(NbdistError, ValueError):
    """A checkpoint cannot be written, or is corrupt or made for another model or run."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """There is no checkpoint at the path given to resume from."""


class DependencyError(NbdistError, ImportError):
    """An optional dependency that this feature needs is not installed."""


class DatasetNotFoundError(NbdistError, FileNotFoundError):
    """A data set's files are in none of the places nbdist looked."""


class DatasetFormatError(NbdistError, ValueError):
    """A data set file exists but is truncated or not in the expected format."""
