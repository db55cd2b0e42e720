"""A Run's monitor thread: polls the coordinating hub, watches the workers' engines, reports
lost workers, takes periodic checkpoints, and at the end writes the trained weights into the
notebook's model, frees the engines and completes the run's Future (`conclude`: its result,
its error; the Future then calls the done callbacks, here). It fills in the run's state
(`nbdist.run.state`); `absorb` is its one step for each hub snapshot."""

from __future__ import annotations

import logging
import math
import re
import threading
import time
from concurrent.futures import Future

from nbdist.checkpoint.sync_state import RankEndedError
from nbdist.core.liveness import RunningClock
from nbdist.core.traffic import TrafficRates
from nbdist.engine.flat_layout import write_flat
from nbdist.errors import NbdistError, TrainingError, WorkersLostError
from nbdist.modes import mode_spec
from nbdist.run.control import auto_checkpoint
from nbdist.run.elastic import admit_joined
from nbdist.run.restart import restart
from nbdist.run.result import run_history
from nbdist.run.state import RunState
from nbdist.run.takeover import maybe_snapshot, recover

log = logging.getLogger("nbdist.run.handle")

POLL_S = 0.25  # how often the kernel asks the hub for statistics
# with a fit call the workers wait at each epoch's end until this kernel has seen it and run the
# callbacks: a poll due sooner than POLL_S is made when the epoch is due to end (`poll_pause`)
MIN_POLL_S = 0.01
FAST_WINDOW_S = 1.0  # how long after an epoch's start the monitor polls every MIN_POLL_S
POLL_COST_RATIO = 10  # a poll waits at least this many times as long as the last one took
TIMELINE_EVERY_S = 2.0  # how often it also fetches the (bounded, down-sampled) timeline
# A run whose hub is gone fails within --timeout plus the bounded waits of its ending
# (docs/architecture.md, "Faults"): it asks the hub to stop once (ENDING_REQUEST_S) unless its
# silence said it already, gives the workers GONE_FINISH_S to leave, then interrupts them (the
# engine backends' finish: INTERRUPT_WAIT_S, JOIN_MIN_S per hub shard). Sooner when a worker saw
# the hub go (on one host its line closes at once): the kernel checks the workers every second.
ENDING_REQUEST_S = 5.0  # how long a failed run's stop and shutdown wait for the hub's answer
GONE_FINISH_S = 2.0  # with the hub gone, how long the workers get before they are interrupted
FINISH_S = 30.0  # otherwise


class _Failed(Exception):  # noqa: N818 - carries a worker's error out of the wait for the hub
    def __init__(self, error: BaseException):
        super().__init__(str(error))
        self.error = error


def start(run) -> None:
    """Watch `run` (begun: its state has a backend and a control) on a thread of its own."""
    name = f"nbdist-run-{run.state.run_id}"
    threading.Thread(target=watch, args=(run,), daemon=True, name=name).start()


