"""A run whose workers' engine died started again by its backend on the engines left (the
"restart" operation of a mode, `nbdist.modes.ModeSpec`: `--mode sync`'s ranks left go on
from the state they hold, nbdist.modes.sync.backend; `--mode pipeline`'s stages start again
from the latest epoch end's weights, the lost one on a free engine,
nbdist.modes.pipeline.runtime).

The run's monitor calls `restart` when the run would fail; the backend says whether the
failure is one it starts again after, and does it (it tells the hub who is out). Here the
kernel reports it: a `run.events` row (what was lost, the ranks that go on, how long it took)
and a `run.warnings` line, as for a hub shard taken over (nbdist.run.takeover).
"""

from __future__ import annotations

import logging
import time

from nbdist.errors import NbdistError
from nbdist.modes import mode_spec

log = logging.getLogger(__name__)


def restart(run, failure: BaseException) -> bool:
    """The run would fail with `failure`: True if its backend started its workers again on the
    engines left (the run goes on), False if the failure is the run's. The backend's event
    carries a `summary`, the sentence `run.warnings` gets."""
    state = run.state
    if (not mode_spec(state.config.mode).supports("restart") or state.stop_requested
            or state.control is None or state.control.closed):
        return False
    seen = time.monotonic()
    try:
        row = state.backend.restart(state.control)
    except NbdistError as exc:  # e.g. the ranks left failed their network check: the run fails
        log.warning("run %s: could not start the workers again: %s", state.run_id, exc)
        raise exc from failure
    if row is None:
        return False
    took = time.monotonic() - seen
    summary = row.pop("summary")
    row = {"time": state.snapshot.get("elapsed", 0.0),
           "step": state.snapshot.get("global_step", 0), **row, "recovery_s": round(took, 2)}
    state.recoveries.append(row)
    state.warnings.append(f"{summary}; training went on after {took:.1f} s.")
    log.warning("run %s: %s", state.run_id, state.warnings[-1])
    return True
