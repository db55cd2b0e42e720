"""`--mode simulate`: a whole cluster in one thread of this kernel, on a virtual clock.

What is real: the update rules (`nbdist.algorithms`, the same `Rule` objects the hub uses), the
run's `Coordinator` (chunks and global epochs, DBS batch sizes, the SSP clock, speed groups,
validation jobs, statistics), the group barrier, and every gradient (the cell's own Keras model
through `FlatModel`). What is virtual: time. A worker's step takes
`slowdown_w · cost(batch)` virtual seconds (`nbdist.core.simclock.CostModel`); step completions are
applied in (virtual time, worker id) order; each virtual worker computes on the parameter copy
it last pulled, so delays are those a cluster with these speeds would see. Sync (`--sim
sync=1`) is the group barrier with every worker in one group at the plain rate: the
batch-weighted mean of all gradients per step, at the pace of the slowest.

Nothing depends on the host's speed or scheduling, so a run is the same, bit for bit, for a
seed (on the same TensorFlow build and CPU kind; float reductions may differ across them).
Evaluation and communication take no virtual time.

`Simulation` answers the Run like a hub does (`stats`, `control`, `params`, `shutdown`), and
`SimBackend` stands where `LocalBackend` stands, so `run.history` (time = virtual seconds),
`run.nodes`, `run.timeline`, `run.delays` and `run.report` work unchanged.
"""

from __future__ import annotations

import json
import math
import threading
import weakref
from dataclasses import dataclass, field, replace

import numpy as np

from nbdist.core.barrier import GroupBarrier, GroupStep
from nbdist.core.coordinator import Coordinator, Plan
from nbdist.core.schedule import epoch_permutation
from nbdist.core.simclock import CostModel, EventQueue, Jitter, SimOptions
from nbdist.core.updater import make_updater
from nbdist.errors import DataError, TrainingError

# Compiled functions of models simulated before (a study re-running one model): tracing costs
# seconds, a simulated epoch of a small model about as much. A cache, not state: entries die
# with their model and are used only while the model's variables are unchanged.
_FLAT_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
ONE_BATCH_EVAL = 4096  # validation sets up to this size are evaluated as one batch


def _flat_model(model):
    from nbdist.engine.flatmodel import FlatModel, layout

    shape = layout(model)
    cached = _FLAT_CACHE.get(model)
    if cached is None or cached[0] != shape:
        cached = _FLAT_CACHE[model] = (shape, FlatModel(model))
    return cached[1]


@dataclass
class _Worker:
    """A virtual worker: the weights it last pulled and the step it is computing."""

    params: np.ndarray
    nt: np.ndarray
    read_version: int = 0
    chunk: list | None = None
    group: tuple[int, ...] = ()
    compute_s: float = 0.0
    last_push: float = 0.0  # virtual time of its last push (or 0): what came after is waiting
    started: set = field(default_factory=set)


