"""`--mode simulate`: a whole cluster in one thread of this kernel, on a virtual clock.

What is real: the shard itself, the same `ShardCore` the hub drives (`nbdist.core.shard`: the
update rules and the hub optimizer, the group barrier, the run's `Coordinator` with chunks and
global epochs, DBS batch sizes, the SSP clock, speed groups, validation jobs, statistics), and
every gradient (the cell's own Keras model through `FlatModel`). What is virtual: time. A
worker's step takes `slowdown_w · cost(batch)` virtual seconds (`nbdist.core.simclock.CostModel`);
step completions are applied in (virtual time, worker id) order; each virtual worker computes on
the parameter copy it last pulled, so delays are those a cluster with these speeds would see.
Sync (`--sim sync=1`) is the group barrier with every worker in one group at the plain rate: the
batch-weighted mean of all gradients per step, at the pace of the slowest. With `--local-steps K`
(and DiLoCo) a virtual worker takes K steps with its own NumPy copy of the cell's optimizer
(`HubOptimizer`, as the hub reproduces it) and pushes the change, as a real worker does with
the cell's Keras optimizer.

What crosses the network (`nbdist.modes.simulate.network`): each push and pull goes through
the run's `--compression` encoders, as a TCP worker's do, and its bytes are counted
(`run.traffic`). It takes no virtual time unless `--sim bandwidth=...` or `latency=...` gives
the links: a push then reaches the hub, and a pull its worker, when the links let it
(`nbdist.core.links`). With `--sim per_push=...` the hub then works on each push for that
long, one push at a time (a push that arrives while it is busy waits), and applies it and
answers when done; without, it applies the push at its arrival. A worker given an evaluation
job evaluates before anything else, for the cost model's `eval_time`, and its result reaches
the history then, as a real worker's reaches the hub with its next message. A cell's own fit
call validates in the kernel at each epoch's gate, while the workers wait: its evaluation
moves the clock on by its `eval_time` too (`kernel_eval`: its samples and batch).

Nothing depends on the host's speed or scheduling, so a run is the same, bit for bit, for a
seed (on the same TensorFlow build and CPU kind; float reductions may differ across them).

`Simulation` answers the Run like a hub does (`stats`, `control`, `params`, `shutdown`), and
`SimBackend` (nbdist.modes.simulate.start) stands where `LocalBackend` stands, so `run.history`
(time = virtual seconds), `run.nodes`, `run.timeline`, `run.delays` and `run.report` work
unchanged.
"""

from __future__ import annotations

import heapq
import json
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from nbdist.algorithms.optimizers import HubOptimizer
from nbdist.core.compression import parse
from nbdist.core.plan import Plan
from nbdist.core.shard import ShardCore
from nbdist.core.simclock import CostModel, EventQueue, Jitter, SimOptions
from nbdist.engine.data import num_rows
from nbdist.engine.evaluate import check_finite, evaluate
from nbdist.errors import TrainingError
from nbdist.modes.common.worker import step_metrics
from nbdist.modes.simulate.calibrate import calibrate
from nbdist.modes.simulate.network import VirtualNetwork
from nbdist.wire.messages import Chunk, Control, EvalResult, Hello, Reply, Step

ONE_BATCH_EVAL = 4096  # validation sets up to this size are evaluated as one batch


@dataclass
class _Worker:
    """A virtual worker: the weights it last pulled and the step it is computing."""

    params: np.ndarray
    nt: np.ndarray
    chunks: list[Chunk] = field(default_factory=list)  # the step (or round of local steps)
    optimizer: HubOptimizer | None = None  # --local-steps: its copy of the cell's optimizer
    group: tuple[int, ...] = ()
    compute_s: float = 0.0
    last_push: float = 0.0  # virtual time of its last push (or 0): what came after is waiting
    comm_s: float = 0.0  # virtual time its last push and pull spent on the links
    arriving: tuple | None = None  # a push on its way to the hub: (step, gradient, nt delta)
    at_hub: bool = False  # the push arrived and waits for, or is in, the hub's work on it
    started: set = field(default_factory=set)
    busy_until: float = 0.0  # the end of its evaluation: it starts nothing before then