def watch(run) -> None:
    """The monitor loop, until the run ends; never raises (the error goes into the state)."""
    state = run.state
    control, backend = state.control, state.backend
    # the hub's silence counts only while this kernel ran: a suspended laptop is not a lost hub
    running = RunningClock()
    now = lambda: running.read(time.monotonic())  # noqa: E731
    last_answer = now()
    hub_gone = False  # nothing more to ask it: the ending does not wait for its answers
    gated = state.fit_call_returned is not None  # a fit call: the epochs wait for this kernel
    pace = EpochPace()
    try:
        while True:
            failure = backend.failure()
            if failure is not None:
                if not survive(run, failure):
                    raise failure
                last_answer = now()
                continue
            for worker, why in backend.newly_lost():
                _report_lost(state, worker, why)
            if state.config.elastic:  # engines that joined the cluster become workers

                admit_joined(run)
            try:
                want_timeline = time.monotonic() - state.timeline_at > TIMELINE_EVERY_S
                left = state.config.timeout - (now() - last_answer)  # never past it
                asked = time.monotonic()
                snap = control.stats(since=len(state.rows) - state.rows_base,
                                     timeline=want_timeline, timeout=max(0.05, left), clock=now,
                                     during=lambda: _check_workers(backend))  # saw the hub go?
                last_answer = now()
            except _Failed as failed:
                if not survive(run, failed.error):
                    raise failed.error from None
                last_answer = now()
                continue
            except TrainingError as silent:
                if survive(run, silent):
                    last_answer = now()
                    continue
                if now() - last_answer >= state.config.timeout:
                    hub_gone = True
                    raise _hub_lost(state.config.timeout, silent) from None
                continue
            absorb(run, snap)
            took = time.monotonic() - asked  # the poll's own cost: it grows with a long run
            ended = _last_epoch_ended(snap)
            if ended is not None and ended != state.kept_epoch:
                state.kept_epoch = ended  # what a failure later leaves in the model:
                keep(state, f"step {snap.get('global_step', 0)}, after epoch {ended + 1} ended")
            for worker in snap.get("lost", []):  # its engine must not stay busy (hung?)
                backend.written_off(worker)
            if snap.get("error"):
                raise TrainingError(f"The hub failed: {snap['error']}")
            if snap.get("finished"):
                absorb(run, control.stats(since=len(state.rows) - state.rows_base,
                                          timeline=True))
                _check_survivors(state)
                auto_checkpoint(state, final=True)
                break
            auto_checkpoint(state)
            maybe_snapshot(state)
            now_s = time.monotonic()
            pace.seen(now_s, float(snap.get("epochs_done", 0.0)))
            time.sleep(pace.pause(now_s, state.released_at, took) if gated else POLL_S)

        params, non_trainable = backend.final_params(control)
        state.final_weights = (params, non_trainable)
        if state.write_model:  # (a cell's fit call writes each epoch's weights itself)
            write_flat(state.model, params, non_trainable)
            if state.settle_model is not None:
                state.settle_model(state.model)
        state.status = "stopped" if state.stop_requested else "finished"
    except BaseException as exc:  # noqa: BLE001 - stored and re-raised by wait()
        ours = isinstance(exc, NbdistError)
        state.error = exc if ours else TrainingError(f"The run failed: {exc!r}")
        state.status = "failed"
        control.cap_timeout(ENDING_REQUEST_S)
        hub_gone = hub_gone or not _abort(state)
        if not hub_gone:  # the workers have stopped: the newest weights there are
            keep(state, f"step {state.snapshot.get('global_step', 0)}, when the run failed")
        _leave_kept(state)
    finally:
        _cleanup(state, hub_gone)
        conclude(run)


def survive(run, failure: BaseException) -> bool:
    """Whether the run goes on after `failure`: a lost hub shard started anew
    (nbdist.run.takeover), or the workers started again on the engines left
    (nbdist.run.restart)."""
    return recover(run, failure) or restart(run, failure)


class EpochPace:
    """When to poll next in a run whose epochs wait for this kernel (a fit call), so that the
    workers wait less at each epoch's end: right after the kernel let an epoch start, every
    MIN_POLL_S for a short epoch's length (FAST_WINDOW_S); later, when the progress the polls
    saw (epochs done, a float) says the epoch is due to end, if that is sooner than POLL_S.

    Example:
        >>> pace = EpochPace(); pace.seen(0.0, 0.5); pace.seen(1.0, 0.9)
        >>> round(pace.pause(now=1.0, released_at=-5.0), 3)  # 0.4 epoch/s, 0.1 left: 0.25 s
        0.25
        >>> pace.seen(1.1, 0.94); round(pace.pause(now=1.1, released_at=-5.0), 3)  # 0.06 left
        0.15
        >>> pace.pause(now=1.1, released_at=0.9)  # an epoch just started: a short one may end
        0.01
    """

    def __init__(self):
        self._last: tuple[float, float] | None = None
        self._rate = 0.0  # epochs per second, between the last two polls that saw progress

    def seen(self, now: float, epochs_done: float) -> None:
        if self._last is not None and epochs_done > self._last[1] and now > self._last[0]:
            self._rate = (epochs_done - self._last[1]) / (now - self._last[0])
        if self._last is None or epochs_done != self._last[1]:
            self._last = (now, epochs_done)

    def pause(self, now: float, released_at: float, poll_s: float = 0.0) -> float:
        """Seconds until the next poll; `poll_s`, what the last poll took, keeps the kernel's
        polling under a tenth of its time (a long run's statistics grow)."""
        return min(POLL_S, max(POLL_COST_RATIO * poll_s, self._due(now, released_at)))

    def _due(self, now: float, released_at: float) -> float:
        if now - released_at < FAST_WINDOW_S:
            return MIN_POLL_S
        if self._last is None or self._rate <= 0:
            return POLL_S
        done = self._last[1]
        left = math.floor(done) + 1 - done  # of the epoch under way (1: one just ended)
        return max(MIN_POLL_S, left / self._rate - (now - self._last[0]))