class Simulation:
    """One simulated run. `run()` (in a thread) plays it; the Run polls it like a hub."""

    def __init__(self, plan: Plan, rule_options: dict, flat, data, validation, params: np.ndarray,
                 non_trainable: np.ndarray, options: SimOptions, seed: int, optimizer: dict | None = None):
        self.sync = options.sync
        if self.sync:  # one group of everyone, applied at the plain rate
            plan = replace(plan, algorithm="group", groups=1)
        self.plan, self.options, self.seed = plan, options, seed
        self.flat, (self.x, self.y), self.validation = flat, data, validation
        n = plan.num_workers
        self.params = np.array(params, dtype=np.float32, copy=True)
        self.non_trainable = np.array(non_trainable, dtype=np.float32, copy=True)
        # the hub's own rule and optimizer (`optimizer`: the cell's, as `choose_optimizer` gives it)
        self.updater = make_updater(replace(plan, algorithm="asgd") if self.sync else plan, rule_options,
                                    optimizer, self.params.size)
        self.barrier = GroupBarrier(self.params.size) if plan.algorithm == "group" else None
        self.coordinator = Coordinator(plan)
        self.cost = options.cost
        self.jitter = Jitter(options.jitter, seed, n)
        self.queue = EventQueue()
        self.workers = [_Worker(self.params.copy(), self.non_trainable.copy()) for _ in range(n)]
        self.version, self.now = 0, 0.0
        self.held: dict[int, bool] = {}  # worker -> pull flag of its held reply
        self.idle: set[int] = set()
        self.next_eval = options.eval_every or math.inf
        self.error: BaseException | None = None
        self.ended = False
        self._stalled = 0
        self._lock = threading.Condition()
        self._perm: dict[int, np.ndarray] = {}

    # -- the Run's side (same shape as HubControl) ------------------------------------------

    def stats(self, since: int = 0, timeline: bool = False) -> dict:
        with self._lock:
            snap = self.coordinator.snapshot(since, timeline)
            snap.update(version=self.version, error=None, dropped={}, elapsed=self.now,
                        rule_options=self.updater.rule.options, finished=self.ended and self.error is None,
                        hub_bytes=int(self.params.nbytes + self.updater.state_nbytes), virtual=True)
            if self.updater.optimizer is not None:
                snap["lr"] = self.updater.learning_rate()
            return json.loads(json.dumps(snap))  # a copy, as the hub's reply would be

    def control(self, **h: object) -> None:
        with self._lock:
            if "lr" in h:
                self.updater.set_learning_rate(float(h["lr"]))
            if "option" in h:
                self.updater.rule.set_option(str(h["option"][0]), float(h["option"][1]))
            if h.get("stop") and self.barrier is not None:
                for step in self.barrier.flush_all():
                    self._apply_group(step)
            self.coordinator.control(h, self.now)
            self._lock.notify_all()

    def params_now(self) -> tuple[np.ndarray, np.ndarray]:
        with self._lock:
            return self.params.copy(), self.non_trainable.copy()

    def shutdown(self) -> None:
        if not self.ended:
            self.control(stop=True)

    def close(self) -> None:
        pass

    # -- the play ----------------------------------------------------------------------------

    def calibrate(self, batch: int, cluster=None) -> CostModel:
        """Measure the model's step and the hub's round trip (`calibrate.py`); use the fit."""
        from nbdist.modes.simulate.calibrate import calibrate

        found = calibrate(self.flat, self.params, self.non_trainable, self.x, self.y, batch,
                          self.options.jitter, cluster)
        self.cost = found.cost
        self.coordinator.stats.record_event("sim_calibration", 0.0, **found.as_event())
        self.calibration = found
        return self.cost

    def run(self) -> None:
        try:
            with self._lock:
                c = self.cost
                self.coordinator.stats.record_event("sim_cost", 0.0, per_step_s=c.per_step_s,
                                                    per_sample_s=c.per_sample_s, jitter=c.jitter)
                for w in range(self.plan.num_workers):
                    self.coordinator.hello(w, "virtual", None)
                for w in range(self.plan.num_workers):
                    self._answer(w, pull=True)
            while True:
                with self._lock:
                    if not self._advance():
                        break
        except BaseException as exc:  # noqa: BLE001 - reported to the Run by SimBackend.failure
            self.error = exc
        finally:
            self.ended = True

    def _advance(self) -> bool:
        """Play the next event (or unblock the run); False when every worker has left."""
        if self.coordinator.finished:
            return False
        if len(self.queue):
            t, w = self.queue.pop()
            self._evaluate_until(t)
            self.now = t
            self._complete_step(w)
        elif self.coordinator.paused and not self.coordinator.stopping:
            self._lock.wait(0.1)  # nothing runs while paused; wait for the kernel
        elif self.barrier is not None and self.barrier.pending:
            # members wait for one that will not push (the end of the data): what the hub does
            # after GROUP_WAIT_LIMIT_S, done at once since virtual waiting costs nothing
            for step in self.barrier.flush_all():
                self._apply_group(step)
                if not self.sync:  # sync: the last, partial global batch, nothing unusual
                        self.coordinator.stats.record_event("group_timeout", self.now, members=list(step.members),
                                                        pushed=sorted(step.headers))
        before = self._progress()
        self._wake()
        self._stalled = 0 if len(self.queue) or self._progress() != before else self._stalled + 1
        if self._stalled > 3:
            raise TrainingError(
                f"The simulation stalled at virtual time {self.now:.3f}s: no worker computes and none "
                f"can go on (held: {sorted(self.held)}, idle: {sorted(self.idle)}). This is a bug in "
                "nbdist's simulator; please report it with the run's options.")
        return True

    def _progress(self) -> tuple:
        c = self.coordinator
        return (len(self.queue), len(c.gone), c.stats.global_step, len(c.stats.evals), c.paused)

    def _answer(self, w: int, pull: bool) -> None:
        """The hub's reply to `w` (or hold it), and what the worker does with it."""
        if self.barrier is not None and self.barrier.waiting(w):
            self.held[w] = pull
            return
        work = self.coordinator.work_for(w, pull, self.version)
        if work is None:
            self.held[w] = pull
            return
        self.held.pop(w, None)
        self.idle.discard(w)
        v = self.workers[w]
        if pull:
            v.read_version = self.version
            self.updater.rule.on_pull(w, self.params, self.version)
            np.copyto(v.params, self.params)
            np.copyto(v.nt, self.non_trainable)
        if work.get("eval"):
            metrics = self._evaluate_on(v.params, v.nt)
            self.coordinator.eval_result(w, {"eval": {**work["eval"], "metrics": metrics}}, self.now)
        if work["done"]:
            self._leave(w)
            return
        todo = [c for c in work["chunks"] if c[0] not in v.started]
        if not pull and (todo or work.get("eval_pending")):
            self._answer(w, pull=True)  # work after waiting: pull the current weights first
            return
        if not todo:
            self.idle.add(w)
            return
        chunk = todo[0]
        v.started.add(chunk[0])
        v.chunk, v.group = chunk, tuple(work.get("group") or (w,))
        if self.sync:  # every worker still here, also at the end of the data (a partial step)
            v.group = tuple(sorted(set(range(self.plan.num_workers)) - self.coordinator.gone))
        v.compute_s = self.cost.step_time(chunk[3] - chunk[2], float(work["slowdown"]), self.jitter.factor(w))
        self.queue.schedule(self.now + v.compute_s, w)

    def _complete_step(self, w: int) -> None:
        """Worker `w` finished computing: its real gradient on its own copy, pushed now."""
        v = self.workers[w]
        chunk, v.chunk = v.chunk, None
        x, y = self._batch(chunk)
        loss, grad, norm, nt_after = self.flat.assign_and_gradients(v.params, v.nt, x, y)
        if not (math.isfinite(loss) and math.isfinite(norm)):
            what, value = ("loss", loss) if not math.isfinite(loss) else ("gradient norm", norm)
            raise TrainingError(
                f"The {what} became {value} at step {self.coordinator.stats.workers[w].steps} on virtual "
                f"worker {w} (epoch {chunk[1]}, virtual time {self.now:.3f}s). Lower the learning rate "
                "(--lr), check the data for NaN/inf, or normalise the inputs.")
        if self.non_trainable.size:
            self.non_trainable += nt_after - v.nt
        header = {"chunks": [chunk[0]], "loss": loss, "compute_s": v.compute_s, "comm_s": 0.0,
                  "wait_s": max(0.0, self.now - v.compute_s - v.last_push)}
        v.last_push = self.now
        if self.barrier is not None:
            for step in self.barrier.add(v.group, w, grad, chunk[3] - chunk[2], v.read_version, header):
                self._apply_group(step)
        else:
            delay = self.version - v.read_version
            self._apply(w, grad, delay)
            self.coordinator.push(w, header, delay, self.now)
        self._answer(w, pull=True)

    def _apply(self, w: int, grad: np.ndarray, delay: int, scale: float = 1.0) -> None:
        changed, _ = self.updater.push(w, self.params, grad, delay, scale)
        self.version += int(changed)

    def _apply_group(self, step: GroupStep) -> None:
        """As the hub: the batch-weighted mean at the group's rate (sync: at the plain rate)."""
        delay = self.version - min(step.read_versions.values())
        self._apply(min(step.members), step.mean, delay, 1.0 if self.sync else step.batch / self.plan.batch_size)
        for member, header in step.headers.items():
            self.coordinator.push(member, header, self.version - 1 - step.read_versions[member], self.now)

    def _wake(self) -> None:
        """Held replies that may now go out, and idle workers asking again for work."""
        for w in sorted(self.held):
            if w in self.held:
                self._answer(w, self.held[w])
        for w in sorted(self.idle):
            if w in self.idle and not self.queue.pending(w):
                self._answer(w, pull=False)

    def _leave(self, w: int) -> None:
        self.idle.discard(w)
        self.held.pop(w, None)
        self.updater.rule.forget(w)
        if self.barrier is not None:
            for step in self.barrier.drop(w):
                self._apply_group(step)
        self.coordinator.bye(w, self.now)

    # -- data and evaluation -----------------------------------------------------------------

    def _batch(self, chunk: list) -> tuple[np.ndarray, np.ndarray]:
        _, epoch, start, stop = chunk
        perm = self._perm.get(epoch)
        if perm is None:  # keep the last two epochs: chunks of both interleave at a boundary
            self._perm = {e: p for e, p in self._perm.items() if e == epoch - 1}
            perm = self._perm[epoch] = epoch_permutation(len(self.x), self.seed, epoch)
        index = perm[start:stop]
        return self.x[index], self.y[index]

    def _evaluate_on(self, params: np.ndarray, nt: np.ndarray) -> dict:
        if self.validation is None:
            return {}
        from nbdist.modes.async_ps.worker import _evaluate

        self.flat.assign(params, nt)
        xv, yv = self.validation
        if len(xv) <= ONE_BATCH_EVAL:  # one compiled call: model.evaluate sets up a
            result = self.flat.model.test_on_batch(xv, yv, return_dict=True)  # data pipeline per call
            return {k: float(v) for k, v in result.items()}
        return _evaluate(self.flat.model, self.validation, self.plan.batch_size)

    def _evaluate_until(self, t: float) -> None:
        """Periodic evaluations (`eval_every`) of the hub's weights at their virtual times."""
        while self.next_eval <= t and self.validation is not None:
            metrics = self._evaluate_on(self.params, self.non_trainable)
            self.coordinator.stats.record_eval(metrics, epoch=round(self.coordinator.epochs_done, 4),
                                               version=self.version, now=self.next_eval)
            self.next_eval += self.options.eval_every


