"""The worker of a run through the hub: execute the cell, then pull -> compute -> push.

`run_worker(spec)` is what the kernel sends to each worker engine (`--mode async`), or runs
on a thread of its own (`--mode local`, on the kernel's namespace). It runs the user's cell
(`nbdist.engine.run_cell`, as every mode does), checks that the model has the same variables
as the kernel's, and trains on the chunks the hub hands out
until the hub says it is done. Control (pause, stop, learning rate) arrives on every reply.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field, replace

import numpy as np

from nbdist.algorithms.easgd import elastic_exchange
from nbdist.algorithms.streaming import merge_fragment, round_steps
from nbdist.cluster import affinity
from nbdist.engine.blas_threads import for_compression
from nbdist.engine.evaluate import check_finite, evaluate
from nbdist.engine.flat_layout import layout, write_rng_state
from nbdist.engine.flatmodel import FlatModel
from nbdist.engine.run_cell import run_cell
from nbdist.errors import CellError
from nbdist.hub.client import WorkerTransport
from nbdist.modes.common.courier import Courier, WayChooser
from nbdist.modes.common.courier import wanted as courier_wanted
from nbdist.wire.messages import Chunk, EvalJob, EvalResult, Reply, Step

log = logging.getLogger(__name__)
IDLE_POLL_S = 0.02  # how often a worker with nothing to do asks the hub again


def step_metrics(per_epoch: dict[str, list[float]]) -> dict[str, list[float]] | None:
    """A push's metric increments per epoch (`nbdist.engine.step_metrics`), for its `metrics`;
    None when the model keeps no metric state."""
    return per_epoch if any(per_epoch.values()) else None


@dataclass
class WorkerSpec:
    """What one worker needs; sent to its engine by ipyparallel."""

    run_id: str
    key: bytes = field(repr=False)  # the run key: signs every message, never printed
    worker: int
    shards: list[dict]
    layout: dict
    model_name: str
    data: tuple[str, ...]  # arrays (inputs, labels), or one tf.data.Dataset / generator function
    validation: tuple[str, ...] | None
    seed: int
    num_samples: int
    batch_size: int
    source: str | None = None  # the cell; None: the namespace already holds its results
    pushed: dict = field(default_factory=dict)  # arrays the cell uses but does not define
    transport: str = "auto"
    # --compression: the codec of pushes and pulls across hosts (nbdist.core.compression)
    compression: str = "none"
    timeout: float = 120.0
    threads: int | None = None  # TensorFlow intra-op threads; None: TensorFlow's default
    local_rank: int = 0
    engine: int | None = None
    overlap: bool = False  # send step t while computing step t+1
    # (index, hubs, workers) on this host: --pin auto (nbdist.cluster.affinity)
    pin: tuple[int, int, int] | None = None
    spin_s: float = 0.0  # > 0: poll this long for a same-host hub's reply before sleeping (--spin)
    local_steps: int = 1  # steps with the cell's optimizer between exchanges
    # streaming-diloco (nbdist.algorithms.streaming): P fragments (0: whole pushes), τ inner
    # steps while a fragment's exchange is in flight, α the mixing factor of its merge
    fragments: int = 0
    overlap_steps: int = 0
    mix: float = 0.0
    easgd_alpha: float = 0.0  # > 0: EASGD elastic exchange every `local_steps` steps
    stream: bool = False  # the dataset is read as this worker's shard instead of held in memory
    num_workers: int = 1  # how many shards a streamed dataset is cut into
    # (x, y[, weights]) already in this process (--mode local), not sent
    preloaded: tuple | None = None
    shuffle: bool = True  # a new order each pass (fit's shuffle=False: the data's own order)
    # samples per epoch, when fewer than a pass (fit's steps_per_epoch)
    epoch_size: int | None = None
    take_batches: int | None = None  # batches of a repeating dataset that make the data
    keras_backend: str = "tensorflow"  # the kernel's Keras backend: the cell runs on it here too
    # the kernel model's integer state (dropout seeds, `flatmodel.rng_state`): None keeps this
    # model's own
    rng_state: list | None = None


def run_worker(spec: WorkerSpec, namespace: dict | None = None) -> dict:
    """Train on the hub's chunks until done; returns this worker's totals."""
    spec = pin_worker(spec)
    model, data, validation = run_cell(spec, namespace)
    if layout(model) != spec.layout:
        raise CellError(
            f"The model built on engine {spec.engine} differs from the kernel's "
            f"(variables {layout(model)['trainable']} vs {spec.layout['trainable']}). "
            "The cell must build the same model every time it runs: avoid random architecture "
            "choices or state from other cells."
        )
    flat = FlatModel(model)
    # Trace the compiled step now, before saying hello, so every worker starts training at
    # the same moment; hello's pull then overwrites whatever this step changed.
    # Two batch sizes, so the traced function already takes any batch size: DBS and an epoch's
    # last chunk change it later, and a retrace then would count as (slow) compute time.
    if data.in_memory:  # arrays: batches are gathered inside the compiled step
        flat.hold(data.x, data.y, data.sample_weight)
    for size in (spec.batch_size, max(1, spec.batch_size // 2)):
        if flat.holds_data:
            flat.assign_and_gradients_at(*flat.read(),
                                         np.arange(min(size, data.num_samples), dtype=np.int64))
        else:
            flat.assign_and_gradients(*flat.read(), *data.head(size))
    if spec.rng_state is not None:  # after the traced steps, which drew masks
        write_rng_state(model, spec.rng_state, spec.worker)
    transport = WorkerTransport(spec.key, spec.worker, spec.shards, flat.nt_size, spec.transport,
                                spec.timeout, spec.engine, compression=spec.compression,
                                shapes=spec.layout["trainable"],
                                spin_s=spec.spin_s, seed=spec.seed, fragments=spec.fragments)
    try:  # powersgd's factors on one BLAS thread (nbdist.engine.blas_threads)
        with for_compression(spec.compression):
            return _AsyncLoop(spec, flat, transport, data, validation).run()
    finally:
        transport.close()


def pin_worker(spec):
    """--pin auto: this engine's threads on the worker's cores, TensorFlow's intra-op threads
    as many as those cores (before TensorFlow starts); otherwise undo an earlier run's pin."""
    if spec.pin is None:
        affinity.unpin_process()
        return spec
    index, hubs, workers = spec.pin
    placement = affinity.apply("worker", index, hubs, workers)
    return spec if placement is None else replace(spec, threads=placement.threads)


