"""One pipeline stage on its engine (or a thread of the kernel in the in-process tests).

`prepare_stage` runs the cell, loads the kernel's initial weights, cuts out this stage's
sub-model and binds its socket; `run_stage` connects to the neighbours and trains: for each
mini-batch, the schedule's forwards and backwards of the M micro-batches (GPipe or 1F1B,
`nbdist.core.partition.schedule`), gradients summed with each micro-batch's share of the
mini-batch as weight, then one step of the cell's optimizer on this stage's own variables
(the passes on the kernel's Keras backend: `stage_pass`). The first stage reads the inputs,
the last one the labels, both in the order of `nbdist.core.schedule.epoch_permutation`, so
every stage agrees on each micro-batch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from nbdist.core.partition import schedule
from nbdist.core.schedule import epoch_permutation
from nbdist.engine.data import load, validation_arrays
from nbdist.engine.flat_layout import ensure_built, write_flat
from nbdist.engine.learning_rate import set_constant_lr
from nbdist.engine.run_cell import execute_cell
from nbdist.errors import CellError, DataError
from nbdist.modes.pipeline.graph import Graph, StageModel
from nbdist.modes.pipeline.link import StageLink
from nbdist.modes.pipeline.messages import (
    Backward,
    End,
    EvalDone,
    Forward,
    Ops,
    StepDone,
    Totals,
    Validation,
    Weights,
)
from nbdist.modes.pipeline.optimizer_slots import StageSlots, stage_slots
from nbdist.modes.pipeline.stage_pass import prediction, stage_pass

_STAGES: dict[tuple[str, int], object] = {}  # prepared stages of this process, by (run, stage)
VALIDATION_BATCH = 256  # samples per validation message, at least (or the batch size)


@dataclass
class StageSpec:
    run_id: str
    key: bytes = field(repr=False)  # the run key: signs every message, never printed
    stage: int
    stages: int
    bounds: tuple[int, int]
    micro_batches: int
    schedule: str
    batch_size: int
    epochs: int
    seed: int
    num_samples: int
    model_name: str
    data: tuple[str, ...]
    validation: tuple[str, ...] | None
    initial: tuple  # (params, non_trainable) as nbdist.engine.flat_layout.read_flat gives them
    source: str | None = None  # the cell; None: the namespace already holds the model (in process)
    pushed: dict = field(default_factory=dict)
    bind_host: str = "127.0.0.1"
    timeout: float = 120.0
    engine: int | None = None
    threads: int | None = None
    lr: float | None = None  # --lr: overrides the cell's optimizer's rate
    own_optimizer: bool = True  # False: stages share one model in one process, each needs its own
    transport: str = "auto"  # --transport: shared memory with same-host neighbours (auto), tcp, shm
    # (frames, bytes) at most per message it receives (checks.message_limits)
    limits: tuple[int, int] | None = None
    encrypt: bool = False  # --encrypt (the cluster's): CurveZMQ on the stage's sockets
    local_rank: int = 0  # this stage's index among the run's stages on its host: its own GPU
    keras_backend: str = "tensorflow"  # the kernel's Keras backend: the cell runs on it here too
    # a cell's fit call: at each epoch's end the stage sends its weights to the kernel and waits
    # until the kernel has run the call's callbacks (the epoch gate); the kernel validates
    gated: bool = False
    shuffle: bool = True  # model.fit(shuffle=False): every epoch in the data's own order
    # a callback saves the whole model: the stage's optimizer slots travel with its weights
    send_optimizer: bool = False
    # started again after a stage's engine died (nbdist.modes.pipeline.runtime): the epoch to
    # begin with, and every stage's weights at the end of the one before, by step
    first_epoch: int = 0
    resume_weights: dict | None = field(default=None, repr=False)

    @property
    def steps_before(self) -> int:
        """The optimizer steps of the epochs before `first_epoch` (one per mini-batch)."""
        return self.first_epoch * -(-self.num_samples // self.batch_size)


def prepare_stage(spec: StageSpec, namespace: dict | None = None) -> dict:
    """Build this stage and bind its socket; returns what its neighbours need to reach it (the
    endpoint, and the host, for shared memory between stages on one host)."""
    ns = execute_cell(spec.source, spec.pushed, spec.threads, spec.local_rank, namespace,
                      backend=spec.keras_backend, engine=spec.engine)
    stage = Stage(spec, ns)
    _STAGES[(spec.run_id, spec.stage)] = stage
    return stage.link.info


def run_stage(run_id: str, stage: int, neighbours: dict, report: dict, control: dict) -> dict:
    """Train this prepared stage to the end; returns its weights and totals."""
    worker = _STAGES.pop((run_id, stage))
    try:
        worker.link.connect(neighbours, report, control)
        return worker.run()
    finally:
        worker.link.close()


def discard_stage(run_id: str, stage: int) -> None:
    """Forget a prepared stage that will not run (another stage failed to start)."""
    worker = _STAGES.pop((run_id, stage), None)
    if worker is not None:
        worker.link.close()


def stage_data(ns: dict, spec: StageSpec, model) -> tuple:
    """(x, y, validation) as the cell defines them on this engine."""
    missing = [n for n in (spec.model_name, *spec.data, *(spec.validation or ())) if n not in ns]
    if missing:
        raise CellError(f"On engine {spec.engine} the cell did not define {', '.join(missing)}. "
                        "Define them inside the %%distribute cell (engines do not see other "
                        "cells).")
    if len(spec.data) == 1:
        loaded = load(ns[spec.data[0]], spec.data[0], "--data", model, limit=None)
        x, y = loaded.x, loaded.y
    else:
        x, y = (np.asarray(ns[n]) for n in spec.data)
    if x.dtype == np.float64:
        x = x.astype(np.float32)
    return x, y, validation_arrays(ns, spec.validation, model)


class Stage:
    """A stage's model, optimizer, data and link, and its training loop."""

    def __init__(self, spec: StageSpec, ns: dict):
        self.spec = spec
        model = ns[spec.model_name]
        x, y, self.validation = stage_data(ns, spec, model)
        if len(x) != spec.num_samples:
            raise DataError(f"Stage {spec.stage} (engine {spec.engine}) found {len(x)} samples "
                            f"where the kernel had {spec.num_samples}; the cell must define the "
                            "same data every time it runs.")
        ensure_built(model, x[:2], y[:2])  # the compiled loss's variables too, as fit makes them
        if spec.source is not None:  # a model of this engine's own: the kernel's starting weights
            write_flat(model, *spec.initial)
        self.model, self.x, self.y = model, x, y
        self.graph = Graph(model)
        if spec.resume_weights is not None:  # started again: the last epoch end's weights
            self.graph.assign(spec.resume_weights)
        self.sub = StageModel(self.graph, *spec.bounds)
        self.first, self.last = spec.stage == 0, spec.stage == spec.stages - 1
        optimizer = model.optimizer
        if not spec.own_optimizer:
            optimizer = type(optimizer).from_config(optimizer.get_config())
        if spec.lr is not None:
            optimizer.learning_rate = spec.lr
        if spec.first_epoch:  # started again: a schedule goes on from the steps already taken
            optimizer.iterations.assign(spec.steps_before)
        self.optimizer = optimizer
        self.passes = stage_pass(self.sub, model, input_grads=not self.first)
        # slots: at most M messages are sent towards a neighbour before the sender next waits
        # (and reads the acks); twice that spares the TCP fallback (see link.py)
        self.link = StageLink(spec.key, spec.run_id, spec.stage, spec.bind_host, spec.timeout,
                              spec.limits, transport=spec.transport,
                              slots=2 * spec.micro_batches + 2, encrypt=spec.encrypt)

    # -- the loop ---------------------------------------------------------------------------

    def run(self) -> dict:
        spec = self.spec
        n, b = spec.num_samples, spec.batch_size
        step, started = spec.steps_before, time.time()
        if spec.gated and spec.first_epoch:  # started again: the kernel's callbacks of the epoch
            self.link.wait_release(spec.first_epoch - 1)  # before may still run (`Alive` says)
        for epoch in range(spec.first_epoch, spec.epochs):
            perm = epoch_permutation(n, spec.seed, epoch) if spec.shuffle else np.arange(n)
            if self.last:
                self.model.reset_metrics()
            for start in range(0, n, b):
                step += 1
                if not self._begin_step(step):
                    return self._result(step - 1, started)
                index = perm[start:start + b]
                self._train_step(step, epoch,
                                 np.array_split(index, min(spec.micro_batches, len(index))))
            train_metrics = self._metrics() if self.last else {}
            self._validate(step, epoch, train_metrics)
            if spec.gated and epoch + 1 < spec.epochs:
                self._epoch_gate(epoch)
        return self._result(step, started)

    def _epoch_gate(self, epoch: int) -> None:
        """A fit call's epoch end: this stage's weights to the kernel, then wait until its
        callbacks have run on the whole model (or it asks to stop)."""
        weights, slots = self._state()
        self.link.report(Weights(self.spec.stage, epoch, slots.steps,
                                 [len(weights[k]) for k in slots.steps], slot_of=slots.slot_of,
                                 slot_names=slots.slot_names, iterations=slots.iterations),
                         [np.asarray(a) for k in slots.steps for a in weights[k]] + slots.values)
        self.link.wait_release(epoch)

    def _state(self) -> tuple[dict[int, list], StageSlots]:
        """This stage's variables' values by step, and its optimizer's slots over them (none
        unless the kernel saves the whole model)."""
        variables = self.graph.variables(*self.spec.bounds)
        steps = sorted(variables)
        ordered = [v for k in steps for v in variables[k]]
        slots = (stage_slots(self.optimizer, ordered) if self.spec.send_optimizer
                 else ([], [], [], 0))
        return {k: [v.numpy() for v in variables[k]] for k in steps}, StageSlots(steps, *slots)

    def _begin_step(self, step: int) -> bool:
        """False when the run stops before `step`: stage 0 decides and tells the next stage."""
        link, s = self.link, self.spec.stage
        if link.new_rate is not None:  # run.set_lr, or a callback's new rate
            set_constant_lr(self.optimizer, link.new_rate)
            link.new_rate = None
        if self.first:
            link.check_control()
            if link.stop_requested:
                if self.spec.stages > 1:
                    link.send("stage-1", End(step))
                return False
            return True
        key, header, arrays = link.wait(("F", step, 0), ("end", step, 0))
        if key[0] == "end":
            if not self.last:
                link.send(f"stage-{s + 1}", End(step))
            return False
        link.buffer[key] = (header, arrays)  # put the first forward back for the schedule
        return True

    def _train_step(self, step: int, epoch: int, micro: list) -> None:
        spec, link, s, passes = self.spec, self.link, self.spec.stage, self.passes
        m, total = len(micro), sum(len(i) for i in micro)
        loss_sum, ops = 0.0, []
        for kind, i in schedule(spec.schedule, spec.stages, m, s):
            # each op's time starts once its input is here: waiting for a neighbour is idle
            if kind == "F":
                if self.first:
                    t0, inputs = time.time(), [self.x[micro[i]]]
                else:
                    _, _, inputs = link.wait(("F", step, i))
                    t0 = time.time()
                if self.last:
                    loss, pred = passes.forward_loss(inputs, self.y[micro[i]],
                                                     len(micro[i]) / total, i)
                    loss_sum += loss
                    self.model.compute_metrics(None, self.y[micro[i]], pred, None)
                else:
                    link.send(f"stage-{s + 1}", Forward(step, i), passes.forward(inputs, i))
            else:
                if self.last:
                    t0, upstream = time.time(), None
                else:
                    _, _, upstream = link.wait(("B", step, i))
                    t0 = time.time()
                back = passes.backward(i, upstream)
                if not self.first:
                    link.send(f"stage-{s - 1}", Backward(step, i), back)
            ops.append([kind, i, t0, time.time()])
        t0 = time.time()
        passes.apply(self.optimizer)
        ops.append(["U", -1, t0, time.time()])
        link.report(Ops(s, link.sent_bytes, dict(link.messages), link.drops(), step, epoch, ops))
        if self.last:
            # the step's mean loss into the loss tracker, as Keras's train_step: the epoch's logs
            self.model._loss_tracker.update_state(loss_sum, sample_weight=total)  # noqa: SLF001
            link.report(StepDone(step, epoch, loss_sum, total, time.time()))

    def _metrics(self) -> dict:
        result = self.model.get_metrics_result()
        return {k: float(v) for k, v in result.items() if k != "loss" and np.ndim(v) == 0}

    def _validate(self, step: int, epoch: int, train_metrics: dict) -> None:
        """Validation batches forward through the stages; the last one reports the metrics."""
        spec, link, s = self.spec, self.link, self.spec.stage
        if self.validation is None:
            if self.last:
                link.report(EvalDone(step, epoch, time.time(), train=train_metrics,
                                     state=self._metric_state()))
            return
        xv, yv = self.validation
        size = max(VALIDATION_BATCH, spec.batch_size)
        if self.last:
            self.model.reset_metrics()
        loss, seen = 0.0, 0
        for j, start in enumerate(range(0, len(yv), size)):
            if self.first:
                batch = np.asarray(xv[start:start + size])
                inputs = [batch.astype(np.float32) if batch.dtype == np.float64 else batch]
            else:
                _, _, inputs = link.wait(("E", step, j))
            out = self.passes.evaluate(inputs)
            if self.last:
                model, y = self.model, yv[start:start + size]
                pred = prediction(model, out)
                loss += float(model._compile_loss(y, pred)) * len(y)  # noqa: SLF001
                seen += len(y)
                model.compute_metrics(None, y, pred, None)
            else:
                link.send(f"stage-{s + 1}", Validation(step, j), [np.asarray(o) for o in out])
        if self.last:
            metrics = {"loss": loss / max(1, seen), **self._metrics()}
            link.report(EvalDone(step, epoch, time.time(), metrics, train_metrics))

    def _metric_state(self) -> list[float]:
        """The model's metric variables now (the epoch's), flat: a fit call's epoch logs."""
        return [float(v) for var in self.model.metrics_variables
                for v in np.asarray(var.numpy(), np.float64).ravel()]

    def _result(self, steps: int, started: float) -> dict:
        """The stage's totals, also reported to the kernel (what it refused after its last step)."""
        link = self.link
        link.report(Totals(self.spec.stage, link.sent_bytes, dict(link.messages), link.drops()))
        weights, slots = self._state()
        return {"stage": self.spec.stage, "steps": steps, "seconds": time.time() - started,
                "weights": weights,
                "slots": {"slot_of": slots.slot_of, "slot_names": slots.slot_names,
                          "values": slots.values, "iterations": slots.iterations},
                "sent_bytes": link.sent_bytes, "messages": dict(link.messages),
                "dropped": link.drops()}
