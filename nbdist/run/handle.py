"""The Run handle: one training run's lifecycle, control and results.

`nbdist.train` returns a Run at once; a monitor thread in the kernel polls the coordinating
hub, watches the workers, and at the end writes the trained weights into the notebook's own
model. Control methods (pause, resume, stop, set_lr) go straight to the hub, which passes
them to every worker on its next reply.

Lifecycle of `status`: starting -> running <-> paused -> finished | stopped | failed.

The handle is built from three parts, one module each: `nbdist.run.views` (history, nodes,
events, report, summary), `nbdist.run.control` (pause, set_lr, checkpoint, add_workers, ...)
and `nbdist.run.monitor` (the thread that polls the hub and ends the run).
"""

from __future__ import annotations

import logging
import threading
import time

from nbdist.core.traffic import TrafficRates
from nbdist.errors import NbdistError
from nbdist.hub.client import HubControl
from nbdist.run.backend import Backend
from nbdist.run.control import RunControl
from nbdist.run.monitor import RunMonitor
from nbdist.run.views import NODE_COLUMNS, RunViews  # noqa: F401 - NODE_COLUMNS: the public name

log = logging.getLogger(__name__)

WAIT_SLICE_S = 0.2  # wait() checks for Ctrl-C at least this often


class Run(RunViews, RunControl, RunMonitor):
    """A training run started by `%%distribute` or `nbdist.train`.

    Example:
        >>> run = nbdist.train(cell, cluster=cluster, epochs=2)   # doctest: +SKIP
        >>> run.pause(); run.set_lr(0.01); run.resume()           # doctest: +SKIP
        >>> run.wait().history.tail()                             # doctest: +SKIP
    """

    def __init__(self, config, model, model_name: str, warnings: list[str] | None = None,
                 notes: list[str] | None = None):
        self.config = config
        self.model = model  # the kernel's model; holds the trained weights at the end
        self.model_name = model_name
        self.status = "starting"
        self.error: BaseException | None = None
        self.run_id = ""
        self._rows: list[list] = []
        self._timeline: list[dict] = []
        self._timeline_at = 0.0
        self._snapshot: dict = {}
        self._traffic = TrafficRates()  # each worker's bytes/s, from the totals it reports
        self.hubs: list[dict] = []  # one per hub shard: shard, host, engine, spin_s (set by the mode's start)
        self._done = threading.Event()
        self._control: HubControl | None = None
        self._backend: Backend | None = None
        self._stop_requested = False
        self._listeners: list = []  # callables(run) called after each poll (status display)
        self.revision = 0  # +1 per stats poll: displays redraw only what changed
        self.timeline_revision = 0  # +1 per timeline fetch (every TIMELINE_EVERY_S)
        # how the run trains unlike the cell, or what went wrong without failing it
        self.warnings: list[str] = list(warnings or [])
        self._notes: list[dict] = []  # choices made before the start (see `note`)
        for text in notes or []:
            self.note(text)
        self._events_seen = 0
        self.last_checkpoint: str | None = None  # path of the latest checkpoint written
        self._checkpoint_info: dict = {}  # set by the mode's start (nbdist.job.Job.checkpoint_info)
        self._checkpoint_lock = threading.Lock()
        self._checkpoint_folder = None  # its claim on --checkpoint-dir (nbdist.checkpoint.folder)
        self._checkpoint_at = time.monotonic()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> Run:
        """Block until the run ends; raise its error if it failed. Returns the run."""
        end = None if timeout is None else time.monotonic() + timeout
        try:
            # short slices: an interrupt that arrives as a flag rather than a signal (Jupyter's
            # interrupt on some platforms, _thread.interrupt_main) is seen within WAIT_SLICE_S
            while not self._done.wait(WAIT_SLICE_S):
                if end is not None and time.monotonic() >= end:
                    raise TimeoutError(f"The run is still {self.status} after {timeout}s.")
        except KeyboardInterrupt:  # Ctrl-C: stop the workers and hub, free the engines
            self.close(timeout=30)
            raise
        if self.error is not None:
            raise self.error
        return self

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
        if not self.done:
            self._stop_quietly()
            self._done.wait(timeout)

    def _stop_quietly(self) -> None:
        try:
            self.stop()
        except NbdistError:  # it ended meanwhile, or the hub is gone: the monitor cleans up
            pass

    # -- lifecycle (called by the mode's start, nbdist.modes.launch) --------------------------

    def _begin(self, backend: Backend, control: HubControl, run_id: str) -> None:
        self._backend, self._control, self.run_id = backend, control, run_id
        self.status = "running"
        if backend.cluster is not None:
            backend.cluster.track(self)  # Cluster.stop() ends this run before stopping the engines
        threading.Thread(target=self._monitor, daemon=True, name=f"nbdist-run-{run_id}").start()

