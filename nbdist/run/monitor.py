"""A Run's monitor thread: polls the coordinating hub, watches the workers' engines, reports
lost workers, takes periodic checkpoints, and at the end writes the trained weights into the
notebook's model, frees the engines and calls the run's done callbacks. It fills in the run's
state (`nbdist.run.state`); `absorb` is its one step for each hub snapshot."""

from __future__ import annotations

import logging
import threading
import time

from nbdist.errors import NbdistError, TrainingError, WorkersLostError
from nbdist.run.control import auto_checkpoint
from nbdist.run.state import RunState

log = logging.getLogger("nbdist.run.handle")

POLL_S = 0.25  # how often the kernel asks the hub for statistics
TIMELINE_EVERY_S = 2.0  # how often it also fetches the (bounded, down-sampled) timeline


def start(run) -> None:
    """Watch `run` (begun: its state has a backend and a control) on a thread of its own."""
    name = f"nbdist-run-{run.state.run_id}"
    threading.Thread(target=watch, args=(run,), daemon=True, name=name).start()


def watch(run) -> None:
    """The monitor loop, until the run ends; never raises (the error goes into the state)."""
    state = run.state
    control, backend = state.control, state.backend
    last_answer = time.monotonic()
    try:
        while True:
            failure = backend.failure()
            if failure is not None:
                raise failure
            for worker, why in backend.newly_lost():
                _report_lost(state, worker, why)
            if state.config.elastic:  # engines that joined the cluster become workers
                from nbdist.run.elastic import admit_joined

                admit_joined(run)
            try:
                want_timeline = time.monotonic() - state.timeline_at > TIMELINE_EVERY_S
                snap = control.stats(since=len(state.rows), timeline=want_timeline)
                last_answer = time.monotonic()
            except TrainingError:
                if time.monotonic() - last_answer > state.config.timeout:
                    raise
                continue
            absorb(run, snap)
            if snap.get("error"):
                raise TrainingError(f"The hub failed: {snap['error']}")
            if snap.get("finished"):
                absorb(run, control.stats(since=len(state.rows), timeline=True))
                _check_survivors(state)
                auto_checkpoint(state, final=True)
                break
            auto_checkpoint(state)
            time.sleep(POLL_S)
        from nbdist.engine.flatmodel import write_flat

        params, non_trainable = backend.final_params(control)
        write_flat(state.model, params, non_trainable)
        state.status = "stopped" if state.stop_requested else "finished"
    except BaseException as exc:  # noqa: BLE001 - stored and re-raised by wait()
        ours = isinstance(exc, NbdistError)
        state.error = exc if ours else TrainingError(f"The run failed: {exc!r}")
        state.status = "failed"
        _abort(state)
    finally:
        _cleanup(state)
        with state.end_lock:
            state.ended.set()
            callbacks, state.done_callbacks = state.done_callbacks, []
        notify(run)
        for fn in callbacks:
            call_back(run, fn)


def absorb(run, snap: dict) -> None:
    """Take the hub's stats reply `snap` into the run's state, then tell the listeners."""
    state = run.state
    state.rows.extend(snap.pop("history", []))
    if "timeline" in snap:
        state.timeline = snap.pop("timeline")
        state.timeline_at = time.monotonic()
        state.timeline_revision += 1
    state.traffic.update(snap.get("nodes", []), time.monotonic())
    state.snapshot = snap
    state.revision += 1
    events = snap.get("events", [])
    for e in events[state.events_seen:]:
        if e.get("event") == "worker_lost":
            state.warnings.append(f"worker {e['worker']} was lost at step {e['step']} "
                                  f"({e.get('reason')}); the others took over its data")
    state.events_seen = len(events)
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


def call_back(run, fn) -> None:
    """Call a done callback with the run; its exception is logged, as a Future's is."""
    try:
        fn(run)
    except Exception:  # noqa: BLE001 - the run has ended either way
        log.exception("done callback %r of run %s raised", fn, run.state.run_id)


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


def _abort(state: RunState) -> None:
    """Tell the surviving workers to stop and give them a moment to leave."""
    try:
        state.control.control(stop=True)
    except NbdistError:
        return
    deadline = time.monotonic() + 15
    while state.backend.workers_running() and time.monotonic() < deadline:
        time.sleep(0.1)


def _cleanup(state: RunState) -> None:
    try:
        state.control.shutdown()
        state.backend.finish(timeout=30)
    except Exception as exc:  # noqa: BLE001 - never mask the run's own outcome
        log.warning("clean-up after run %s: %s", state.run_id, exc)
    finally:
        state.control.close()