def conclude(run) -> None:
    """The run's end, once, on its monitor thread (training is over, the engines are free):
    mark it ended, tell the listeners, then complete its Future: with the run's error if it
    failed, else with its History (`nbdist.run.result`), a cell's fit call's once that call
    has returned. Completing it calls the done callbacks, here; a failing one is logged."""
    state = run.state
    state.ended.set()
    notify(run)
    if state.fit_call_returned is not None:  # its History (the kernel writes the last epochs)
        state.fit_call_returned.wait()
    if state.error is not None:
        Future.set_exception(run, state.error)  # (Run refuses these to anyone else)
        return
    try:
        history = run_history(state)
    except Exception as exc:  # noqa: BLE001 - the Future must complete, whatever happens
        log.warning("run %s: could not build its History: %s", state.run_id, exc)
        Future.set_exception(run, TrainingError(
            f"The run {state.status}, but its keras.callbacks.History could not be built "
            f"(Received: {exc!r}). The model holds its weights; run.history has its rows."))
        return
    Future.set_result(run, history)


def keep(state: RunState, label: str) -> None:
    """Fetch the run's weights and checkpoint state now and keep them in the kernel, so a
    failure later (a lost hub, every worker gone) does not throw the training away; a fetch
    that fails keeps the previous copy."""
    try:
        params, non_trainable = state.backend.current_weights(state.control)
    except Exception as exc:  # noqa: BLE001 - a copy is a safety net, never a failure
        log.info("run %s: could not keep the weights of %s: %s", state.run_id, label, exc)
        return
    shards = None
    if mode_spec(state.config.mode).supports("checkpoint"):  # (simulate replays from its seed)
        try:
            shards = state.backend.checkpoint_state(state.control, False)
        except Exception as exc:  # noqa: BLE001 - (as above) the weights alone still serve
            # once every worker has ended, or a sync rank 0 has (it sends no more state, and
            # its other ranks may still be returning), the final weights follow at once:
            # nothing the user must know
            ended = isinstance(exc, RankEndedError) or not state.backend.workers_running()
            level = logging.INFO if ended else logging.WARNING
            log.log(level, "run %s: could not keep the state of %s: %s", state.run_id, label, exc)
    state.kept = (params, non_trainable, shards, label)


def _leave_kept(state: RunState) -> None:
    """A failed run: the notebook's model gets the latest weights kept (never the cell's
    initial ones), and the error says from when they are."""
    if state.kept is None:
        note = ("The notebook's model keeps the cell's initial weights: the run failed before "
                "the kernel held any of its training (the first epoch's end).")
    else:
        params, non_trainable, shards, label = state.kept
        note = (f"The notebook's model holds the weights of {label}"
                + ("; run.checkpoint(folder) saves them with the optimizer's state."
                   if shards is not None else "."))
        if state.write_model:  # (a cell's fit call writes each epoch's weights itself)
            try:
                write_flat(state.model, params, non_trainable)
                state.final_weights = (params, non_trainable)
            except Exception as exc:  # noqa: BLE001 - the run's own error is what is raised
                log.warning("run %s: could not write the kept weights: %s", state.run_id, exc)
                note = f"The kept weights of {label} could not be written into the model: {exc}"
    error = state.error
    if error is not None and error.args and isinstance(error.args[0], str):
        error.args = (f"{error.args[0]}\n{note}", *error.args[1:])


def _last_epoch_ended(snap: dict) -> int | None:
    ends = [e.get("epoch") for e in snap.get("events", []) if e.get("event") == "epoch_end"]
    ends = [e for e in ends if isinstance(e, int)]
    return max(ends) if ends else None


