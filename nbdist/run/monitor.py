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
# A run whose hub is gone fails within --timeout plus the bounded waits of its ending
# (docs/architecture.md, "Faults"): it asks the hub to stop once (ENDING_REQUEST_S) unless its
# silence said it already, gives the workers GONE_FINISH_S to leave, then interrupts them (the
# async backend's finish: INTERRUPT_WAIT_S, JOIN_MIN_S per hub shard). Sooner when a worker saw
# the hub go (on one host its line closes at once): the kernel checks the workers every second.
ENDING_REQUEST_S = 5.0  # how long a failed run's stop and shutdown wait for the hub's answer
GONE_FINISH_S = 2.0  # with the hub gone, how long the workers get before they are interrupted
FINISH_S = 30.0  # otherwise


class _Failed(Exception):  # noqa: N818 - carries a worker's error out of the wait for the hub
    def __init__(self, error: BaseException):
        super().__init__(str(error))
        self.error = error


class RunMonitor:
    """The monitor loop of a `Run` (see `nbdist.run.handle`)."""

    def _monitor(self) -> None:
        control, backend = self._control, self._backend
        last_answer = time.monotonic()
        hub_gone = False  # nothing more to ask it: the ending does not wait for its answers
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
                    left = self.config.timeout - (time.monotonic() - last_answer)  # never past it
                    snap = control.stats(since=len(self._rows), timeline=want_timeline,
                                         timeout=max(0.05, left),
                                         during=self._check_workers)  # a worker saw the hub go?
                    last_answer = time.monotonic()
                except _Failed as failed:
                    raise failed.error from None
                except TrainingError:
                    if time.monotonic() - last_answer >= self.config.timeout:
                        hub_gone = True
                        raise self._hub_lost() from None
                    continue
                self._absorb(snap)
                for worker in snap.get("lost", []):  # its engine must not stay busy (hung?)
                    backend.written_off(worker)
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
            control.cap_timeout(ENDING_REQUEST_S)
            hub_gone = hub_gone or not self._abort()
        finally:
            self._cleanup(hub_gone)
            self._done.set()
            self._notify()

    def _check_workers(self) -> None:
        """While the kernel waits for the hub: a worker (or rank, or stage) that raised ends
        the run now (on one host the workers see a dead hub's line close at once)."""
        failure = self._backend.failure()
        if failure is not None:
            raise _Failed(failure)

    def _hub_lost(self) -> TrainingError:
        timeout = self.config.timeout
        return TrainingError(
            f"The hub did not answer for {timeout:.0f}s (--timeout {timeout:g}; Received: no "
            "reply): its process or its engine has died, or its host cannot be reached. The run "
            "failed and its workers were stopped. Check the engines with %nbdist status, then run "
            "the cell again (with --checkpoint-dir, nbdist.resume continues from the last "
            "checkpoint).")

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

    def _abort(self) -> bool:
        """Tell the surviving workers to stop and give them a moment to leave; False if the hub
        did not answer (it is gone: the workers are stopped by the backend's finish)."""
        try:
            self._control.control(stop=True)
        except NbdistError:
            return False
        deadline = time.monotonic() + 15
        while self._backend.workers_running() and time.monotonic() < deadline:
            time.sleep(0.1)
        return True

    def _cleanup(self, hub_gone: bool = False) -> None:
        try:
            if not hub_gone:
                self._control.shutdown()
            self._backend.finish(timeout=GONE_FINISH_S if hub_gone else FINISH_S)
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

