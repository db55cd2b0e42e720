"""Workers that join a running async job: `Run.add_workers(engines)` and `--elastic`.

Responsible for:
- refusing what cannot grow, before anything starts: sync, local and simulated runs (their
  ranks or threads are fixed at the start), a run that has ended; the backend refuses
  engines that are unknown or already in the run, and a streamed data set;
- telling the hub of each new worker before it starts. This is a kernel control op,
  `{"add_worker": id, "engine": e}`, sent to shard 0 first and then to the other shards. Shard
  0's coordinator gives the worker its per-worker state (`Coordinator.add_worker`), or refuses
  if the run is ending. The other shards then accept the new id. The op is explicit, not
  implied by the worker's hello: only the kernel decides who belongs to the run, every shard
  keeps checking ids strictly, the node shows up ("starting") before its engine has even run
  the cell, and the run waits for it to finish instead of ending under it;
- `--elastic`: the run's monitor thread adds engines that register with the cluster while the
  run trains (`client.ids` grew). A failure there becomes a warning, never a failed run.

Kernel side only, through the `Backend` protocol (the async backend starts the workers:
nbdist/modes/async_ps/backend.py); the hub's part is in nbdist/hub/server.py (`Hub._control`) and
nbdist/core/coordinator.py.
"""

from __future__ import annotations

import logging

from nbdist.errors import NbdistError, TrainingError
from nbdist.modes import refuse_operation

log = logging.getLogger(__name__)


def add_workers(run, engines) -> list[int]:
    """Start workers on `engines` for `run` (see `Run.add_workers`); returns their worker ids."""
    refuse_operation(run.config.mode, "add_workers", f"run.add_workers({list(engines)})")
    backend, control = run.state.backend, run.state.control
    if run.ended() or control is None or backend is None:
        raise TrainingError(f"The run is {run.status}, so it takes no new workers (Received: "
                            f"run.add_workers({list(engines)})). Start a new run with more "
                            "--workers, or with --elastic to take in engines as they join.")
    return backend.add_workers(list(engines), lambda worker, engine: control.control(
        add_worker=int(worker), engine=int(engine)))


def admit_joined(run) -> list[int]:
    """--elastic: add the engines that joined the cluster since the last look (called by the
    run's monitor thread on every poll). Returns the new worker ids."""
    joined = run.state.backend.joined_engines()
    if not joined:
        return []
    try:
        workers = add_workers(run, joined)
    except NbdistError as exc:  # e.g. the run is ending, or the host cannot reach the hub
        note = (f"--elastic: engine(s) {joined} joined the cluster but were not added: "
                f"{str(exc).splitlines()[0]}")
        log.warning("run %s: %s", run.run_id, note)
        run.warnings.append(note)
        return []
    log.info("run %s: --elastic added worker(s) %s on engine(s) %s", run.run_id, workers, joined)
    return workers
