"""`--mode simulate`: build the `Simulation` of a job and run it in a thread of this kernel;
`SimBackend` is its side of the `Backend` protocol."""

from __future__ import annotations

import math
import threading
import uuid
import weakref
from dataclasses import replace

import numpy as np

from nbdist.core.simclock import sim_options
from nbdist.engine.data import ArraySource, as_float32, num_rows
from nbdist.engine.flat_layout import ensure_built
from nbdist.engine.flatmodel import FlatModel
from nbdist.engine.optimizer_spec import describe_optimizer
from nbdist.errors import CheckpointError, ConfigError, DataError, TrainingError
from nbdist.fit.plan import sync_batches
from nbdist.job import Job
from nbdist.modes.common.launch import begin_run
from nbdist.modes.simulate.calibrate import describe
from nbdist.modes.simulate.simulation import Simulation
from nbdist.run.backend import Backend
from nbdist.run.handle import Run

# Compiled functions of models simulated before (a study re-running one model): tracing costs
# seconds, a simulated epoch of a small model about as much. A cache, not state: entries die
# with their model and are used only while the model's variables are unchanged.
_FLAT_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def flat_model(model, layout: dict):
    """The model's `FlatModel`, reused while the model keeps this `layout`."""
    cached = _FLAT_CACHE.get(model)
    if cached is None or cached[0] != layout:
        cached = _FLAT_CACHE[model] = (layout, FlatModel(model))
    return cached[1]


def start(job: Job, *, cluster=None, wait: bool = False) -> Run:
    """Simulate `job` on `config.workers` virtual workers; `cluster`, if any, is where
    `--sim calibrate=1` measures the model's step and the hub's round trip."""
    config, contents = job.config, job.contents
    if contents.streamed:
        raise DataError(f"--mode simulate trains in this kernel on data held in memory, but "
                        f"{contents.data[0]} is larger than --in-memory-limit. Simulate on a part "
                        f"of it ({contents.data[0]}.take(n)), or raise --in-memory-limit.")
    x, y, sw = (*contents.arrays, None)[:3]
    fit = job.fit
    if fit is not None and fit.split_batch:  # --sim sync=1: the ranks share the fit call's batch
        each, warning = sync_batches(fit.batch, config.workers or len(config.slowdown))
        config = config.replace(batch_size=each)
        job = replace(job, config=config, warnings=[*job.warnings, *([warning] if warning else [])])
    data = ArraySource(as_float32(x), y, contents.num_samples, config.seed, sw,
                       shuffle=fit.shuffle if fit is not None else True, epoch_size=job.epoch_size)
    job = job.for_workers(config.workers or len(config.slowdown))
    # the compiled metrics' variables, as every worker builds them (a fit call's private copy has
    # none yet)
    ensure_built(job.trainer_model, *data.head(2))
    options = sim_options(config.sim)
    simulation = Simulation(job.plan, job.rule_options, flat_model(job.trainer_model, job.layout),
                            data, contents.validation_arrays if fit is None else None, job.params,
                            job.non_trainable, options, config.seed, job.optimizer, job.constraints,
                            compression=config.compression, shapes=job.layout["trainable"],
                            inner_optimizer=_workers_optimizer(job) if config.local_steps > 1
                            else None, kernel_eval=_kernel_eval(job))
    if options.calibrate:
        simulation.calibrate(config.batch_size, cluster)
        job = replace(job, contents=replace(contents, notes=[*contents.notes,
                                                             describe(simulation.calibration)]))
    backend = SimBackend(simulation)
    backend.start_workers(None)
    return begin_run(job, backend, simulation, f"sim-{uuid.uuid4().hex[:8]}", wait=wait)


def _kernel_eval(job: Job) -> tuple[int, int]:
    """The validation samples a cell's fit call evaluates in the kernel at an epoch's end, and
    the batch it takes them in (0 samples: no fit call, or no validation)."""
    validation = job.contents.validation_arrays
    if job.fit is None or validation is None:
        return 0, 1
    call = job.fit.call
    batch = call.validation_batch_size or job.fit.batch
    rows = num_rows(validation[0])
    if call.validation_steps is not None:
        rows = min(rows, call.validation_steps * batch)
    return rows, batch


def _workers_optimizer(job: Job) -> dict:
    """The spec of the cell's optimizer, which `--local-steps` workers step with (the hub's is
    `--server-optimizer`'s)."""
    model = job.trainer_model
    variables = list(model.trainable_variables)
    return describe_optimizer(model.optimizer, [math.prod(v.shape) for v in variables], variables)


class SimBackend(Backend):
    """Stands where LocalBackend stands: the simulation as one thread of this kernel."""

    num_workers: int
    cluster = None  # virtual workers only

    def __init__(self, simulation: Simulation):
        self.simulation = simulation
        self.num_workers = simulation.plan.num_workers
        self._thread = threading.Thread(target=simulation.run, daemon=True,
                                        name="nbdist-simulation")

    def start_hubs(self, specs: list) -> list[dict]:
        raise TrainingError(f"A simulated run has no hub process to start (Received: "
                            f"{len(specs)} hub spec(s)): the simulation drives the shards' logic "
                            "itself. Start it with start_workers().")

    def start_workers(self, base=None) -> None:
        """Start the simulation (its virtual workers and hub) on a thread of this kernel."""
        self._thread.start()

    def hub_places(self, endpoints: list[dict]) -> list[dict]:
        return []  # the virtual hub is no process

    def final_params(self, control) -> tuple[np.ndarray, np.ndarray]:
        return self.simulation.params_now()

    def current_weights(self, control) -> tuple[np.ndarray, np.ndarray]:
        """The simulation's weights now (at its virtual clock's latest step)."""
        return self.simulation.params_now()

    def checkpoint_state(self, control, final: bool) -> list:
        raise CheckpointError("--mode simulate keeps no checkpoints: a simulated run is replayed "
                              "exactly from its seed instead. Drop --checkpoint-dir, or use --mode "
                              "async or local to checkpoint a run.")

    def optimizer_state(self, control, final: bool):
        return self.checkpoint_state(control, final)  # refuses, saying why

    def failure(self) -> BaseException | None:
        return self.simulation.error

    def newly_lost(self) -> list[tuple[int, str]]:
        return []  # virtual workers cannot die

    def written_off(self, worker: int) -> None:
        """Never called: virtual workers are never written off."""

    def workers_running(self) -> bool:
        return self._thread.is_alive()

    def add_workers(self, engines: list[int], announce) -> list[int]:
        raise ConfigError(
            f"A simulated run's virtual workers are fixed when it starts (Received: "
            f"run.add_workers({list(engines)})). Simulate with more --workers instead.")

    def take_over_shards(self, restores: dict[int, tuple], moved) -> list[dict]:
        raise TrainingError("A simulated run's hub is a virtual one in this kernel (Received: "
                            f"hub shard(s) {sorted(restores)} lost). Nothing there can be lost.")

    def restart(self, control) -> dict | None:
        return None  # virtual workers have no engine to lose

    def joined_engines(self) -> list[int]:
        return []  # no cluster to join

    def worker_results(self) -> dict[int, object]:
        """Virtual workers return nothing: `run.nodes` has their counts."""
        return {}

    def finish(self, timeout: float) -> None:
        self._thread.join(timeout)
