"""The Run's monitor thread: polls the coordinating hub, watches the workers' engines,
reports lost workers, takes periodic checkpoints, and at the end writes the trained weights
into the notebook's model and frees the engines."""

from __future__ import annotations

import logging
import time

from nbdist.errors import NbdistError, TrainingError, WorkersLostError
from nbdist.hub.client import HubControl

log = logging.getLogger("nbdist.run.handle")

POLL_S = 0.25  # how often the kernel asks the hub for statistics
TIMELINE_EVERY_S = 2.0  # how often it also fetches the (bounded, down-sampled) timeline


class RunMonitor:
    """The monitor loop of a `Run` (see `nbdist.run.handle`)."""

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
                if self.config.elastic:  # engines that joined the cluster become workers
                    from nbdist.modes.async_ps.elastic import admit_joined

                    admit_joined(self)
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
            from nbdist.engine.flatmodel import write_flat

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
        """A worker's engine died (or a worker added mid-run failed): the hub hands its work to
        the others at once."""
        reason = "engine died" if "EngineError" in why else why.splitlines()[0][:200]
        log.warning("nbdist run %s: worker %d stopped (%s); training goes on without it",
                    self.run_id, worker, why.splitlines()[0])
        try:
            control.control(lost=worker, reason=reason)
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
            if self._checkpoint_folder is not None:  # another run may save there now
                self._checkpoint_folder.release()

    def _absorb(self, snap: dict) -> None:
        self._rows.extend(snap.pop("history", []))
        if "timeline" in snap:
            self._timeline = snap.pop("timeline")
            self._timeline_at = time.monotonic()
            self.timeline_revision += 1
        self._traffic.update(snap.get("nodes", []), time.monotonic())
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

