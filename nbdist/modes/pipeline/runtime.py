"""The kernel's side of a pipeline run: the stages as tasks (engines, or threads in the
in-process tests), and a control that collects their signed reports into the snapshot a
`Run` polls (history, validation, per-stage nodes, the micro-batch timings of each step).

It stands where the hub's HubControl and the async backends stand, so the Run's monitor
drives a pipeline run the same way: `start_workers` prepares and starts the stages,
`failure()` names a failed stage and its engine, a stop lets stage 0 finish its mini-batch and
tell the others, an abort ends every stage at once.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import replace

import numpy as np

from nbdist.cluster.engines import answers
from nbdist.core.stats import eval_row
from nbdist.engine.flat_layout import read_flat
from nbdist.errors import ConfigError, NbdistError, TrainingError, from_engine, raised_by_cell
from nbdist.fit.optimizer_state import OptimizerState
from nbdist.modes.common.engine_backend import engine_died
from nbdist.modes.pipeline.messages import (
    Abort,
    Alive,
    EvalDone,
    NewRate,
    Ops,
    Release,
    StepDone,
    Stop,
    Totals,
    Weights,
)
from nbdist.modes.pipeline.optimizer_slots import StageSlots, kernel_state
from nbdist.modes.pipeline.placement import bind_hosts, kernel_host, local_ranks, stage_threads
from nbdist.modes.pipeline.stage import discard_stage, prepare_stage, run_stage
from nbdist.run.backend import Backend, returned

KEEP_STEPS = 64  # per-step micro-batch timings kept for the timeline
ABORT_WAIT_S = 30.0  # a restart's wait for the stages it aborted to leave
PING_S = 5.0  # a free engine that does not run a trivial task this fast is dead, or busy
QUIET_S = 0.5  # at the end: no report for this long means the last one has arrived
ALIVE_EVERY_S = 0.2  # the kernel's polls (four a second) renew the stages' lease at most this
# often: well inside the shortest lease (`lease_term`: half of --timeout)


class PipelineControl:
    """Collects the stages' reports; answers `stats` like a hub; sends stop and abort."""

    def __init__(self, link, stages: int, engines: list, epochs: int, steps_per_epoch: int,
                 micro_batches: int, lr: float | None = None):
        self.link, self.stages, self.engines = link, stages, engines
        self.lr = lr  # the stages' constant rate (None: a schedule), or run.set_lr's
        self.epochs, self.steps_per_epoch, self.micro_batches = (epochs, steps_per_epoch,
                                                                 micro_batches)
        self.started = time.time()
        self.history: list[list] = []
        self.evals: list[dict] = []
        self.events: list[dict] = []
        self.ops: dict[int, dict[int, list]] = {}  # step -> stage -> [[kind, mb, t0, t1], ...]
        self.steps: deque[dict] = deque(maxlen=KEEP_STEPS)  # complete steps: their ops by stage
        self.busy = [0.0] * stages  # seconds each stage computed, over complete steps
        self.wall = 0.0  # seconds those steps took, first op to last
        self.measured_steps = 0
        self.sent = [0] * stages
        # sent to neighbours, by transport
        self.messages = [{"shm": 0, "tcp": 0} for _ in range(stages)]
        self.dropped: list[dict] = [{} for _ in range(stages)]  # what each stage refused, by reason
        self.global_step, self.epoch = 0, 0
        # a cell's fit call: each stage's variables at the latest epoch ends (epoch -> stage ->
        # the arrays by step, `messages.Weights`) and the epochs' metric state (the last stage's)
        self.weights: dict[int, dict[int, dict[int, list]]] = {}
        # ... and, when a callback saves the whole model, their optimizers' slots (epoch ->
        # stage -> `StageSlots`)
        self.slots: dict[int, dict[int, StageSlots]] = {}
        self.epoch_metrics: dict[str, list[float]] = {}
        self.weights_arrived = threading.Condition()
        self.failed = False
        self.restarting = False  # the stages are being started again (PipelineBackend.restart)
        self.released = -1  # the latest epoch a fit call's gate let pass
        # what `Alive` repeats for stages started again: a stop asked, a rate set while training
        self.stopping, self.rate_set = False, None
        self.restarts = 0  # how many times the stages started again
        self.stage_died = lambda: False  # whether a stage's engine died (set by the backend)
        self.given_up = False  # a stage died and the stages will not start again
        self._last_report = time.monotonic()
        self._alive_at = 0.0  # when the stages' lease was last renewed (messages.Alive)
        self.tasks_done = lambda: False  # set by the backend
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._receive_loop, daemon=True,
                                        name="nbdist-pipeline-reports")
        self._thread.start()

    def _receive_loop(self) -> None:
        while not self._closing.is_set():
            got = self.link.receive(100)  # typed and checked (malformed ones are dropped there)
            if got is None:
                continue
            report, arrays = got
            if isinstance(report, Weights):
                self._absorb_weights(report, arrays)
                continue
            with self._lock:
                self._absorb(report)
                self._last_report = time.monotonic()

    def _absorb_weights(self, report: Weights, arrays: list) -> None:
        """A stage's variables (and slots) at an epoch's end; the epochs before the previous
        one go."""
        it = iter(arrays)
        by_step = {step: [np.array(next(it)) for _ in range(n)]  # copied out of the frames
                   for step, n in zip(report.steps, report.counts, strict=True)}
        slots = StageSlots(report.steps, report.slot_of, report.slot_names,
                           [np.array(a) for a in it], report.iterations)
        with self.weights_arrived:
            self.weights.setdefault(report.epoch, {})[report.stage] = by_step
            self.slots.setdefault(report.epoch, {})[report.stage] = slots
            for old in [e for e in self.weights if e < report.epoch - 1]:
                del self.weights[old]
                self.slots.pop(old, None)
            self.weights_arrived.notify_all()
        self._last_report = time.monotonic()

    def epoch_slots(self) -> list[StageSlots]:
        """Every stage's optimizer slots sent with the weights `epoch_weights` returned last."""
        with self.weights_arrived:
            return list(self.slots.get(self.epoch - 1, {}).values())

    def epoch_weights(self, timeout: float, through_restart: bool = True) -> dict[int, list]:
        """Every stage's variables at the end of the latest epoch the last stage reported ended
        (a cell's fit call asks at its epoch gate, where they are on their way), by step;
        TrainingError if they do not all come within `timeout` seconds. A stage whose engine
        died holds the wait until the stages started again send them (`timeout` counts from
        each start again), or, not `through_restart` (the run's monitor, which starts them
        again), ends it at once."""
        deadline, seen = time.monotonic() + timeout, self.restarts
        with self.weights_arrived:
            while True:
                if self.restarts != seen:  # started again: the epoch is trained again
                    deadline, seen = time.monotonic() + timeout, self.restarts
                pending = not self.given_up and (self.restarting or self.stage_died())
                if pending and not through_restart:
                    raise TrainingError("A pipeline stage's engine died: the stages' weights "
                                        "come once they start again.")
                epoch = self.epoch - 1  # (EvalDone of epoch e sets self.epoch to e + 1)
                if epoch >= self.epochs - 1:  # no gate after the last epoch: nothing comes
                    raise TrainingError(
                        f"The pipeline's stages send their weights at the epoch gates of a fit "
                        f"call, and epoch {epoch + 1} is the run's last (Received: a request "
                        "for its weights): they come with the run's end (run.model).")
                by_stage = self.weights.get(epoch, {})
                if epoch >= 0 and len(by_stage) == self.stages:
                    merged: dict[int, list] = {}
                    for by_step in by_stage.values():
                        merged.update(by_step)
                    return merged
                left = deadline - time.monotonic()
                if left <= 0 or self.failed and not pending:
                    raise TrainingError(
                        f"The pipeline's stages did not all send their weights at the end of "
                        f"epoch {epoch + 1} within {timeout:.0f}s (Received: stages "
                        f"{sorted(by_stage)}). A stage's engine may have died or stalled; see "
                        "run.error and %nbdist status.")
                self.weights_arrived.wait(min(left, 0.5))

    def latest_weights(self) -> tuple[int, dict[int, list]] | None:
        """(epoch, every stage's variables by step) at the latest epoch end all stages sent
        their weights for (a cell's fit call's epoch gates); None before the first."""
        with self.weights_arrived:
            whole = [e for e, by_stage in self.weights.items() if len(by_stage) == self.stages]
            if not whole:
                return None
            epoch = max(whole)
            merged: dict[int, list] = {}
            for by_step in self.weights[epoch].values():
                merged.update(by_step)
            return epoch, merged

    def restarted(self, first_epoch: int) -> None:
        """The stages start again at `first_epoch` (on `engines`, changed in place): forget the
        timings of the steps under way and the weights of the epochs they train again."""
        with self._lock:
            self.ops.clear()
        with self.weights_arrived:
            for epoch in [e for e in self.weights if e >= first_epoch]:
                del self.weights[epoch]
                self.slots.pop(epoch, None)
            self.restarts += 1
            self.weights_arrived.notify_all()
        with self._lock:
            self.global_step = first_epoch * self.steps_per_epoch
        self.failed = self.restarting = False

    def _absorb(self, report: StepDone | EvalDone | Totals) -> None:
        if isinstance(report, StepDone):
            now = report.time - self.started
            self.global_step = max(self.global_step, report.step)
            epochs = (report.step - 1) / max(1, self.steps_per_epoch)
            self.history.append([now, report.step, round(epochs, 6), self.stages - 1,
                                 float(report.loss), 0, report.samples])
        elif isinstance(report, EvalDone):
            now = report.time - self.started
            self.epoch = report.epoch + 1
            row = {"time": now, "step": report.step, "epoch": self.epoch}
            row.update({f"val_{k}": float(v) for k, v in report.metrics.items()})
            row.update({k: float(v) for k, v in report.train.items()})
            if report.metrics:  # (with a fit call the kernel validates: `control(eval=...)`)
                self.evals.append(row)
            if report.state:
                self.epoch_metrics[str(report.epoch)] = list(report.state)
            self.events.append({"time": now, "step": report.step, "event": "epoch_end",
                                "epoch": report.epoch})  # 0-based, as the hub's
        else:  # Totals, or Ops (a step's, with the totals so far)
            stage = report.stage
            self.sent[stage] = report.sent
            self.messages[stage] = dict(report.messages)
            self.dropped[stage] = dict(report.dropped)
            if not isinstance(report, Ops):
                return
            by_stage = self.ops.setdefault(report.step, {})
            by_stage[stage] = [list(op) for op in report.ops]
            if len(by_stage) == self.stages:
                self._complete(report.step, self.ops.pop(report.step))

    def _complete(self, step: int, by_stage: dict) -> None:
        starts = [op[2] for ops in by_stage.values() for op in ops]
        ends = [op[3] for ops in by_stage.values() for op in ops]
        self.wall += max(ends) - min(starts)
        for s, ops in by_stage.items():
            self.busy[s] += sum(op[3] - op[2] for op in ops)
        self.measured_steps += 1
        self.steps.append({"step": step, "ops": {int(s): ops for s, ops in by_stage.items()}})

    # -- what the Run asks ------------------------------------------------------------------

    def stats(self, since: int = 0, timeline: bool = False, timeout: float | None = None,
              during=None, clock=None) -> dict:
        """The Run's poll, answered from what the stages reported (`timeout`, `during`:
        HubControl's; no socket is waited on here). Each poll renews the stages' lease on the
        run (`messages.Alive`, every ALIVE_EVERY_S at most): a dead kernel's stages leave."""
        if time.monotonic() - self._alive_at >= ALIVE_EVERY_S:
            self._alive_at = time.monotonic()
            self.link.broadcast(Alive(released=self.released, stop=self.stopping,
                                      lr=self.rate_set))
        done = self.tasks_done()
        if done:  # the last reports are sent before a stage returns: let them land
            deadline = time.monotonic() + 5.0
            while time.monotonic() - self._last_report < QUIET_S and time.monotonic() < deadline:
                time.sleep(0.05)
        with self._lock:
            nodes = [{"worker": s, "engine": self.engines[s],
                      "state": "done" if done else "training", "steps": self.measured_steps,
                      "compute_s": self.busy[s], "bytes_sent": self.sent[s]}
                     for s in range(self.stages)]
            return {"global_step": self.global_step,
                    "epochs_done": self.global_step / max(1, self.steps_per_epoch),
                    "nodes": nodes, "history": [list(r) for r in self.history[since:]],
                    "evals": list(self.evals), "events": list(self.events), "finished": done,
                    "epoch_metrics": dict(self.epoch_metrics), "lr": self.lr, "error": None,
                    "paused": False}

    def pipeline(self) -> dict:
        """The kept steps' timings and the totals: for `run.pipeline` and the timeline figure."""
        with self._lock:
            return {"steps": list(self.steps), "busy": list(self.busy), "wall": self.wall,
                    "measured_steps": self.measured_steps,
                    "messages": [dict(m) for m in self.messages],
                    "dropped": [dict(d) for d in self.dropped], "kernel_dropped": self.link.drops()}

    def control(self, **h: object) -> None:
        """The Run's controls: stop, a new learning rate (`run.set_lr`, a callback's), and a
        cell's fit call's epoch gate (`epoch_done`) and the kernel's validation (`eval`)."""
        if h.get("stop"):
            self.stopping = self.stopping or not self.failed
            self.link.broadcast(Abort("run ended by the kernel") if self.failed else Stop())
            return
        known = {"lr", "by", "epoch_done", "eval"}
        if set(h) - known:
            raise ConfigError(
                f"--mode pipeline runs take a stop, a new learning rate and a fit call's epoch "
                f"gate, but not {', '.join(sorted(set(h) - known))} while they train: each stage "
                "steps the cell's own optimizer. Stop the run and start it again with other "
                "options.")
        now = time.time() - self.started
        if h.get("lr") is not None:
            self.link.broadcast(NewRate(float(h["lr"])))
            with self._lock:
                self.lr = self.rate_set = float(h["lr"])
                self.events.append({"time": now, "step": self.global_step, "event": "set_lr",
                                    "lr": float(h["lr"]), **({"by": h["by"]} if h.get("by")
                                                             else {})})
        if h.get("eval") is not None:
            result = h["eval"]
            with self._lock:
                self.evals.append(eval_row(result.metrics, epoch=result.epoch, version=-1,
                                           step=self.global_step, now=now))
        if h.get("epoch_done") is not None:
            self.released = max(self.released, int(h["epoch_done"]))
            self.link.broadcast(Release(int(h["epoch_done"])))

    def shutdown(self) -> None:
        if not self.tasks_done():
            self.failed = True
            self.link.broadcast(Abort("the run is over"))

    def cap_timeout(self, seconds: float) -> None:
        """Nothing to cap: no request here waits for an answer (HubControl's has)."""

    @property
    def closed(self) -> bool:
        return self._closing.is_set()

    def close(self) -> None:
        self._closing.set()
        self._thread.join(2)
        self.link.close()


