"""What a run needs from the place its hubs and workers run: the `Backend` protocol.

Every mode's backend implements all of it, explicitly (the cluster's in nbdist/modes/async_ps,
the sync ranks' in nbdist/modes/sync, the kernel threads' in nbdist/modes/local, the virtual
cluster's in nbdist/modes/simulate, the stages' in nbdist/modes/pipeline), so neither the
mode's start (nbdist/modes/common/launch.py) nor the Run (handle, control, monitor) asks a
backend what it can do; tests/unit/test_layering.py checks each. What a backend cannot do it
refuses with an error that says so.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class Backend(Protocol):
    """The hubs' and workers' side of a run, as the mode's start and the Run use it."""

    num_workers: int
    cluster: object | None  # the Cluster that tracks the run (its stop() ends it); None: kernel

    # -- starting (the mode's start) ------------------------------------------------------------

    def start_hubs(self, specs: list) -> list[dict]:
        """Serve one hub shard per `nbdist.hub.server.HubSpec`; returns their endpoints."""
        ...

    def start_workers(self, base) -> None:
        """Start the workers from `base`, the mode's spec: a worker spec with the run's fields
        (a pipeline: one StageSpec per stage; a simulation: None)."""
        ...

    def hub_places(self, endpoints: list[dict]) -> list[dict]:
        """Where each hub shard runs (`run.hubs`): shard, host, engine (none: no hub process)."""
        ...

    # -- while it trains (the Run) --------------------------------------------------------------

    def failure(self) -> BaseException | None:
        """The error that ends the run (a worker or rank that raised), or None."""
        ...

    def newly_lost(self) -> list[tuple[int, str]]:
        """(worker, why) for each worker lost since the last call, while the run goes on."""
        ...

    def written_off(self, worker: int) -> None:
        """The hub wrote `worker` off (silent, or not reading its replies): its end is not the
        run's failure, and a task of it that still runs is stopped, freeing its engine."""
        ...

    def workers_running(self) -> bool:
        """Whether any worker is still training (or leaving)."""
        ...

    def current_weights(self, control) -> tuple[np.ndarray, np.ndarray]:
        """The model's flat parameters and non-trainable state now, while the run trains."""
        ...

    def checkpoint_state(self, control, final: bool) -> list:
        """Every shard's state for a checkpoint (nbdist.checkpoint.store.save)."""
        ...

    def optimizer_state(self, control, final: bool):
        """The run's optimizer state now (`final`: at its end), as an
        `nbdist.fit.optimizer_state.OptimizerState`, for a callback that saves the whole
        model; None where there is none to give (the workers keep it, or the run's monitor kept
        it at the last epoch's end)."""
        ...

    def add_workers(self, engines: list[int], announce: Callable[[int, int], None]) -> list[int]:
        """Start workers on more engines while the run trains; returns their ids."""
        ...

    def take_over_shards(self, restores: dict[int, tuple],
                         moved: Callable[[dict[int, dict], dict[int, str], dict[int, int]], None]
                         ) -> list[dict] | None:
        """Start each lost hub shard anew (`restores`: shard -> (params, non-trainable state,
        `HubSpec.restore`), from the kernel's snapshot) on a free engine, or a worker's engine
        (that worker out of the run), and the workers again towards it; `moved(endpoints by
        shard, workers out by why, workers added mid-run by engine)` is called once the new
        shards serve, before the workers start. Returns `hub_places` of every shard, or None
        when every shard in `restores` turns out to be serving still (silent, not lost)."""
        ...

    def restart(self, control) -> dict | None:
        """A worker's engine died: start the workers again on the engines left, from the latest
        state (a mode with the "restart" operation; nbdist.run.restart). Returns the event's
        fields, or None when the failure is not one it starts again after."""
        ...

    def joined_engines(self) -> list[int]:
        """Engines that joined the cluster since the last call (--elastic)."""
        ...

    def worker_results(self) -> dict[int, object]:
        """What each worker (sync: rank; pipeline: stage) returned, by id, for those that have
        returned; {} where workers return nothing (simulate). `run.worker_results`."""
        ...

    # -- at the end (the Run's monitor) ---------------------------------------------------------

    def final_params(self, control) -> tuple[np.ndarray, np.ndarray]:
        """The trained flat parameters and non-trainable state, once training ended."""
        ...

    def finish(self, timeout: float) -> None:
        """Wait for the workers and the hubs to leave (clean-up; never raises for a late one)."""
        ...


def returned(tasks) -> dict[int, object]:
    """The value of each task (an ipyparallel AsyncResult, or a future alike) that has returned,
    by its id (`tasks`: a dict, or a list indexed by id); one that failed or runs is left out."""
    items = tasks.items() if isinstance(tasks, dict) else enumerate(tasks)
    return {i: task.get(0) for i, task in list(items) if task.ready() and task.successful()}