class _AsyncLoop:
    """pull -> compute -> push until the hub says done; the three shapes of a step:

    - plain: compute on the weights of the last pull, push the gradient and pull in one trip;
    - `overlap`: push step t and receive its reply while computing step t+1 (one more step
      of delay, communication hidden behind compute);
    - `local_steps` > 1 (or EASGD): K steps with the cell's optimizer, then push the delta
      `w_read - w_local` (or, for EASGD, the elastic difference);
    - `fragments` > 0 (streaming-diloco): rounds of ceil(H / P) steps, each pushing one
      fragment's delta and merging its new global weights into the worker's own
      (`_streaming_round`); the model always holds the worker's own weights.
    """

    def __init__(self, spec: WorkerSpec, flat, transport, data, validation):
        self.spec, self.flat, self.transport = spec, flat, transport
        self.data, self.validation = data, validation
        self.started: set[int] = set()
        self.eval_result: EvalResult | None = None  # for the next message to the coordinator
        self.comm_s = self.wait_s = 0.0
        self.steps = 0
        self.lr = None
        self._assign_pending = False
        self._pending = (np.empty_like(transport.params), np.empty_like(transport.non_trainable))
        self._nt_model = np.zeros_like(transport.non_trainable)  # non-trainable state in the model
        # With a stateless FlatModel the variables lag behind: the weights of the last pull
        # (`_in_use`, a buffer nothing writes until the next pull) and `_nt_model` are the model.
        self._in_use: np.ndarray | None = None
        self._model_current = True  # the variables hold those weights
        self._courier = (Courier(transport) if spec.overlap and courier_wanted(transport.link)
                         else None)
        self._ways = WayChooser()  # by courier or not: whichever makes the steps faster here
        self._by_courier = False  # the exchange in flight went by courier
        # streaming-diloco: the global weights each fragment was last merged with (from the
        # hello's on), and the chunks trained while the last fragment was in flight (pushed
        # with the next one)
        self._anchor: np.ndarray | None = None
        self._carried: list[Chunk] = []
        self._carried_metrics: dict[str, np.ndarray] = {}
        self._loss = math.nan  # the latest inner step's
        self._carried_s = 0.0  # the carried chunks' compute time

    def run(self) -> dict:
        try:
            return self._run()
        finally:
            if self._courier is not None:
                self._courier.close()

    def _run(self) -> dict:
        t = self.transport
        reply = t.hello()
        self._assign()
        if self.spec.fragments:  # streaming: the model trains from the hello's weights on
            self._sync_model()
            self._anchor = t.params.copy()
        fresh = True  # the model holds the parameters of the last pull
        in_flight = False
        while True:
            if reply.eval is not None and self.spec.fragments:
                self.eval_result = self._evaluate_global(reply.eval)
            elif reply.eval is not None:
                self._sync_model()
                self.eval_result = self._evaluate(reply.eval)
                if not in_flight:
                    fresh = False  # others pushed while we evaluated: pull before computing
            if reply.done:
                if in_flight:
                    self._await_reply()
                if self.eval_result is not None:
                    t.step(self._new_step(push=False, pull=False))
                break
            self._follow_lr(reply)
            todo = self._carried + [c for c in reply.chunks if c.id not in self.started]
            if in_flight and (not todo or not self.spec.overlap):
                reply, in_flight, fresh = self._receive(), False, True
                continue
            if not todo or not fresh:
                # streaming: the model is the worker's own; a pull only fetches an evaluation
                pull = reply.eval_pending if self.spec.fragments else (not fresh
                                                                      or reply.eval_pending)
                t0 = time.perf_counter()
                if not pull:
                    time.sleep(IDLE_POLL_S)
                reply = t.step(self._new_step(push=False, pull=pull))
                self.wait_s += time.perf_counter() - t0
                if self.spec.fragments:  # streaming: the worker's own weights stay fresh
                    continue
                if pull:
                    self._assign()
                    fresh = True
                elif reply.chunks:
                    fresh = False  # work after waiting: pull the current weights first
                continue
            if self.spec.fragments:
                reply = self._streaming_round(todo, reply)
            elif self.spec.local_steps > 1 or self.spec.easgd_alpha:
                reply = self._local_round(todo[: self.spec.local_steps], reply)
            elif self.spec.overlap:
                reply, in_flight = self._overlapped_step(todo[0], reply, in_flight)
            else:
                reply = self._plain_step(todo[0], reply)
        t.bye()
        return {"worker": self.spec.worker, "steps": self.steps,
                "keras_backend": self.spec.keras_backend,
                # streamed: passes over its shard begun
                "shard_passes": getattr(self.data, "passes", None)}

    # -- the three step shapes --------------------------------------------------------------

    def _plain_step(self, chunk: Chunk, reply: Reply) -> Reply:
        step, t1 = self._compute(chunk, reply)
        reply = self.transport.step(self._share(step, reply, chunk))
        self._assign()
        self.comm_s = time.perf_counter() - t1
        return reply

    def _overlapped_step(self, chunk: Chunk, reply: Reply, in_flight: bool) -> tuple[Reply, bool]:
        step, _ = self._compute(chunk, reply, write_grad=False)
        if in_flight:  # step t-1's reply: its weights arrive after step t was computed
            reply = self._receive()
            step.lag = 1  # so the hub counts the delay from the read before (and DC uses it)
        self._write_grad()
        self._sent_at = time.perf_counter()
        self._by_courier = self._courier is not None and self._ways.next(self._sent_at)
        self._sent = self._share(step, reply, chunk)
        if self._by_courier:  # across hosts: signing, sending and checking leave this thread
            self._courier.send(self._sent)
        else:
            self.transport.send_step(self._sent)
        return reply, True

    def _receive(self) -> Reply:
        reply, replied_at = self._await_reply()
        self._assign()
        self.comm_s = replied_at - self._sent_at
        return reply

    def _await_reply(self) -> tuple[Reply, float]:
        """The overlapped push's reply, and when it was in."""
        if self._by_courier:
            return self._courier.receive()
        return self.transport.receive_step(self._sent), time.perf_counter()

    def _local_round(self, chunks: list[Chunk], reply: Reply) -> Reply:
        """K local steps with the cell's optimizer, then one exchange with the hub."""
        t, flat = self.transport, self.flat
        self._sync_model()
        w_read = t.params.copy()
        t0 = time.perf_counter()
        loss = math.nan
        metrics: dict[str, np.ndarray] = {}
        for chunk in chunks:
            self.started.add(chunk.id)
            loss = flat.local_step(*self._batch(chunk))
            key = str(chunk.epoch)
            metrics[key] = flat.last_metrics + metrics[key] if key in metrics else flat.last_metrics
        compute_s = self._slow_down(time.perf_counter() - t0, reply)
        self._check(loss, 0.0, chunk)
        w_local, nt_local = flat.read()
        step = self._new_step(push=True, pull=not self.spec.easgd_alpha,
                              chunks=[c.id for c in chunks], loss=loss, compute_s=compute_s,
                              comm_s=self.comm_s, wait_s=self._take_wait(),
                              metrics=step_metrics({k: v.tolist() for k, v in metrics.items()}))
        np.subtract(nt_local, self._nt_model, out=t.nt_delta)
        t1 = time.perf_counter()
        if self.spec.easgd_alpha:
            # read the center x~ (not into the model)
            pulled = t.step(Step(self.spec.worker, pull=True))
            if pulled.eval is not None:  # a validation job is for the hub's weights: the center
                flat.assign(t.params, t.non_trainable)
                step.eval = self._evaluate(pulled.eval)
            center = t.params.copy()
            np.copyto(t.grad, elastic_exchange(w_local, center, self.spec.easgd_alpha))
            reply = t.step(self._share(step, reply, *chunks))
            flat.assign(w_local, nt_local)  # x_i after the exchange
            self._nt_model = nt_local
        else:
            np.subtract(w_read, w_local, out=t.grad)
            reply = t.step(self._share(step, reply, *chunks))
            self._assign()
        self.comm_s = time.perf_counter() - t1
        self.steps += 1
        return reply

    def _streaming_round(self, todo: list[Chunk], reply: Reply) -> Reply:
        """streaming-diloco's round: ceil(H / P) inner steps, the delta of the fragment the hub
        named (`reply.fragment`) sent, `overlap_steps` more steps on the chunks in hand while
        it is in flight, then the new global fragment merged in (`merge_fragment`)."""
        t, flat, spec = self.transport, self.flat, self.spec
        fragment = reply.fragment or 0
        chunks = todo[:round_steps(spec.local_steps, spec.fragments)]
        t0 = time.perf_counter()
        metrics = self._inner_steps(chunks[len(self._carried):], self._carried_metrics)
        # with the overlapped steps' own time, as slowed down, from the round before
        compute_s = self._slow_down(time.perf_counter() - t0, reply) + self._carried_s
        self._check(self._loss, 0.0, chunks[-1])
        w_local, nt_local = flat.read()
        spans = [t.span(i, fragment) for i in range(len(t.bounds))]
        for lo, hi in spans:
            np.subtract(self._anchor[lo:hi], w_local[lo:hi], out=t.grad[lo:hi])
        np.subtract(nt_local, self._nt_model, out=t.nt_delta)
        step = self._share(self._new_step(
            push=True, pull=True, fragment=fragment, chunks=[c.id for c in chunks], loss=self._loss,
            compute_s=compute_s, comm_s=self.comm_s, wait_s=self._take_wait(),
            metrics=step_metrics({k: v.tolist() for k, v in metrics.items()})), reply, *chunks)
        t1 = time.perf_counter()
        t.send_step(step)
        self.steps += 1
        # τ steps on the next round's chunks while the fragment is in flight
        self._carried = todo[len(chunks):len(chunks) + spec.overlap_steps]
        self._carried_metrics = {}
        t2 = time.perf_counter()
        self._inner_steps(self._carried, self._carried_metrics)
        self._carried_s = self._slow_down(time.perf_counter() - t2, reply) if self._carried else 0.0
        overlap_s = time.perf_counter() - t2
        reply = t.receive_step(step)
        w_now, nt_now = flat.read()
        for lo, hi in spans:
            merge_fragment(w_now[lo:hi], t.params[lo:hi], spec.mix)
            np.copyto(self._anchor[lo:hi], t.params[lo:hi])
        # the hub's non-trainable state, and what the overlapped steps changed in it since
        flat.assign(w_now, t.non_trainable + (nt_now - nt_local))
        self._nt_model = t.non_trainable.copy()
        self.comm_s = time.perf_counter() - t1 - overlap_s
        return reply

    def _inner_steps(self, chunks: list[Chunk],
                     metrics: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Steps with the cell's optimizer on `chunks`; their metric increments are added to
        `metrics` by epoch, the last loss kept in `_loss`. Returns `metrics`."""
        for chunk in chunks:
            self.started.add(chunk.id)
            self._loss = self.flat.local_step(*self._batch(chunk))
            key = str(chunk.epoch)
            last = self.flat.last_metrics
            metrics[key] = last + metrics[key] if key in metrics else last
        return metrics

    def _evaluate_global(self, job: EvalJob) -> EvalResult:
        """streaming-diloco's evaluation: of the hub's weights, which the reply that brought
        the job carried whole, in float32 (`Hub._pull_frame`), not of the worker's own, which
        it keeps training from."""
        flat, t = self.flat, self.transport
        w_local, nt_local = flat.read()
        flat.assign(t.params, t.non_trainable)
        result = self._evaluate(job)
        flat.assign(w_local, nt_local)
        return result

    # -- pieces -----------------------------------------------------------------------------

    def _compute(self, chunk: Chunk, reply: Reply, write_grad: bool = True) -> tuple[Step, float]:
        self.started.add(chunk.id)
        t0 = time.perf_counter()
        flat = self.flat
        if flat.holds_data:  # the chunk's indices go in; the compiled call gathers the batch
            batch = (self.data.indices(chunk.epoch, chunk.start, chunk.stop),)
            with_assign, alone = flat.assign_and_gradients_at, flat.gradients_at
        else:
            batch = self._batch(chunk)
            with_assign, alone = flat.assign_and_gradients, flat.gradients
        if self._assign_pending:
            params, nt = (self._pending if self.spec.overlap
                          else (self.transport.params, self.transport.non_trainable))
            loss, grad, grad_norm, nt_after = with_assign(params, nt, *batch)
            self._assign_pending = False
            self._nt_model = nt.copy()  # small: the base of this step's non-trainable change
            self._in_use = params
            self._model_current = not flat.stateless
        elif not self._model_current:  # stateless: the weights of the last pull go in again
            loss, grad, grad_norm, nt_after = with_assign(self._in_use, self._nt_model, *batch)
        else:
            loss, grad, grad_norm, nt_after = alone(*batch)
        compute_s = self._slow_down(time.perf_counter() - t0, reply)
        self._check(loss, grad_norm, chunk)
        self._grad, self._nt_after = grad, nt_after
        if write_grad:
            self._write_grad()
        self.steps += 1
        step = self._new_step(push=True, pull=True, chunks=[chunk.id], loss=loss,
                              compute_s=compute_s, comm_s=self.comm_s, wait_s=self._take_wait(),
                              # several shards: global clipping needs the whole norm
                              norm=grad_norm,
                              metrics=step_metrics({str(chunk.epoch): flat.last_metrics.tolist()}))
        return step, time.perf_counter()

    def _write_grad(self) -> None:
        np.copyto(self.transport.grad, self._grad)
        np.subtract(self._nt_after, self._nt_model, out=self.transport.nt_delta)
        self._nt_model = self._nt_after  # the model now holds this state

    def _batch(self, chunk: Chunk) -> tuple:
        """The chunk's samples, (x, y[, weights]): its slice of the epoch, or (streamed) as
        many samples as it holds from this worker's shard."""
        return self.data.batch(chunk.epoch, chunk.start, chunk.stop)

    def _slow_down(self, compute_s: float, reply: Reply) -> float:
        """Simulate a node `slowdown` times slower: sleep (factor - 1) x the compute time."""
        factor = float(reply.slowdown)
        if factor > 1.0:
            time.sleep((factor - 1.0) * compute_s)
            return compute_s * factor
        return compute_s

    def _check(self, loss: float, grad_norm: float, chunk: Chunk) -> None:
        check_finite(loss, grad_norm, step=self.steps, where=f"worker {self.spec.worker}",
                     epoch=chunk.epoch)

    def _assign(self) -> None:
        """The pulled weights go into the model with the next gradient call (one compiled call
        instead of two); overlap keeps its own copy, as the hub may write the next reply into
        shared memory while this step computes."""
        if self.spec.overlap:
            np.copyto(self._pending[0], self.transport.params)
            np.copyto(self._pending[1], self.transport.non_trainable)
        self._assign_pending = True

    def _sync_model(self) -> None:
        """Write pending pulled weights into the model now (before evaluating or local steps),
        or, after stateless steps, the weights those steps computed on."""
        if self._assign_pending:
            params, nt = (self._pending if self.spec.overlap
                          else (self.transport.params, self.transport.non_trainable))
            self.flat.assign(params, nt)
            self._assign_pending = False
            self._nt_model = nt.copy()
        elif not self._model_current:
            self.flat.assign(self._in_use, self._nt_model)
        self._model_current = True

    def _share(self, step: Step, reply: Reply, *chunks: Chunk) -> Step:
        """`step` with what every shard's barrier needs under group sync: the group (from the
        last reply) and the samples pushed."""
        if reply.group:
            step.group, step.batch = reply.group, sum(c.size for c in chunks)
        return step

    def _follow_lr(self, reply: Reply) -> None:
        lr = reply.lr
        if (lr is not None and lr != self.lr
                and (self.spec.local_steps > 1 or self.spec.easgd_alpha)):
            self.flat.set_learning_rate(lr)
        self.lr = lr

    def _new_step(self, **fields) -> Step:
        """This worker's next message to the coordinator, with the validation result it owes."""
        result, self.eval_result = self.eval_result, None
        return Step(self.spec.worker, eval=result, **fields)

    def _evaluate(self, job: EvalJob) -> EvalResult:
        """The validation job `job` on the weights in the model now."""
        return EvalResult(job.epoch, evaluate(self.flat.model, self.validation,
                                              self.spec.batch_size), job.version)

    def _take_wait(self) -> float:
        wait, self.wait_s = self.wait_s, 0.0
        return wait

