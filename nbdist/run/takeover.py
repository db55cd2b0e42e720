"""A lost hub shard started anew from the kernel's latest snapshot of it (`--mode async`).

Responsible for:
- the snapshots: every `NBDIST_HUB_SNAPSHOT_S` seconds (2 by default; 0: none), or 50 times
  as long as the last one took (a large model's), the run's monitor asks every shard for its
  checkpoint state (`HubControl.state`: what a checkpoint saves, `ShardCore.export`, as signed
  numbers and float32 frames; nothing is unpickled) and keeps the latest in the kernel
  (`Snapshot`), off every engine;
- finding what is lost when the run would fail (a worker raised, or a shard went silent): the
  shards that do not answer within `PROBE_S` and whose engine does not say they still serve.
  A failure with every shard serving is the run's failure, as before;
- the takeover: the backend halts the workers, starts each lost shard from its snapshot on a
  free engine (or, with none free, a worker's engine: that worker is written off), and starts
  the workers again towards the new shard; the kernel's line follows it, the new process is
  told what the others were told before it (workers added or lost), and `run.events` gets a
  `shard_taken_over` row with what was lost: the updates the shard applied after the snapshot.

A lost shard with no snapshot yet, or no engine to take it, still fails the run, with an error
that says what is missing.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from nbdist.checkpoint.store import shard_restore
from nbdist.env import switch
from nbdist.errors import NbdistError, TrainingError
from nbdist.modes import mode_spec

log = logging.getLogger(__name__)
PROBE_S = 3.0  # a shard silent this long, asked when the run would fail, is lost
COST_SHARE = 0.02  # snapshots take at most this share of the time (a large model's: less often)


@dataclass
class Snapshot:
    """Every shard's state (`HubControl.state` replies) at one moment, as the kernel keeps it."""

    shards: list  # [(ShardState, [arrays])], by shard
    taken_at: float  # monotonic
    step: int  # the run's global step at the last poll before it

    def version(self, shard: int) -> int:
        return int(self.shards[shard][0].version)


def snapshot_every() -> float:
    """Seconds between two snapshots; 0: none (`NBDIST_HUB_SNAPSHOT_S`)."""
    return float(switch("NBDIST_HUB_SNAPSHOT_S"))


def enabled(state) -> bool:
    """Whether this run keeps snapshots: a mode whose backend can take a shard over."""
    return snapshot_every() > 0 and mode_spec(state.config.mode).supports("take_over")


def maybe_snapshot(state) -> None:
    """Take a snapshot when the next is due (the monitor calls this each poll): every
    `snapshot_every()` seconds, or, for a model so large that one takes long, 1 / COST_SHARE
    times as long as the last one took (the shards answer between two pushes, and the kernel
    checks and copies every byte). One that fails keeps the previous (a shard that is gone is
    the takeover's business)."""
    now = time.monotonic()
    if not enabled(state) or now < state.hub_snapshot_next:
        return
    try:
        shards = state.control.state()
    except NbdistError as exc:
        log.info("run %s: no snapshot of the hub this time: %s", state.run_id, exc)
        state.hub_snapshot_next = now + snapshot_every()
        return
    took = time.monotonic() - now
    state.hub_snapshot_next = now + max(snapshot_every(), took / COST_SHARE)
    state.hub_snapshot = Snapshot(shards, now, int(state.snapshot.get("global_step", 0)))