class Simulation:
    """One simulated run. `run()` (in a thread) plays it; the Run polls it like a hub."""

    def __init__(self, plan: Plan, rule_options: dict, flat, data, validation, params: np.ndarray,
                 non_trainable: np.ndarray, options: SimOptions, seed: int,
                 optimizer: dict | None = None, constraints: list[dict] | tuple = (),
                 compression: str = "none", inner_optimizer: dict | None = None,
                 shapes: Sequence[Sequence[int]] = (), kernel_eval: tuple[int, int] = (0, 1)):
        self.sync = options.sync
        if self.sync:  # one group of everyone, applied at the plain rate
            plan = replace(plan, algorithm="group", groups=1)
        if plan.local_steps == 1:  # virtual workers only compute gradients: the shard applies
            plan = replace(plan, lr_owner="hub")  # every rate (else the workers' optimizers do)
        elif inner_optimizer is None:
            raise ValueError("--local-steps needs the cell's optimizer for the virtual workers")
        self.plan, self.options, self.seed = plan, options, seed
        # data: an engine.data.ArraySource
        self.flat, self.data, self.validation = flat, data, validation
        n = plan.num_workers
        self.now = 0.0
        # the hub's own shard (`optimizer` and `constraints`: the cell's, as `choose_optimizer`
        # and `choose_constraints` give them), on virtual time
        self.core = ShardCore(plan, np.array(params, dtype=np.float32, copy=True), non_trainable,
                              now=lambda: self.now, rule_options=rule_options, optimizer=optimizer,
                              constraints=constraints, sync=self.sync)
        self.coordinator = self.core.coordinator
        self.cost = options.cost
        self.jitter = Jitter(options.jitter, seed, n)
        self.queue = EventQueue()
        self.workers = [_Worker(self.core.params.copy(), self.core.non_trainable.copy(),
                                optimizer=None if plan.local_steps == 1
                                else HubOptimizer(inner_optimizer, params.size))
                        for _ in range(n)]
        self.compression = compression
        # `shapes`: the trainable variables', where powersgd finds its matrices
        codec = parse(compression).bind(shapes, 0, self.core.params.size)
        self.network = VirtualNetwork(codec, n, self.core.params.size,
                                      self.core.non_trainable.size,
                                      options.links(n) if options.has_links else None, seed,
                                      sync=self.sync)
        self._weights = np.empty_like(self.core.params)  # the hub's answer, before the wire
        self.idle: set[int] = set()
        self.hub_free = 0.0  # when the hub is done with the pushes that reached it (per_push)
        self.next_eval = options.eval_every or math.inf
        # evaluations done, on their way to the history: (virtual time, worker, result, and
        # whether the worker then leaves)
        self._evals_due: list[tuple[float, int, EvalResult, bool]] = []
        # a worker's evaluation job: its samples, and the batch `evaluate` takes them in
        rows = 0 if validation is None else num_rows(validation[0])
        self._eval = (rows, rows if rows <= ONE_BATCH_EVAL else max(256, plan.batch_size))
        self._kernel_eval = kernel_eval  # what a fit call's kernel validates, and its batch
        self.error: BaseException | None = None
        self.ended = False
        self._stalled = 0
        self._lock = threading.Condition()

    # -- the Run's side (same shape as HubControl) ------------------------------------------

    def stats(self, since: int = 0, timeline: bool = False, timeout: float | None = None,
              during=None, clock=None) -> dict:
        """The Run's poll, answered in this kernel (`timeout`, `during`, `clock`: HubControl's;
        nothing to wait on)."""
        with self._lock:
            snap = self.core.stats(since, timeline)
            snap.update(error=None, dropped={}, finished=self.ended and self.error is None,
                        virtual=True)
            return json.loads(json.dumps(snap))  # a copy, as the hub's reply would be

    def control(self, **changes: object) -> None:
        with self._lock:
            if (changes.get("eval") is not None and self._kernel_eval[0] and not len(self.queue)
                    and not self._evals_due):
                # the kernel validated the epoch at its gate, nothing else running: that long
                self.now += self.cost.eval_time(*self._kernel_eval)
            self.core.control(Control(**changes))
            self._lock.notify_all()

    def params_now(self) -> tuple[np.ndarray, np.ndarray]:
        with self._lock:
            return self.core.result_weights(), self.core.non_trainable.copy()

    def shutdown(self) -> None:
        if not self.ended:
            self.control(stop=True)

    def cap_timeout(self, seconds: float) -> None:
        """Nothing to cap: no request here waits for an answer (HubControl's has)."""

    def close(self) -> None:
        pass

    # -- the play ----------------------------------------------------------------------------

    def calibrate(self, batch: int, cluster=None) -> CostModel:
        """Measure the model's step, the hub's round trip and its work per push (`calibrate.py`);
        use them."""
        found = calibrate(self.flat, self.core.params, self.core.non_trainable, self.data.x,
                          self.data.y, batch, self.options.jitter, cluster, self.compression)
        self.cost = found.cost
        self.options = replace(self.options, per_push_s=found.hub_per_push_s)
        self.coordinator.stats.record_event("sim_calibration", 0.0, **found.as_event())
        self.calibration = found
        return self.cost

    def run(self) -> None:
        try:
            with self._lock:
                c = self.cost
                self.coordinator.stats.record_event("sim_cost", 0.0, per_step_s=c.per_step_s,
                                                    per_sample_s=c.per_sample_s,
                                                    per_push_s=self.options.per_push_s,
                                                    jitter=c.jitter)
                for w in range(self.plan.num_workers):
                    self.core.hello(Hello(w, host="virtual", link="tcp",
                                          compression=self.compression))
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
        due = self._evals_due[0][0] if self._evals_due else None
        if due is not None and (not len(self.queue) or due <= self.queue.peek_time()):
            self._evaluate_until(due)
            self.now, w, result, leave = heapq.heappop(self._evals_due)
            self.core.eval_result(w, result)
            if leave:  # the run's end came with the job: it reported first, then left
                self._leave(w)
            self._stalled = 0  # progress: the loop goes on (and wakes the workers) next turn
            return True
        if self.coordinator.finished:
            return False
        if len(self.queue):
            t, w = self.queue.pop()
            self._evaluate_until(t)
            self.now = t
            if self.workers[w].arriving is None:
                self._complete_step(w)
            else:
                self._deliver(w)
        elif self.core.apply_gate_groups():
            pass  # an epoch's last group step, with members left without a batch before the gate
        elif ((self.coordinator.paused and not self.coordinator.stopping)
              or self.coordinator.at_gate):
            # nothing runs while paused or at an epoch gate; wait for the kernel
            self._lock.wait(0.1)
            if self.coordinator.at_gate:
                self._wake()
                return True
        elif self.core.barrier is not None and self.core.barrier.pending:
            # members wait for one that will not push (the end of the data): what the hub does
            # after GROUP_WAIT_LIMIT_S, done at once since virtual waiting costs nothing
            self.core.expire_groups(limit_s=0.0)
        before = self._progress()
        self._wake()
        self._stalled = 0 if len(self.queue) or self._progress() != before else self._stalled + 1
        if self._stalled > 3:
            raise TrainingError(
                f"The simulation stalled at virtual time {self.now:.3f}s: no worker computes and "
                f"none can go on (held: {sorted(self.core.held)}, idle: {sorted(self.idle)}). This "
                "is a bug in nbdist's simulator; please report it with the run's options.")
        return True

    def _progress(self) -> tuple:
        c = self.coordinator
        return (len(self.queue), len(c.gone), c.stats.global_step, len(c.stats.evals), c.paused,
                len(self._evals_due))

    def _answer(self, w: int, pull: bool) -> None:
        """The shard's reply to `w` (unless it holds it), and what the worker does with it."""
        reply = self.core.reply(w, pull)
        if reply is not None:
            self._take(w, pull, reply)

    def _take(self, w: int, pull: bool, work: Reply) -> None:
        """Virtual worker `w` acts on its reply: copy the weights, evaluate, leave, or start a
        step."""
        self.idle.discard(w)
        v = self.workers[w]
        start = self.now
        if pull:
            self.core.read_into(w, self._weights, plain=work.eval is not None)
            start = self.network.pull(w, self.now, self._weights, v.params,
                                      full=work.eval is not None)
            v.comm_s += start - self.now
            np.copyto(v.nt, self.core.non_trainable)
        start = max(start, v.busy_until)
        if work.eval:  # first, as a real worker does; the result goes with its next message
            metrics = self._evaluate_on(v.params, v.nt)
            start += self.cost.eval_time(*self._eval, float(work.slowdown))
            v.busy_until = start
            heapq.heappush(self._evals_due, (start, w, EvalResult(
                work.eval.epoch, metrics, work.eval.version), bool(work.done)))
        if work.done:
            if not work.eval:
                self._leave(w)
            return
        todo = [c for c in work.chunks if c.id not in v.started]
        if not pull and (todo or work.eval_pending):
            self._answer(w, pull=True)  # work after waiting: pull the current weights first
            return
        if not todo:
            self.idle.add(w)
            return
        v.chunks = todo[:self.plan.local_steps]
        v.started.update(c.id for c in v.chunks)
        v.group = tuple(work.group or (w,))
        if self.sync:  # every worker still here, also at the end of the data (a partial step)
            v.group = tuple(sorted(set(range(self.plan.num_workers)) - self.coordinator.gone))
        if v.optimizer is not None and work.lr is not None:
            v.optimizer.set_learning_rate(work.lr)  # the rate the coordinator tells its workers
        v.compute_s = sum(self.cost.step_time(c.size, float(work.slowdown), self.jitter.factor(w))
                          for c in v.chunks)
        self.queue.schedule(start + v.compute_s, w)

    def _complete_step(self, w: int) -> None:
        """Worker `w` finished computing: its real gradient on its own copy, pushed now (and
        applied when it reaches the hub)."""
        v = self.workers[w]
        chunks, v.chunks = v.chunks, []
        if v.optimizer is None:
            loss, grad, metrics, nt_after = self._gradient(w, chunks[0])
            nt_delta = nt_after - v.nt
        else:
            loss, grad, metrics, nt_delta = self._local_round(w, chunks)
        step = Step(w, push=True, pull=True, chunks=[c.id for c in chunks], loss=loss,
                    compute_s=v.compute_s,
                    wait_s=max(0.0, self.now - v.compute_s - v.last_push - v.comm_s),
                    comm_s=v.comm_s, batch=sum(c.size for c in chunks), group=list(v.group),
                    metrics=step_metrics(metrics))
        v.last_push = self.now
        grad, arrives = self.network.push(w, self.now, grad)
        step.traffic = list(self.network.traffic[w])
        v.comm_s = arrives - self.now
        if arrives > self.now or (self.options.per_push_s and not self.sync):
            # on the links until then, and at the hub (`_deliver`)
            v.arriving = (step, grad.copy(), nt_delta)
            self.queue.schedule(arrives, w)
            return
        self.core.push(step, grad, non_trainable_delta=nt_delta)
        self.core.settle()
        self._answer(w, pull=True)

    def _gradient(self, w: int, chunk: Chunk) -> tuple[float, np.ndarray, dict, np.ndarray]:
        """Worker `w`'s gradient on its copy for `chunk`: loss, gradient, metric increments,
        non-trainable state after."""
        v = self.workers[w]
        loss, grad, norm, nt_after = self.flat.assign_and_gradients(
            v.params, v.nt, *self.data.batch(chunk.epoch, chunk.start, chunk.stop))
        check_finite(loss, norm, step=self.coordinator.stats.workers[w].steps,
                     where=f"virtual worker {w} at virtual time {self.now:.3f}s", epoch=chunk.epoch)
        return loss, grad, {str(chunk.epoch): self.flat.last_metrics.tolist()}, nt_after

    def _local_round(self, w: int, chunks: list[Chunk]) -> tuple[float, np.ndarray, dict,
                                                                  np.ndarray]:
        """`--local-steps`: a step of worker `w`'s optimizer per chunk on its own copy; the
        change of its weights is what it pushes (as `Worker._local_round` does), with that of
        its non-trainable state."""
        v = self.workers[w]
        read, nt_read = v.params.copy(), v.nt.copy()
        totals: dict[str, np.ndarray] = {}
        loss = float("nan")
        for chunk in chunks:
            loss, grad, metrics, nt = self._gradient(w, chunk)
            v.optimizer.apply(v.params, grad)
            np.copyto(v.nt, nt)
            for key, values in metrics.items():
                totals[key] = totals.get(key, 0.0) + np.asarray(values)
        np.subtract(read, v.params, out=read)  # the change, as a gradient: w_read - w_local
        return loss, read, {k: t.tolist() for k, t in totals.items()}, v.nt - nt_read

    def _deliver(self, w: int) -> None:
        """Worker `w`'s push reaches the hub: applied now, and answered; with `per_push`, once
        the hub has done the pushes before it and this one's work."""
        v = self.workers[w]
        if self.options.per_push_s and not self.sync and not v.at_hub:
            self.hub_free = max(self.now, self.hub_free) + self.options.per_push_s
            v.at_hub = True
            v.comm_s += self.hub_free - self.now
            self.queue.schedule(self.hub_free, w)
            return
        v.at_hub = False
        (step, grad, nt_delta), v.arriving = v.arriving, None
        self.core.push(step, grad, non_trainable_delta=nt_delta)
        self.core.settle()
        self._answer(w, pull=True)

    def _wake(self) -> None:
        """Held replies that may now go out, and idle workers asking again for work."""
        for w, _, pull, reply in self.core.release():
            self._take(w, pull, reply)
        for w in sorted(self.idle):
            if w in self.idle and not self.queue.pending(w):
                self._answer(w, pull=False)

    def _leave(self, w: int) -> None:
        self.idle.discard(w)
        self.core.bye(w)

    # -- data and evaluation -----------------------------------------------------------------

    def _evaluate_on(self, params: np.ndarray, nt: np.ndarray) -> dict:
        if self.validation is None:
            return {}
        self.flat.assign(params, nt)
        return evaluate(self.flat.model, self.validation, self.plan.batch_size,
                        one_batch_limit=ONE_BATCH_EVAL)

    def _evaluate_until(self, t: float) -> None:
        """Periodic evaluations (`eval_every`) of the hub's weights at their virtual times."""
        while self.next_eval <= t and self.validation is not None:
            metrics = self._evaluate_on(self.core.params, self.core.non_trainable)
            self.coordinator.stats.record_eval(metrics,
                                               epoch=round(self.coordinator.epochs_done, 4),
                                               version=self.core.version, now=self.next_eval)
            self.next_eval += self.options.eval_every
