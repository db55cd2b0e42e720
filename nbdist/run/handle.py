"""The Run handle: one training run's lifecycle, control and results.

`nbdist.train` returns a Run at once; a monitor thread in the kernel polls the coordinating
hub, watches the workers, and at the end writes the trained weights into the notebook's own
model. Control methods (pause, resume, stop, set_lr) go straight to the hub, which passes
them to every worker on its next reply.

A Run is a `concurrent.futures.Future` (a subclass), so `concurrent.futures.wait`,
`as_completed` and `asyncio.wrap_future` take it. Its monitor thread completes it once, after
the run's end (finished, stopped or failed), when the weights are in the model and the engines
are free; with a cell's `model.fit(...)` call, once that call has returned too. Its result is
the run's `keras.callbacks.History` (`result()`), its exception the run's error. `cancel()`
stops a running run (`stop()`): the run then ends with a result, never cancelled.

Lifecycle of `status`: starting -> running <-> paused -> finished | stopped | failed.

The handle holds one `RunState` (`nbdist.run.state`), which its parts share: the views
(`nbdist.run.views`: history, nodes, events, report, summary), the controls
(`nbdist.run.control`: pause, set_lr, checkpoint, add_workers, ...) and the monitor thread
(`nbdist.run.monitor`, which polls the hub and ends the run).
"""

from __future__ import annotations

import logging
import time
from concurrent import futures
from concurrent.futures import Future

from nbdist.errors import NbdistError, TrainingError
from nbdist.run import monitor
from nbdist.run.backend import Backend
from nbdist.run.control import RunControl
from nbdist.run.state import RunState
from nbdist.run.views import NODE_COLUMNS, RunViews  # noqa: F401 - NODE_COLUMNS: the public name

log = logging.getLogger(__name__)

WAIT_SLICE_S = 0.2  # wait() checks for Ctrl-C at least this often


def _shown(name: str, doc: str) -> property:
    """A read-only attribute of the Run: its state's field `name`."""
    return property(lambda run: getattr(run.state, name), doc=doc)


