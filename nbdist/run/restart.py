"""A run whose workers' engine died started again by its backend on the engines left (the
"restart" operation of a mode, `nbdist.modes.ModeSpec`; `--mode sync`: the ranks left go on
from the state they hold, nbdist.modes.sync.backend).

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
    engines left (the run goes on), False if the failure is the run's."""
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
    note = row.pop("note", None)
    row = {"time": state.snapshot.get("elapsed", 0.0),
           "step": state.snapshot.get("global_step", 0), **row, "recovery_s": round(took, 2)}
    state.recoveries.append(row)
    lost = ", ".join(str(r) for r in row["lost_ranks"])
    engines = ", ".join(str(e) for e in row["engines"])
    state.warnings.append(
        f"rank(s) {lost} were lost (engine(s) {engines} died); the {row['ranks']} rank(s) left "
        f"started again in {took:.1f} s from the last step every rank had applied (epoch "
        f"{row['epoch'] + 1}, {row['offset']} samples into it), so no update was lost, each "
        f"with a batch of {row['batch_size']}" + (f" ({note})" if note else "")
        + ".")
    log.warning("run %s: %s", state.run_id, state.warnings[-1])
    return True