def recover(run, error: BaseException) -> bool:
    """The run would fail with `error`: if hub shards are lost, start them anew from the
    latest snapshot and return True (the run goes on); False if every shard answers (the
    error is the run's). Raises TrainingError when a lost shard cannot be taken over."""
    state = run.state
    if not enabled(state) or state.control is None or state.control.closed:
        return False
    seen = time.monotonic()  # when the loss showed (the probe below takes a while)
    lost = state.control.unanswered(PROBE_S)
    if not lost:
        return False
    names = ", ".join(str(i) for i in lost)
    snap = state.hub_snapshot
    if snap is None:
        raise TrainingError(
            f"Hub shard(s) {names} were lost ({_first_line(error)}) before the kernel held a "
            "snapshot of them (the first is taken at the kernel's first poll of the hub), so none "
            "could be started anew. Expected a snapshot to take them over from. Run the cell "
            "again (with --checkpoint-dir, nbdist.resume continues from the last checkpoint).")
    reached = list(state.control.versions)
    restores = {i: shard_restore(*snap.shards[i]) for i in lost}
    if 0 in restores:  # the new coordinator must not pause again at --pause-at's step
        restores[0][2]["paused_at"] = any(e.get("event") == "pause" and e.get("reason") ==
                                          "--pause-at" for e in state.snapshot.get("events", []))
    log.warning("run %s: hub shard(s) %s silent (%s); those gone start anew from the snapshot of "
                "%.1f s before it showed", state.run_id, names, _first_line(error),
                seen - snap.taken_at)

    replaced: list[int] = []  # the shards started anew
    gone: dict[int, str] = {}  # the workers out of the run (not started again)

    def moved(endpoints: dict[int, dict], out: dict[int, str], added: dict[int, int]) -> None:
        """The new shards serve: the kernel's line follows them, and each learns who is in the
        run (workers added mid-run, workers out of it) before the workers come back."""
        control = state.control
        replaced.extend(sorted(endpoints))
        gone.update(out)
        if 0 in endpoints:  # the new coordinator counts from 0: the kernel keeps the old one's
            state.earlier_hub = {key: state.snapshot.get(key, {} if key == "epoch_metrics" else [])
                                 for key in ("events", "evals", "epoch_metrics")}
            state.rows_base = len(state.rows)
        for shard, endpoint in sorted(endpoints.items()):
            control.replace_shard(shard, endpoint)
        for shard in sorted(endpoints):
            for worker, engine in sorted(added.items()):
                control.tell(shard, add_worker=worker, engine=engine)
            for worker, why in sorted(out.items()):
                control.tell(shard, lost=worker, reason=why[:200])
        if 0 in endpoints:  # the control state the new coordinator would not know of
            if control.paused:  # (as the kernel last knew it: polled, or sent since)
                control.tell(0, paused=True)
            if state.stop_requested:
                control.tell(0, stop=True)
        taken = {w: why for w, why in out.items() if why.startswith(TAKEN)}
        for worker, why in sorted(taken.items()):  # the shards that lived on: written off too
            for shard in range(len(control.lines)):
                if shard not in endpoints:
                    control.tell(shard, lost=worker, reason=why)

    control = state.control
    # shard 0 lives on (it answers): paused, it writes off none of the workers, silent while
    # they start again (a new shard 0 knows of none of them yet)
    hold, hellos = False, []
    try:
        now0 = control.coordinator_stats(timeout=PROBE_S)
        restores.pop(0, None)  # it answers: slow a moment ago, not lost
        if not now0.get("paused"):
            control.tell(0, timeout=PROBE_S, paused=True)
            hold, hellos = True, [n.get("hellos", 0) for n in now0.get("nodes", [])]
    except NbdistError:
        pass
    if not restores:
        if hold:
            control.tell(0, paused=False)
        return False
    places = state.backend.take_over_shards(restores, moved)
    if hold and 0 not in replaced:
        if places is not None:
            _wait_rejoined(control, hellos, [w for w in range(len(hellos)) if w not in gone])
        control.tell(0, paused=False)
    if places is None:
        return False
    state.hubs = places
    recovery_s = time.monotonic() - seen
    for i in replaced:
        behind = None if reached[i] is None else max(0, int(reached[i]) - snap.version(i))
        row = {"time": state.snapshot.get("elapsed", 0.0), "step": state.snapshot.get(
                   "global_step", snap.step), "event": "shard_taken_over", "shard": i,
               "engine": places[i]["engine"], "snapshot_age_s": round(seen - snap.taken_at, 2),
               "updates_lost": behind, "recovery_s": round(recovery_s, 2),
               "reason": _first_line(error)[:200]}
        state.recoveries.append(row)
        state.warnings.append(
            f"hub shard {i} was lost ({_first_line(error)[:120]}); engine {row['engine']} took it "
            f"over from the snapshot of {row['snapshot_age_s']:g} s before the loss showed, so "
            + (f"the {behind} update(s) it applied after that were lost"
               if behind is not None else "the updates it applied after that were lost")
            + f"; training went on after {recovery_s:.1f} s")
    log.warning("run %s: %s", state.run_id, state.warnings[-1])
    return True


REJOIN_WAIT_S = 60.0  # how long a living shard 0 stays paused for the workers to start again


def _hellos(control) -> list[int]:
    """How many processes of each worker said hello to shard 0 so far."""
    return [n.get("hellos", 0) for n in control.coordinator_stats().get("nodes", [])]


def _wait_rejoined(control, before: list[int], workers: list[int]) -> None:
    """Until each of `workers`, started again, has said hello to the paused shard 0 (more
    hellos than `before`), REJOIN_WAIT_S at most: only then may its silence count again."""
    deadline = time.monotonic() + REJOIN_WAIT_S
    while time.monotonic() < deadline:
        try:
            now = _hellos(control)
        except NbdistError:
            return  # shard 0 is gone too: the monitor's next poll finds out
        if all(w < len(now) and now[w] > (before[w] if w < len(before) else 0)
               for w in workers):
            return
        time.sleep(0.2)


TAKEN = "its engine took over hub shard"  # why a worker whose engine a lost shard took is out


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