class Run(RunViews, RunControl, Future):
    """A training run started by `%%distribute` or `nbdist.train`.

    Example:
        >>> run = nbdist.train(cell, cluster=cluster, epochs=2)   # doctest: +SKIP
        >>> run.pause(); run.set_lr(0.01); run.resume()           # doctest: +SKIP
        >>> run.wait().history.tail()                             # doctest: +SKIP
        >>> run.result().history["loss"]                          # doctest: +SKIP
        >>> history = await asyncio.wrap_future(run)              # doctest: +SKIP
    """

    config = _shown("config", "The run's options (a `TrainConfig`).")
    model = _shown("model", "The notebook's model; it holds the trained weights at the end.")
    model_name = _shown("model_name", "The name of the model in the cell.")
    status = _shown("status", "starting -> running <-> paused -> finished | stopped | failed.")
    error = _shown("error", "Why the run failed (an nbdist exception), or None.")
    run_id = _shown("run_id", "The run's id (in its checkpoints, report and logs).")
    hubs = _shown("hubs", "One dict per hub shard: shard, host, engine, spin_s.")
    warnings = _shown("warnings", "How the run trains unlike the cell, or what went wrong "
                                  "without failing it.")
    last_checkpoint = _shown("last_checkpoint", "The latest checkpoint's path, or None.")
    keras_history = _shown("keras_history", "The `keras.callbacks.History` a cell's own "
                                            "model.fit(...) call returned (None without one).")
    revision = _shown("revision", "+1 per statistics poll (displays redraw only what changed).")
    timeline_revision = _shown("timeline_revision", "+1 per timeline fetch.")

    def __init__(self, config, model, model_name: str, warnings: list[str] | None = None,
                 notes: list[str] | None = None):
        Future.__init__(self)
        self.state = RunState(config, model, model_name, warnings=list(warnings or []))
        for text in notes or []:
            self.note(text)

    def begin(self, backend: Backend, control, run_id: str, *, hubs: list[dict] | None = None,
              checkpoint_info: dict | None = None, checkpoint_folder=None) -> Run:
        """Take over a job whose hubs (or simulation, or stages) and workers a mode's start
        has started, and start watching it. Called once, by the mode's start
        (nbdist/modes/common/launch.py `begin_run`, the pipeline's start). `checkpoint_folder`:
        its claim on --checkpoint-dir (nbdist.checkpoint.folder), given back when it ends."""
        state = self.state
        if state.backend is not None:
            raise TrainingError(f"Run {state.run_id} has begun already (Received: a second begin "
                                f"for run {run_id}). Start each job with a Run of its own.")
        state.backend, state.control, state.run_id = backend, control, run_id
        state.hubs = list(hubs or [])
        state.checkpoint_info = dict(checkpoint_info or {})
        state.checkpoint_folder = checkpoint_folder
        state.status = "running"
        Future.set_running_or_notify_cancel(self)  # never cancelled: `cancel` stops a run
        if backend.cluster is not None:
            backend.cluster.track(self)  # Cluster.stop() ends this run before stopping the engines
        monitor.start(self)
        return self

    def fit_call_returned(self, history) -> None:
        """The cell's `model.fit(...)` call has returned `history` (None if it raised): the
        run's result, once it has ended. Called once, on every way out of that call, by the
        kernel (nbdist.fit.launch); the monitor completes the run's Future only then."""
        state = self.state
        state.keras_history = history
        if state.fit_call_returned is not None:
            state.fit_call_returned.set()

    def current_weights(self):
        """The model's flat (params, non_trainable) as the run holds them now (the hubs',
        rank 0's or the simulation's), or the final ones once training has ended."""
        state = self.state
        if state.final_weights is not None:  # training ended (the hubs may be gone already)
            return state.final_weights
        return state.backend.current_weights(state.control)

    # -- waiting (and the Future's methods) -----------------------------------------------------

    def ended(self) -> bool:
        """Whether training has ended (finished, stopped or failed): the weights are in the
        model and the engines are free. `done()` follows at once, or, with a cell's fit call,
        once that call has returned its History."""
        return self.state.ended.is_set()

    def running(self) -> bool:
        """Whether the run is training now (running or paused)."""
        return not self.ended() and self.state.status in ("running", "paused")

    def cancel(self) -> bool:
        """Stop the run (see `stop`): True if it was training, False if it had ended (or not
        begun). Unlike a Future's, a cancelled run is not cancelled: it ends stopped, with a
        result (the History of what it trained; the weights reached are in `model`), and
        `cancelled()` stays False. asyncio calls it when what awaits `asyncio.wrap_future(run)`
        is cancelled (`asyncio.wait_for` timing out): the run stops; `asyncio.shield` keeps it."""
        if self.state.backend is None or self.ended():
            return False
        self._stop_quietly()
        return True

    def wait(self, timeout: float | None = None) -> Run:
        """Block until the run ends; raise its error if it failed. Returns the run."""
        self._wait_end(timeout)
        if self.state.error is not None:
            raise self.state.error
        return self

    def result(self, timeout: float | None = None):
        """The run's `keras.callbacks.History` once it has ended: the one a cell's own
        `model.fit(...)` call returned, or else one built from the run's epochs (`loss`, the
        mean of each epoch's pushed losses weighted by their batch sizes, and the `val_*`
        results; `nbdist.run.result`). Raises the run's error if it failed, TimeoutError if it
        is still going after `timeout` seconds. Ctrl-C while it waits stops the run."""
        self._wait_end(timeout)
        return Future.result(self, 0)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """The run's error once it has ended (None if it finished or was stopped); TimeoutError
        if it is still going after `timeout` seconds."""
        self._wait_end(timeout)
        return Future.exception(self, 0)

    def set_running_or_notify_cancel(self) -> bool:
        raise self._not_yours("set_running_or_notify_cancel")

    def set_result(self, result) -> None:
        raise self._not_yours("set_result")

    def set_exception(self, exception) -> None:
        raise self._not_yours("set_exception")

    def _not_yours(self, name: str) -> TrainingError:
        return TrainingError(
            f"A Run's Future state is set by its monitor thread, once, at the run's end "
            f"(Received: run.{name}(...)). Use run.stop() to end it early.")

    def _wait_end(self, timeout: float | None) -> None:
        end = None if timeout is None else time.monotonic() + timeout
        try:
            # short slices: an interrupt that arrives as a flag rather than a signal (Jupyter's
            # interrupt on some platforms, _thread.interrupt_main) is seen within WAIT_SLICE_S
            while not futures.wait([self], WAIT_SLICE_S).done:
                if end is not None and time.monotonic() >= end:
                    raise TimeoutError(self._still_going(timeout))
        except KeyboardInterrupt:  # Ctrl-C: stop the workers and hub, free the engines
            self.close(timeout=30)
            raise

    def _still_going(self, timeout: float) -> str:
        if not self.ended():
            return f"The run is still {self.status} after {timeout}s."
        return (f"The run has ended ({self.status}), but after {timeout}s the cell's "
                "model.fit(...) call has still not returned the History that is its result.")

    def __enter__(self) -> Run:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        """Leaving a `with` block early (an error, Ctrl-C) stops the run and waits for it, so
        no worker is left training; a finished run is left as it is.

        Example:
            >>> with nbdist.train(cell, cluster=cluster, epochs=50) as run:   # doctest: +SKIP
            ...     time.sleep(20)
            ...     run.stop()
        """
        self.close(timeout=60)

    def close(self, timeout: float = 30.0) -> None:
        """Stop the run if it is still going and wait (up to `timeout`) until its workers and
        hub have left the engines. Never raises: for clean-up paths (Ctrl-C, cluster stop)."""
        if not self.ended():
            self._stop_quietly()
            self.state.ended.wait(timeout)

    def _stop_quietly(self) -> None:
        try:
            self.stop()
        except NbdistError:  # it ended meanwhile, or the hub is gone: the monitor cleans up
            pass
