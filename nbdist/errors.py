"""Every exception nbdist raises, in one tree.

Each message says what happened (with the value received), what was expected, and how to
fix it. Catch `NbdistError` to catch them all; each also derives from the built-in type a
Python user would expect (`ValueError` for bad input, `FileNotFoundError` for a missing
data set, `RuntimeError` for a failed run), so existing `except` clauses keep working.

    NbdistError
    ├── ConfigError (ValueError)            a flag or option is invalid
    │   ├── UnsupportedOptimizerError       the hub cannot reproduce the cell's
    │   │                                   optimizer/schedule/constraint
    │   └── BackendError                    the Keras backend cannot run this mode, or an engine
    │                                       runs another
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
    │   └── RepeatedMessageError            the latest message of a sender came again (answered
    │                                       again by a hub, never applied twice)
    ├── CheckpointError (ValueError)        a checkpoint is corrupt or does not fit this run
    │   └── CheckpointNotFoundError (FileNotFoundError)  no checkpoint at that path
    ├── DependencyError (ImportError)       an optional dependency (Horovod, ...) is missing
    ├── DatasetNotFoundError (FileNotFoundError)
    └── DatasetFormatError (ValueError)
"""

from __future__ import annotations

# the exception classes; `from_engine`, `engine_tag` and `raised_by_cell` turn an engine's error
# into one
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
    "RepeatedMessageError",
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
    """Code raised on an engine: the cell (its own lines, as the engine showed them) or training.

    `engine_id` and `host` say where; `remote_traceback` is the engine's traceback text, which
    IPython shows under the message (`_render_traceback_`), as ipyparallel shows a RemoteError."""

    def __init__(self, message: str, engine_id: int | None = None, remote_traceback: str = "",
                 host: str | None = None):
        super().__init__(message)
        self.engine_id, self.host = engine_id, host
        self.remote_traceback = remote_traceback

    def _render_traceback_(self) -> list[str]:
        """The message, then the engine's traceback under a tag naming the engine and its host
        (the engine's own tag where it gave one: `nbdist.engine.cell_traceback`)."""
        lines = [f"RemoteCellError: {self}"]
        remote = self.remote_traceback.splitlines()
        if remote:
            if not remote[0].startswith(TAG_START):
                remote.insert(0, engine_tag(self.engine_id, self.host))
            lines += ["", *remote]
        return lines


TAG_START = "[engine "


def engine_tag(engine: int | None, host: str | None) -> str:
    """Where an error was raised, as its traceback is tagged: '[engine 3 on node-a]'."""
    return f"{TAG_START}{engine}{f' on {host}' if host else ''}]"


def raised_by_cell(exc: BaseException) -> bool:
    """Whether an engine's error (ipyparallel's RemoteError) came from the user's cell: the
    engine tagged its traceback (`nbdist.engine.cell_traceback`)."""
    return str(getattr(exc, "traceback", "") or "").startswith(TAG_START)


def from_engine(exc: BaseException, engine: int | None, host: str | None = None) -> BaseException:
    """An error an engine raised (ipyparallel's RemoteError) as nbdist's: the nbdist exception
    raised there, naming the engine, or a `RemoteCellError` with the engine's traceback."""
    if isinstance(exc, NbdistError):
        return exc
    ename = getattr(exc, "ename", type(exc).__name__)
    evalue = getattr(exc, "evalue", str(exc))
    cls = globals().get(ename) if ename in __all__ else None
    if isinstance(cls, type) and issubclass(cls, NbdistError) and cls is not RemoteCellError:
        return cls(f"{engine_tag(engine, host)} {evalue}")
    remote = getattr(exc, "traceback", "") or ""
    where = f"engine {engine}" + (f" ({host})" if host else "")
    what = (f"The cell raised {ename} on {where}" if raised_by_cell(exc) else
            f"{ename} on {where}")
    return RemoteCellError(f"{what}: {evalue}", engine_id=engine, remote_traceback=remote,
                           host=host)


class TrainingError(NbdistError, RuntimeError):
    """The run failed while training (a hub or worker was lost, the loss became NaN, ...)."""


class WorkersLostError(TrainingError):
    """Every worker of an async run died (engines killed or crashed); nobody is left to train."""


class NonFiniteLossError(TrainingError):
    """A step's loss or gradient norm became NaN or infinite (a cell's `TerminateOnNaN` callback
    turns it into the end of its fit, as in Keras)."""


class ProtocolError(NbdistError, ValueError):
    """A message on a hub socket was unsigned, wrongly signed, replayed or malformed.

    `reason` names what it is counted under where it is dropped ("bad signature", "malformed
    header", ...); `detail` what was received. The message is both: "reason: detail".

    Example:
        >>> exc = ProtocolError("replayed message", "seq 3 from 'worker-0/ab' already seen")
        >>> exc.reason, str(exc)
        ('replayed message', "replayed message: seq 3 from 'worker-0/ab' already seen")
    """

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(reason, detail)  # both in args: a pickled copy keeps them apart
        self.reason, self.detail = reason, detail

    def __str__(self) -> str:
        return f"{self.reason}: {self.detail}" if self.detail else self.reason


class RepeatedMessageError(ProtocolError):
    """The latest message from `sender` came again, whole and signed (`seq` is the last one
    seen): a line sends its latest request again after its connection came back
    (`nbdist.hub.lines`). Counted as a replay; a hub answers it again from its cache
    (`nbdist.hub.server`), never applies it twice.

    Example:
        >>> exc = RepeatedMessageError("worker-0/ab", 3)
        >>> exc.reason, exc.sender, exc.seq
        ('replayed message', 'worker-0/ab', 3)
    """

    def __init__(self, sender: str, seq: int):
        super().__init__("replayed message", f"seq {seq} from {sender!r}, the latest, seen again")
        self.sender, self.seq = sender, seq

    def __reduce__(self):
        return type(self), (self.sender, self.seq)


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
