"""The Run handle: one training run's lifecycle, control and results.

`nbdist.train` returns a Run at once; a monitor thread in the kernel polls the coordinating
hub, watches the workers, and at the end writes the trained weights into the notebook's own
model. Control methods (pause, resume, stop, set_lr) go straight to the hub, which passes
them to every worker on its next reply.

Lifecycle of `status`: starting -> running <-> paused -> finished | stopped | failed.
"""

from __future__ import annotations

import logging
import threading
import time

import pandas as pd

from nbdist.errors import ConfigError, NbdistError, TrainingError, WorkersLostError
from nbdist.ps.client import HubControl
from nbdist.ps.stats import HISTORY_COLUMNS

log = logging.getLogger(__name__)

POLL_S = 0.25  # how often the kernel asks the hub for statistics
WAIT_SLICE_S = 0.2  # wait() checks for Ctrl-C at least this often
TIMELINE_EVERY_S = 2.0  # how often it also fetches the (bounded, down-sampled) timeline
NODE_COLUMNS = ["worker", "engine", "host", "state", "samples", "samples_per_s", "steps",
                "delay_mean", "delay_p95", "delay_max", "batch_size", "slowdown", "group", "loss",
                "compute_s", "comm_s"]


class Run:
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
        self._done = threading.Event()
        self._control: HubControl | None = None
        self._backend = None
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
        self._checkpoint_info: dict = {}  # set by nbdist.api: config, cell, layout, ...
        self._checkpoint_lock = threading.Lock()
        self._checkpoint_at = time.monotonic()

    # -- results ----------------------------------------------------------------------------

    @property
    def history(self) -> pd.DataFrame:
        """One row per applied push (time, step, epoch, worker, loss, delay, batch_size),
        plus one row per validation result (`val_*` columns)."""
        train = pd.DataFrame(self._rows, columns=list(HISTORY_COLUMNS))
        evals = pd.DataFrame(self._snapshot.get("evals", []))
        if evals.empty:
            return train
        evals = evals.drop(columns=["version"], errors="ignore")
        return pd.concat([train, evals], ignore_index=True).sort_values(["step", "time"], kind="stable").reset_index(drop=True)

    @property
    def nodes(self) -> pd.DataFrame:
        """One row per worker: state, samples, samples/s, steps, delay, batch size, ..."""
        return pd.DataFrame(self._snapshot.get("nodes", []), columns=NODE_COLUMNS)

    @property
    def timeline(self) -> pd.DataFrame:
        """Per-worker time series (samples/s, compute, comm, wait, batch, delay, loss,
        slow-down, group), down-sampled on the hub so long runs stay bounded."""
        return pd.DataFrame(self._timeline)

    @property
    def delays(self) -> pd.DataFrame:
        """How often each delay (staleness, in versions) occurred, per worker."""
        rows = [{"worker": int(w), "delay": int(d), "count": c}
                for w, hist in self._snapshot.get("delays", {}).items() for d, c in hist.items()]
        return pd.DataFrame(rows, columns=["worker", "delay", "count"])

    @property
    def events(self) -> pd.DataFrame:
        """What nbdist chose before the start (e.g. which model), then control actions and
        epoch ends, with time and global step."""
        return pd.DataFrame(self._notes + self._snapshot.get("events", []))

    @property
    def lr(self) -> float | None:
        """The learning rate now: a schedule's value at the hub's step, or a set_lr override."""
        return self._snapshot.get("lr")

    def note(self, text: str) -> None:
        """Record a choice nbdist made for this run before it started (time 0, step 0)."""
        self._notes.append({"time": 0.0, "step": 0, "event": "note", "text": text})

    def report(self, path: str = "nbdist-report.html", top_k: int | None = None,
               compare: list[Run] | None = None):
        """Write one self-contained HTML file (plotly.js inline, viewable offline) with every
        dashboard figure and the node table; with `compare=[other, ...]` also this run and
        the others side by side (see `compare`). Returns its path.

        Example:
            >>> run.wait().report("out/run.html", compare=[other_run])   # doctest: +SKIP
        """
        from nbdist.dashboard.comparison import comparison_figures, named_runs
        from nbdist.dashboard.report import write_report

        extra = comparison_figures(named_runs((self, *compare), None)) if compare else None
        return write_report(path, history=self.history, nodes=self.nodes, timeline=self.timeline,
                            delays=self.delays, events=self.events, title=f"nbdist run {self.run_id}",
                            summary=self.summary(), top_k=top_k, extra=extra)

    def compare(self, *others: Run, metric: str = "accuracy", x: str = "time", **kwargs):
        """This run and `others` on the same axes: `nbdist.compare(self, *others, ...)`.

        Example:
            >>> asgd_run.compare(dc_run, metric="loss", x="samples")   # doctest: +SKIP
        """
        from nbdist.dashboard.comparison import compare

        return compare(self, *others, metric=metric, x=x, **kwargs)

    def dashboard(self, top_k: int | None = None):
        """The live dashboard (plots and controls) of this run, for display in a notebook;
        `%%distribute` shows one itself unless `--no-dashboard`.

        Example:
            >>> run = nbdist.train(cell, cluster=cluster, epochs=5)   # doctest: +SKIP
            >>> run.dashboard(top_k=4)                                # doctest: +SKIP
        """
        from nbdist.dashboard.widget import Dashboard

        return Dashboard(self, top_k=top_k)

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

    # -- control ----------------------------------------------------------------------------

    def pause(self) -> None:
        """Workers finish their current step and wait; nothing is pushed until resume()."""
        self._send(paused=True)

    def resume(self) -> None:
        self._send(paused=False)

    def stop(self) -> None:
        """End training early; the kernel's model still receives the weights reached so far.
        A run that has already ended is left as it is (stopping twice is not an error)."""
        if self.done:
            return
        self._stop_requested = True
        try:
            self._send(stop=True)
        except TrainingError:
            if not (self.done or self._control.closed):  # else it ended meanwhile: nothing to stop
                raise

    def set_lr(self, lr: float) -> None:
        """Change the learning rate from the next push on (with --local-steps: the workers';
        in --mode sync: every rank's, at the same step). A learning-rate schedule in the cell is
        replaced by this constant rate from then on, and `run.warnings` says so."""
        self._send(lr=float(lr))
        from nbdist.learning_rate import schedule_replaced

        note = schedule_replaced(getattr(self.model, "optimizer", None), lr, self.warnings)
        if note:
            self.warnings.append(note)
            log.warning("run %s: %s", self.run_id, note)

    def set_slowdown(self, worker: int, factor: float) -> None:
        """Make `worker` behave `factor` times slower (1 = full speed), from its next step."""
        from nbdist.config import parse_slowdown

        (factor,) = parse_slowdown([factor])
        self._check_worker(worker)
        self._send(slowdown=[int(worker), factor])

    def set_batch_policy(self, policy: str) -> None:
        """'dbs' (batch sizes in proportion to measured speed) or 'fixed'."""
        from nbdist.ps.dbs import POLICIES

        if policy not in POLICIES:
            raise ConfigError(f"Unknown batch policy {policy!r}. Expected one of: {', '.join(POLICIES)}.")
        self._send(batch_policy=policy)

    def set_option(self, name: str, value: float) -> None:
        """Change one of the update rule's hyper-parameters live (e.g. 'lambda0')."""
        from nbdist.algorithms import make_rule

        options = {**self._snapshot.get("rule_options", {}), name: value}
        make_rule(self.config.algorithm.value, 0, max(1, len(self._snapshot.get("nodes", []))), options)
        self._send(option=[name, float(value)])

    def regroup(self) -> None:
        """Re-form the speed groups of `--algorithm group` from the current throughput."""
        if self.config.algorithm.value != "group":
            raise ConfigError(f"regroup() needs --algorithm group (this run uses {self.config.algorithm.value}).")
        self._send(regroup=True)

    def checkpoint(self, directory: str | None = None) -> str:
        """Save the hub's state now (weights, rule state, versions, learning rate, data
        position) into `directory` (default: --checkpoint-dir); returns the checkpoint's path,
        for `nbdist.resume(path)`.

        Example:
            >>> path = run.checkpoint("ckpt")                        # doctest: +SKIP
            >>> run2 = nbdist.resume(path, cluster=cluster)          # doctest: +SKIP
        """
        directory = directory if directory is not None else self.config.checkpoint_dir
        if directory is None:
            raise ConfigError("No checkpoint folder: pass one, run.checkpoint('ckpt'), or start the "
                              "run with --checkpoint-dir ckpt (checkpoint_dir='ckpt').")
        if self._control is None or self.done:
            raise TrainingError(f"The run is {self.status}; its hub is gone, so there is nothing to "
                                f"checkpoint. Its last checkpoint: {self.last_checkpoint}.")
        return self._save_checkpoint(str(directory))

    def _save_checkpoint(self, directory: str, final: bool = False) -> str:
        from nbdist.ps.checkpoint import save

        with self._checkpoint_lock:  # sync mode: rank 0 holds the weights (nbdist.sync_checkpoint)
            state = getattr(self._backend, "checkpoint_state", None)
            shards = state(self._control, final) if state else self._control.state()
            self.last_checkpoint = save(directory, shards, self._checkpoint_info)
            self._checkpoint_at = time.monotonic()
        return self.last_checkpoint

    def _auto_checkpoint(self, final: bool = False) -> None:
        """Every --checkpoint-every seconds, and at the end; a failure warns, never kills training."""
        every = self.config.checkpoint_interval
        if every is None or not (final or time.monotonic() - self._checkpoint_at >= every):
            return
        try:
            self._save_checkpoint(self.config.checkpoint_dir, final)
        except (NbdistError, OSError) as exc:  # e.g. NaN weights: the last good one stays
            self._checkpoint_at = time.monotonic()
            log.warning("run %s: checkpoint into %s failed: %s", self.run_id, self.config.checkpoint_dir, exc)
            self.warnings.append(f"checkpoint not saved: {str(exc).splitlines()[0]}")

    def _check_worker(self, worker: int) -> None:
        count = len(self._snapshot.get("nodes", []))
        if not (isinstance(worker, int) and 0 <= worker < max(count, 1)):
            raise ConfigError(f"No worker {worker!r}: this run has workers 0..{count - 1}.")

    def _send(self, **changes: object) -> None:
        if self._control is None or self.done:
            raise TrainingError(f"The run is {self.status}; there is nothing to control. Start a new run.")
        self._control.control(**changes)

    # -- lifecycle (called by nbdist.api) ---------------------------------------------------

    def _begin(self, backend, control: HubControl, run_id: str) -> None:
        self._backend, self._control, self.run_id = backend, control, run_id
        self.status = "running"
        cluster = getattr(backend, "cluster", None)
        if cluster is not None:
            cluster.track(self)  # Cluster.stop() ends this run before stopping the engines
        threading.Thread(target=self._monitor, daemon=True, name=f"nbdist-run-{run_id}").start()

    def _monitor(self) -> None:
        control, backend = self._control, self._backend
        last_answer = time.monotonic()
        try:
            while True:
                failure = backend.failure()
                if failure is not None:
                    raise failure
                for worker, why in backend.newly_lost():
                    self._report_lost(control, worker, why)
                try:
                    want_timeline = time.monotonic() - self._timeline_at > TIMELINE_EVERY_S
                    snap = control.stats(since=len(self._rows), timeline=want_timeline)
                    last_answer = time.monotonic()
                except TrainingError:
                    if time.monotonic() - last_answer > self.config.timeout:
                        raise
                    continue
                self._absorb(snap)
                if snap.get("error"):
                    raise TrainingError(f"The hub failed: {snap['error']}")
                if snap.get("finished"):
                    self._absorb(control.stats(since=len(self._rows), timeline=True))
                    self._check_survivors()
                    self._auto_checkpoint(final=True)
                    break
                self._auto_checkpoint()
                time.sleep(POLL_S)
            from nbdist.flatmodel import write_flat

            params, non_trainable = backend.final_params(control)
            write_flat(self.model, params, non_trainable)
            self.status = "stopped" if self._stop_requested else "finished"
        except BaseException as exc:  # noqa: BLE001 - stored and re-raised by wait()
            self.error = exc if isinstance(exc, NbdistError) else TrainingError(f"The run failed: {exc!r}")
            self.status = "failed"
            self._abort()
        finally:
            self._cleanup()
            self._done.set()
            self._notify()

    def _report_lost(self, control: HubControl, worker: int, why: str) -> None:
        """A worker's engine died: the hub hands its work to the others at once."""
        log.warning("nbdist run %s: worker %d's engine died; training goes on without it (%s)",
                    self.run_id, worker, why.splitlines()[0])
        try:
            control.control(lost=worker, reason="engine died")
        except NbdistError as exc:  # the hub notices the silence by itself
            log.warning("could not tell the hub that worker %d is lost: %s", worker, exc)

    def _check_survivors(self) -> None:
        nodes = self._snapshot.get("nodes", [])
        lost = self._snapshot.get("lost", [])
        if nodes and len(lost) == len(nodes):
            engines = ", ".join(str(n["engine"]) for n in nodes)
            raise WorkersLostError(
                f"All {len(nodes)} workers were lost (engines {engines} died or went silent) before "
                "training finished, so there is no trained model. Check the engines with "
                "`%nbdist status` (restart them with %nbdist stop / %nbdist start N), then run the "
                "cell again.")

    def _abort(self) -> None:
        """Tell the surviving workers to stop and give them a moment to leave."""
        try:
            self._control.control(stop=True)
        except NbdistError:
            return
        deadline = time.monotonic() + 15
        while self._backend.workers_running() and time.monotonic() < deadline:
            time.sleep(0.1)

    def _cleanup(self) -> None:
        try:
            self._control.shutdown()
            self._backend.finish(timeout=30)
        except Exception as exc:  # noqa: BLE001 - never mask the run's own outcome
            log.warning("clean-up after run %s: %s", self.run_id, exc)
        finally:
            self._control.close()

    def _absorb(self, snap: dict) -> None:
        self._rows.extend(snap.pop("history", []))
        if "timeline" in snap:
            self._timeline = snap.pop("timeline")
            self._timeline_at = time.monotonic()
            self.timeline_revision += 1
        self._snapshot = snap
        self.revision += 1
        events = snap.get("events", [])
        for e in events[self._events_seen:]:
            if e.get("event") == "worker_lost":
                self.warnings.append(f"worker {e['worker']} was lost at step {e['step']} "
                                     f"({e.get('reason')}); the others took over its data")
        self._events_seen = len(events)
        if self.status in ("running", "paused"):
            self.status = "paused" if snap.get("paused") else "running"
        self._notify()

    def _notify(self) -> None:
        for listener in list(self._listeners):
            try:
                listener(self)
            except Exception as exc:  # noqa: BLE001 - a display must never kill training
                log.warning("run listener failed: %s", exc)

    # -- display ----------------------------------------------------------------------------

    def summary(self) -> str:
        """One line: status, progress, step, loss, validation accuracy."""
        s = self._snapshot
        parts = [f"nbdist run {self.run_id}: {self.status}",
                 f"epoch {s.get('epochs_done', 0):.2f}/{self.config.epochs}",
                 f"step {s.get('global_step', 0)}"]
        if self._rows:
            parts.append(f"loss {self._rows[-1][4]:.4f}")
        evals = s.get("evals") or []
        if evals:
            last = evals[-1]
            parts += [f"{k} {v:.4f}" for k, v in last.items() if k.startswith("val_")]
        if self.warnings:
            parts.append(f"{len(self.warnings)} warning(s): {self.warnings[-1]}")
        if self.error is not None:
            parts.append(f"error: {str(self.error).splitlines()[0]}")
        return " | ".join(parts)

    def __repr__(self) -> str:
        return f"<Run {self.summary()}>"