class SimBackend:
    """Stands where LocalBackend stands: the simulation as one thread of this kernel."""

    num_workers: int

    def __init__(self, simulation: Simulation):
        self.simulation = simulation
        self.num_workers = simulation.plan.num_workers
        self._thread = threading.Thread(target=simulation.run, daemon=True, name="nbdist-simulation")

    def start(self) -> None:
        self._thread.start()

    def final_params(self, control) -> tuple[np.ndarray, np.ndarray]:
        return self.simulation.params_now()

    def failure(self) -> BaseException | None:
        return self.simulation.error

    def newly_lost(self) -> list[tuple[int, str]]:
        return []  # virtual workers cannot die

    def workers_running(self) -> bool:
        return self._thread.is_alive()

    def finish(self, timeout: float) -> None:
        self._thread.join(timeout)


def start_simulation(config, contents, namespace: dict, wait: bool, optimizer: dict | None,
                     warnings: list[str], cluster=None):
    """Build the simulation of `config` for the cell's model and arrays; start it; a Run.
    `optimizer` is what the hub applies and `warnings` go to `run.warnings` (`nbdist.api`);
    `cluster`, if any, is where `--sim calibrate=1` measures."""
    import uuid

    from nbdist.api import _plan, _workers_rate
    from nbdist.core.simclock import sim_options
    from nbdist.engine.flatmodel import ensure_built, read_flat
    from nbdist.run.handle import Run

    model = contents.model
    if contents.streamed:
        raise DataError(f"--mode simulate trains in this kernel on data held in memory, but "
                        f"{contents.data[0]} is larger than --in-memory-limit. Simulate on a part "
                        f"of it ({contents.data[0]}.take(n)), or raise --in-memory-limit.")
    x, y = (np.asarray(a) for a in contents.arrays)
    if x.dtype == np.float64:  # Keras trains in float32; convert once, not per batch
        x = x.astype(np.float32)
    validation = contents.validation_arrays
    ensure_built(model, x[:2])  # as every mode does before reading the variables
    num_workers = config.workers or len(config.slowdown)
    params, non_trainable = read_flat(model)
    plan, rule_options, _ = _plan(config, contents, _workers_rate(config, model.optimizer), num_workers)
    options = sim_options(config.sim)
    simulation = Simulation(plan, rule_options, _flat_model(model), (x, y), validation, params,
                            non_trainable, options, config.seed, optimizer)
    notes = list(contents.notes)
    if options.calibrate:
        from nbdist.modes.simulate.calibrate import describe

        simulation.calibrate(config.batch_size, cluster)
        notes.append(describe(simulation.calibration))
    backend = SimBackend(simulation)
    run = Run(config, model, contents.model_name, contents.warnings + warnings, notes)
    backend.start()
    run._begin(backend, simulation, f"sim-{uuid.uuid4().hex[:8]}")  # noqa: SLF001
    if wait:
        run.wait()
    return run