def absorb(run, snap: dict) -> None:
    """Take the hub's stats reply `snap` into the run's state, then tell the listeners."""
    state = run.state
    state.rows.extend(snap.pop("history", []))
    if state.earlier_hub:  # shard 0 was taken over: what its earlier processes sent comes first
        earlier = state.earlier_hub
        for key in ("events", "evals"):
            snap[key] = earlier.get(key, []) + snap.get(key, [])
        snap["epoch_metrics"] = {**earlier.get("epoch_metrics", {}),
                                 **snap.get("epoch_metrics", {})}
    if "timeline" in snap:
        state.timeline = snap.pop("timeline")
        state.timeline_at = time.monotonic()
        state.timeline_revision += 1
    if snap.get("virtual"):  # a simulation: its links take virtual time, not the kernel's
        TrafficRates.over_run(snap.get("nodes", []), float(snap.get("elapsed") or 0.0))
    else:
        state.traffic.update(snap.get("nodes", []), time.monotonic())
    state.snapshot = snap
    state.revision += 1
    events = snap.get("events", [])
    for e in events[state.events_seen:]:
        if e.get("event") == "worker_lost":
            state.warnings.append(f"worker {e['worker']} was lost at step {e['step']} "
                                  f"({e.get('reason')}); the others took over its data")
    state.events_seen = len(events)
    for note in snap.get("warnings", []):  # the hubs' own (e.g. /dev/shm full: over TCP)
        if note not in state.warnings:
            state.warnings.append(note)
    if state.status in ("running", "paused"):
        state.status = "paused" if snap.get("paused") else "running"
    notify(run)


def notify(run) -> None:
    """Call the run's listeners (displays) with it; a failing one is logged."""
    for listener in list(run.state.listeners):
        try:
            listener(run)
        except Exception as exc:  # noqa: BLE001 - a display must never kill training
            log.warning("run listener failed: %s", exc)


def _report_lost(state: RunState, worker: int, why: str) -> None:
    """A worker's engine died (or a worker added mid-run failed): the hub hands its work to
    the others at once."""
    reason = "engine died" if "EngineError" in why else why.splitlines()[0][:200]
    log.warning("nbdist run %s: worker %d stopped (%s); training goes on without it",
                state.run_id, worker, why.splitlines()[0])
    try:
        state.control.control(lost=worker, reason=reason)
    except NbdistError as exc:  # the hub notices the silence by itself
        log.warning("could not tell the hub that worker %d is lost: %s", worker, exc)


def _check_survivors(state: RunState) -> None:
    nodes = state.snapshot.get("nodes", [])
    lost = state.snapshot.get("lost", [])
    if nodes and len(lost) == len(nodes):
        engines = ", ".join(str(n["engine"]) for n in nodes)
        raise WorkersLostError(
            f"All {len(nodes)} workers were lost (engines {engines} died or went silent) before "
            "training finished, so there is no trained model. Check the engines with "
            "`%nbdist status` (restart them with %nbdist stop / %nbdist start N), then run the "
            "cell again.")


def _check_workers(backend) -> None:
    """While the kernel waits for the hub: a worker (or rank, or stage) that raised ends the
    run now (on one host the workers see a dead hub's line close at once)."""
    failure = backend.failure()
    if failure is not None:
        raise _Failed(failure)


def _hub_lost(timeout: float, silent: TrainingError) -> TrainingError:
    shard = re.match(r"hub shard \d+", str(silent))
    who = shard.group(0) if shard else "the hub"
    return TrainingError(
        f"The hub did not answer for {timeout:.0f}s (--timeout {timeout:g}; Received: no "
        f"reply from {who}): its process or its engine has died, or its host cannot be reached. "
        "The run failed and its workers were stopped. Check the engines with %nbdist status, "
        "then run the cell again (with --checkpoint-dir, nbdist.resume continues from the last "
        "checkpoint).")


def _abort(state: RunState) -> bool:
    """Tell the surviving workers to stop and give them a moment to leave; False if the hub
    did not answer (it is gone: the workers are stopped by the backend's finish)."""
    try:
        state.control.control(stop=True)
    except NbdistError:
        return False
    deadline = time.monotonic() + 15
    while state.backend.workers_running() and time.monotonic() < deadline:
        time.sleep(0.1)
    return True


def _cleanup(state: RunState, hub_gone: bool = False) -> None:
    try:
        if not hub_gone:
            state.control.shutdown()
        state.backend.finish(timeout=GONE_FINISH_S if hub_gone else FINISH_S)
    except Exception as exc:  # noqa: BLE001 - never mask the run's own outcome
        log.warning("clean-up after run %s: %s", state.run_id, exc)
    finally:
        state.control.close()
        if state.checkpoint_folder is not None:  # another run may save there now
            state.checkpoint_folder.release()