class PipelineBackend(Backend):
    """The stage tasks of one run: on engines (`cluster` given) or as threads of this kernel
    (`namespace`: the kernel's, where the cell already ran)."""

    num_workers: int
    cluster: object | None

    def __init__(self, cluster, engines: list, graph, model, namespace: dict,
                 control: PipelineControl):
        self.cluster, self.engines, self.graph, self.model = cluster, engines, graph, model
        self.namespace, self.control = namespace, control
        self.tasks: list = []
        self.endpoints: list[dict] = []  # where each stage is reached (link.StageLink.info)
        self.gated, self.timeout = False, 120.0  # a cell's fit call (set by `start_workers`)
        self.num_workers = len(engines)
        control.tasks_done = self.tasks_done
        control.stage_died = self._stage_died
        self.specs: list = []  # the stages' specs, for a start again (`restart`)
        self.refused: str | None = None  # why a stage whose engine died could not start again
        self.kernel_host: str | None = None  # where the kernel's link is bound (set at start)

    def _stage_died(self) -> bool:
        """Whether a stage's engine died (its task's end says so)."""
        return any(t.ready() and engine_died(t) for t in list(self.tasks))

    def start_hubs(self, specs: list) -> list[dict]:
        raise TrainingError(f"A pipeline run has no hub (Received: {len(specs)} hub spec(s)): its "
                            "stages report to the kernel's link. Start the stages with "
                            "start_workers().")

    def start_workers(self, base: list) -> None:
        """Prepare every stage of `base` (one StageSpec each: it runs the cell and binds its
        socket), then start each one connected to its neighbours. A failed start discards the
        stages it prepared."""
        specs = self.specs = base
        self.gated, self.timeout = specs[0].gated, max(60.0, specs[0].timeout)
        extra = {} if self.cluster is not None else {"namespace": self.namespace}
        link = self.control.link
        try:
            pending = [self.call(s, prepare_stage, spec, **extra) for s, spec in enumerate(specs)]
            endpoints = self.endpoints = [
                _started(p, s, self.engines[s], spec.timeout)
                for s, (p, spec) in enumerate(zip(pending, specs, strict=True))]
            last = len(specs) - 1
            for s, spec in enumerate(specs):
                neighbours = {f"stage-{n}": endpoints[n] for n in (s - 1, s + 1) if 0 <= n <= last}
                self.tasks.append(self.call(s, run_stage, spec.run_id, s, neighbours,
                                            link.report_endpoint, link.control_endpoint))
        except BaseException:
            if not self.tasks:  # prepared stages hold bound sockets: free them
                for s, spec in enumerate(specs):
                    self.call(s, discard_stage, spec.run_id, s)
            raise

    def hub_places(self, endpoints: list[dict]) -> list[dict]:
        return []  # no hub: the stages report to the kernel

    def call(self, stage: int, fn, *args, **kwargs):
        """Run `fn` for `stage`: an ipyparallel AsyncResult, or a thread's future."""
        if self.cluster is not None:
            return self.cluster.client[self.engines[stage]].apply_async(fn, *args, **kwargs)
        pool = ThreadPoolExecutor(1, thread_name_prefix=f"nbdist-stage-{stage}")
        future = pool.submit(fn, *args, **kwargs)
        pool.shutdown(wait=False)
        return _Future(future)

    def tasks_done(self) -> bool:
        return (bool(self.tasks) and all(t.ready() for t in self.tasks)
                and all(t.successful() for t in self.tasks))

    def failure(self) -> Exception | None:
        for s, task in enumerate(self.tasks):
            if task.ready() and not task.successful():
                try:
                    task.get(0)
                except Exception as exc:  # noqa: BLE001 - named and returned
                    if type(exc).__name__ == "StageAborted" and any(
                            not t.ready() or not t.successful()
                            for t in self.tasks if t is not task):
                        continue  # ended by the kernel because of another stage's failure
                    if self.control is not None:
                        self.control.failed = True
                    if raised_by_cell(exc):  # the cell's own lines, tagged with engine and host
                        return from_engine(exc, self.engines[s])
                    where = (f"engine {self.engines[s]}" if self.cluster is not None
                             else "this kernel")
                    died = ("died" if "EngineError" in type(exc).__name__ or "died" in str(exc)
                            else "failed")
                    why = f" It could not start again: {self.refused}" if self.refused else ""
                    return TrainingError(
                        f"Pipeline stage {s} (on {where}) {died}: {type(exc).__name__}: "
                        f"{str(exc).splitlines()[0] if str(exc) else ''}.{why} The other stages "
                        "were stopped. Fix the cause (check the engine with %nbdist status, "
                        "restart a dead one with %nbdist stop / %nbdist start N), then run the "
                        "cell again.")
        return None

    def newly_lost(self) -> list:
        return []  # a pipeline needs every stage: a lost stage is a failure

    def written_off(self, worker: int) -> None:
        """Never called: stages are never written off (a lost stage is a failure)."""

    def workers_running(self) -> bool:
        return any(not t.ready() for t in self.tasks)

    def worker_results(self) -> dict[int, object]:
        """What each stage's task returned (its weights, its step counts), once it has."""
        return returned(self.tasks)

    def current_weights(self, control) -> tuple[np.ndarray, np.ndarray]:
        """The stages' weights at the latest epoch end: a cell's fit call has every stage send
        its variables there (`messages.Weights`) and wait at the epoch gate. In this kernel the
        stages train the kernel's own layers. Without a fit call the stages on engines send
        nothing while they train, so this refuses, saying so."""
        if self.cluster is None:
            return read_flat(self.model)
        if not self.gated:
            raise ConfigError(
                f"--mode pipeline hands out its weights at the epoch ends of a cell's fit call "
                f"only (Received: a request for the current weights of stages on engines "
                f"{self.engines}, from a cell without one): each stage holds its own part of the "
                "model on its engine. Read them when the run has ended (run.model), or end the "
                "cell with its model.fit(...) call.")
        # the run's monitor (its thread) keeps a copy, and starts the stages again when one is
        # lost: it must not wait for them
        monitor = threading.current_thread().name.startswith("nbdist-run-")
        self.graph.assign(control.epoch_weights(self.timeout, through_restart=not monitor))
        return read_flat(self.model)

    def final_params(self, control):
        for task in self.tasks:
            result = task.get(60)
            if self.cluster is not None:  # in process the stages trained the kernel's own layers
                self.graph.assign(result["weights"])
        self.results = [t.get(0) for t in self.tasks]
        return read_flat(self.model)

    def optimizer_state(self, control, final: bool) -> OptimizerState | None:
        """The stages' optimizer slots, sent with their weights at the latest epoch gate (or
        returned at the end), named as the kernel's optimizer names them."""
        if final:
            stages = [StageSlots(sorted(r["weights"]), **r["slots"]) for r in self.results]
        else:
            stages = control.epoch_slots()
        return kernel_state(stages, self.graph.step_variables)

    def checkpoint_state(self, control, final: bool) -> list:
        raise ConfigError("--mode pipeline keeps no checkpoints yet: each stage holds its own "
                          "part of the model and its optimizer. Train without --checkpoint-dir, or "
                          "use --mode async or sync to checkpoint.")

    def add_workers(self, engines: list[int], announce) -> list[int]:
        raise ConfigError(f"--mode pipeline runs one stage per engine, fixed when it starts "
                          f"(Received: run.add_workers({list(engines)})). Start a new run with "
                          "more --stages, or use --mode async to add workers while a run trains.")

    def take_over_shards(self, restores: dict[int, tuple], moved) -> list[dict]:
        raise TrainingError(f"--mode pipeline has no hub shards (Received: hub shard(s) "
                            f"{sorted(restores)} lost). Use --mode async to survive a lost hub "
                            "shard.")

    def restart(self, control) -> dict | None:
        """A stage's engine died: every stage starts again, the dead one on a free engine of the
        cluster, from the weights of the latest epoch end all stages sent (a cell's fit call
        gates every epoch; without one, from the run's start), at the next epoch; the others
        are aborted first. Returns the event's fields; None when no stage's engine died (the
        failure is the run's). Raises the run's error, saying what was missing (`refused`), when
        no free engine can take the lost one's place."""
        if self.cluster is None or not self.specs or not self._stage_died():
            return None
        try:
            return self._restart()
        except BaseException:
            self.control.given_up, self.control.restarting = True, False
            self.control.failed = True
            raise

    def _restart(self) -> dict:
        cluster, control = self.cluster, self.control
        dead = [s for s, t in enumerate(self.tasks) if t.ready() and engine_died(t)]
        free = self._free_engines(len(dead))
        latest = control.latest_weights()
        first_epoch, weights = (latest[0] + 1, latest[1]) if latest else (0, None)
        control.restarting = True
        control.link.broadcast(Abort("a stage's engine died: the stages start again"))
        deadline = time.monotonic() + ABORT_WAIT_S
        for task in self.tasks:
            task.wait(max(0.0, deadline - time.monotonic()))
        if not all(t.ready() for t in self.tasks):
            self._refuse(f"a stage did not leave within {ABORT_WAIT_S:.0f}s of the abort.")
        dead = [s for s, t in enumerate(self.tasks) if engine_died(t)]  # (more, meanwhile?)
        free = free if len(free) >= len(dead) else self._free_engines(len(dead))
        engines = list(self.engines)
        lost = {s: engines[s] for s in dead}
        for s in dead:
            engines[s] = free.pop(0)
        nets = cluster.engine_networks(engines)
        if kernel_host(cluster, nets) != self.kernel_host:
            self._refuse(f"the free engine(s) reach this kernel by another address than the "
                         f"{self.kernel_host} its link is bound to (another host); start the "
                         "run with one more engine on the stages' hosts.")
        threads, ranks = stage_threads(nets, engines), local_ranks(nets, engines)
        bind = bind_hosts(cluster, nets, engines)
        lr = control.lr if control.lr is not None else self.specs[0].lr  # set_lr's, if any
        specs = [replace(spec, engine=engines[s], threads=threads[s], local_rank=ranks[s],
                         bind_host=bind[s], first_epoch=first_epoch, resume_weights=weights,
                         lr=lr)
                 for s, spec in enumerate(self.specs)]
        self.engines[:] = engines  # (the control's list too)
        self.tasks, self.refused = [], None
        control.restarted(first_epoch)
        self.start_workers(specs)
        since = "the run's start" if latest is None else f"the end of epoch {first_epoch}"
        summary = (f"pipeline stage(s) {', '.join(map(str, dead))} were lost (engine(s) "
                   f"{', '.join(map(str, lost.values()))} died); every stage started again from "
                   f"the weights at {since}, the lost one(s) on engine(s) "
                   f"{', '.join(str(engines[s]) for s in dead)}, so the steps trained since then "
                   "were lost" + ("" if latest is None else " and the optimizer's slots "
                                  "(momentum, moments) start afresh"))
        return {"event": "stages_restarted", "lost_stages": dead, "engines": list(lost.values()),
                "new_engines": [engines[s] for s in dead], "epoch": first_epoch,
                "summary": summary}

    def _free_engines(self, wanted: int) -> list[int]:
        """`wanted` engines of the run's cluster that run no stage and answer a ping (alive and
        idle), checked before any stage is aborted; raises the run's error, saying what is
        missing, when there are fewer."""
        candidates = [e for e in self.cluster.engine_ids if e not in self.engines]
        free = [e for e in candidates if answers(self.cluster.client, e, PING_S)]
        if len(free) < wanted:
            self._refuse(f"{wanted} lost stage(s) need a free engine each and the cluster has "
                         f"{len(free)} that answer (engines {sorted(self.cluster.engine_ids)}, "
                         f"stages on {self.engines}); start more engines to survive a lost "
                         "stage.")
        return free

    def _refuse(self, why: str) -> None:
        """Raise the run's error (`failure()`), saying why the stages cannot start again."""
        self.refused = why
        raise self.failure() or TrainingError(f"A pipeline stage was lost. {why}")

    def joined_engines(self) -> list[int]:
        return []  # stages are fixed when the run starts

    def finish(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for task in self.tasks:
            try:
                task.wait(max(0.0, deadline - time.monotonic()))
            except Exception:  # noqa: BLE001, S110 - clean-up: a dead engine's task is already failed
                pass


def _started(pending, stage: int, engine: int, timeout: float):
    """The endpoint a prepared stage returned, or a TrainingError naming the stage (the
    cell's own error, if the cell raised there)."""
    try:
        return pending.get(max(60.0, timeout))
    except Exception as exc:  # noqa: BLE001 - whatever the stage raised, named with its stage
        if isinstance(exc, NbdistError) or raised_by_cell(exc):
            raise from_engine(exc, engine) from None
        raise TrainingError(f"Pipeline stage {stage} could not start on engine {engine}: "
                            f"{type(exc).__name__}: {exc}") from None


class _Future:
    """A thread's future with the AsyncResult methods the backend uses."""

    def __init__(self, future):
        self.future = future

    def ready(self) -> bool:
        return self.future.done()

    def successful(self) -> bool:
        return self.future.done() and self.future.exception() is None

    def get(self, timeout: float | None = None):
        return self.future.result(timeout)

    def wait(self, timeout: float | None = None) -> None:
        wait_futures([self.future], timeout)
