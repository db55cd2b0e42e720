"""One rank of a `--mode sync` run: the engine side (`run_sync_worker`).

Its collective (`nbdist.modes.sync.collective`: Horovod inside TensorFlow, or a Gloo group of
torch.distributed on any Keras backend) starts from the kernel's signed rendezvous, broadcasts
rank 0's weights (one flat buffer), then per step this rank's gradient is computed as one flat
buffer, allreduced (weighted by this rank's share of the global batch, so the result is the
exact mean over the global batch even when `--dbs` gives ranks different batches) and applied
with the cell's own optimizer. Rank 0's control (stop, pause, lr, batch sizes) rides in the
same allreduce, so every rank acts on it at the same step. The collective is always closed at
the end (`hvd.shutdown()`), so a failing rank ends it for all, and the next run starts a new
one. A rank whose collective fails (another rank's engine died) returns its state instead of
raising: the weights and optimizer slots of the last step every rank applied, and its data
position, from which the kernel starts the ranks left (nbdist.modes.sync.restart). With
`--sync-batchnorm` (Horovod), BatchNorm statistics are allreduced inside the forward
pass (nbdist.modes.sync.batchnorm); a learning-rate schedule runs on each rank's optimizer
(nbdist.engine.learning_rate). The kernel side is `nbdist.modes.sync.backend`.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from dataclasses import dataclass

import numpy as np

from nbdist.checkpoint.sync_state import (
    check_slots,
    optimizer_slots,
    read_slots,
    snapshot,
    write_slots,
)
from nbdist.core.compression import parse
from nbdist.core.gathered import GatheredFrames
from nbdist.core.low_rank import LowRankReducer
from nbdist.engine.blas_threads import for_compression
from nbdist.engine.evaluate import check_finite, evaluate
from nbdist.engine.flat_layout import write_flat
from nbdist.engine.flatmodel import FlatModel
from nbdist.engine.learning_rate import schedule_name, set_constant_lr
from nbdist.engine.run_cell import run_cell
from nbdist.errors import NbdistError
from nbdist.hub.client import WorkerTransport
from nbdist.modes.common.worker import WorkerSpec, pin_worker, step_metrics
from nbdist.modes.sync.batchnorm import batchnorm_layers
from nbdist.modes.sync.collective import HorovodCollective, TorchCollective
from nbdist.modes.sync.network import rank_network
from nbdist.modes.sync.rendezvous import RendezvousRelay, SignedClient
from nbdist.wire.messages import EvalResult, Report, ReportReply

CONTROL_FIELDS = 3  # stop, paused, lr; then one batch size per rank


@dataclass
class SyncSpec(WorkerSpec):
    """A worker spec plus what a synchronous rank needs."""

    epochs: int = 1
    lr: float = 0.01
    initial_params: np.ndarray | None = None
    initial_non_trainable: np.ndarray | None = None
    env: dict | None = None  # HOROVOD_* variables for this rank
    checkpoint: bool = False  # rank 0 sends its state when training ends (the final checkpoint)
    # from a checkpoint: epoch, offset, steps, iterations, slots (shapes)
    resume: dict | None = None
    initial_slots: np.ndarray | None = None  # the Keras optimizer's slots, from a checkpoint
    # BatchNorm statistics over the global batch (nbdist.modes.sync.batchnorm)
    sync_batchnorm: bool = False
    collective: str = "horovod"  # what averages the gradients (nbdist.modes.sync.collective)
    # the hub's worker id of each rank, in rank order (a restart on the ranks left keeps each
    # worker's id); None: worker i is rank i
    rank_workers: list[int] | None = None


class PeerLostError(Exception):
    """A collective failed on this rank: another rank stopped answering (its engine died, or it
    raised). The last step this rank applied is whole: an update is applied only once its
    allreduce has returned."""


def run_sync_worker(spec: SyncSpec, namespace: dict | None = None) -> dict:
    """One rank: train in lockstep with the others; returns the final weights."""
    env = rank_network(spec.env or {})
    os.environ.update(env)
    spec = pin_worker(spec)  # --pin auto: each rank on its own cores of the host
    with for_compression(spec.compression):  # powersgd's products on one BLAS thread
        return _run_rank(spec, env, namespace)


def _run_rank(spec: SyncSpec, env: dict, namespace: dict | None) -> dict:
    model, data, validation = run_cell(spec, namespace)
    if spec.collective == "torch":
        client = SignedClient(spec.key, spec.run_id, str(spec.worker), env)
        collective = TorchCollective(client, env, float(env["HOROVOD_GLOO_TIMEOUT_SECONDS"]))
        try:
            return _SyncLoop(spec, collective, model, data, validation).run()
        finally:
            collective.close()
    import horovod.tensorflow as hvd  # Horovod: only where a Horovod rank runs

    with RendezvousRelay(spec.key, spec.run_id, str(spec.worker), env) as relay:
        os.environ.update(relay.horovod_env())  # Horovod's client signs nothing: the relay does
        hvd.init()
        collective = HorovodCollective(hvd)
        try:
            return _SyncLoop(spec, collective, model, data, validation).run()
        finally:
            collective.close()


def exchange_coder(codec, size: int, seed: int, rank: int):
    """A codec's own exchange for this rank, kept for the whole run (its error feedback and,
    for powersgd, its Qs, which outlive a recompile for a new rate): None for none and fp16
    (the allreduce sums them), `LowRankReducer` for powersgd (its Qs from the run's seed, the
    same on every rank), `GatheredFrames` for the others (a random codec's stream per rank)."""
    if codec.name in ("none", "fp16"):
        return None
    if codec.name == "powersgd":
        return LowRankReducer(codec.matrices, int(codec.amount), size, seed)
    return GatheredFrames(codec, size, np.random.default_rng([seed, rank, 3]))


class _SyncLoop:
    """The per-rank training loop; see the module docstring."""

    def __init__(self, spec: SyncSpec, collective, model, data, validation):
        self.spec, self.collective, self.model, self.data, self.validation = (
            spec, collective, model, data, validation)
        self.rank, self.size = collective.rank, collective.size
        self.worker = spec.worker  # the hub's id for this rank
        write_flat(model, spec.initial_params, spec.initial_non_trainable)
        optimizer = model.optimizer
        trainable = model.trainable_variables
        optimizer.build(trainable)
        self.flat = FlatModel(model)
        resume = spec.resume or {}
        if spec.initial_slots is not None:  # every rank checks; rank 0's values are broadcast
            check_slots(optimizer, resume["slots"], spec.engine)
            optimizer.iterations.assign(int(resume["iterations"]))
        # the weights travel as one buffer (Horovod matches collectives by name, and Keras names
        # variables with per-process counters: `dense_2/kernel` on an engine that ran the cell)
        params, non_trainable = self.flat.read()
        slots = read_slots(optimizer) if spec.initial_slots is None else spec.initial_slots
        start = collective.broadcast(np.concatenate([params, non_trainable, slots]))
        n = params.size + non_trainable.size
        self.flat.assign(start[: params.size], start[params.size: n])
        write_slots(optimizer, start[n:])
        self.start = (int(resume.get("epoch", 0)), int(resume.get("offset", 0)),
                      int(resume.get("steps", 0)))
        # (epoch, samples of it done); last request served
        self.position, self.sent = self.start[:2], 0
        self.batchnorm = None
        if spec.sync_batchnorm and self.size > 1 and batchnorm_layers(model):
            self.batchnorm = collective.sync_batchnorm(model)
        self.codec = parse(spec.compression).bind(spec.layout["trainable"], 0, self.flat.size)
        self.coder = exchange_coder(self.codec, self.flat.size, spec.seed, self.rank)
        self._allreduce_apply = self._compile_allreduce_apply()
        self.transport = WorkerTransport(spec.key, self.worker, spec.shards, 0, "tcp", spec.timeout,
                                         spec.engine)
        self._report_pending = False  # a report sent, its reply not yet taken
        self.control = np.zeros(CONTROL_FIELDS + self.size, dtype=np.float32)
        self.control[2] = spec.lr
        self.control[CONTROL_FIELDS:] = spec.batch_size
        self.lr = float(self.control[2])  # as float32, as it comes back from the allreduce
        if schedule_name(optimizer) is None:  # a schedule runs on the optimizer's own iterations
            # --lr (or run.set_lr) wins over the cell's rate
            optimizer.learning_rate.assign(spec.lr)
        elif resume.get("constant_lr"):  # run.set_lr had replaced the schedule before a restart
            set_constant_lr(optimizer, spec.lr)

    def _compile_allreduce_apply(self):
        """The step that allreduces the weighted gradient (with the control) and applies it."""
        return self.collective.compile_apply(self.model, self.flat.size, self.codec, self.coder)

    def run(self) -> dict:
        """Train to the end and return the final weights, or, when a collective fails, this
        rank's state (`_stranded`) for the kernel to start the ranks left from."""
        steps = [0]  # steps applied by this task, kept through a failed collective
        try:
            return self._train(steps)
        except PeerLostError as lost:
            return self._stranded(lost, steps[0])

    def _collective(self, call, *args, **kwargs):
        """`call` on the collective, its failure raised as PeerLostError."""
        try:
            return call(*args, **kwargs)
        except Exception as exc:  # Horovod raises TensorFlow's errors, Gloo a RuntimeError
            raise PeerLostError(f"{type(exc).__name__}: {str(exc).strip()[:400]}") from exc

    def _train(self, counted: list[int]) -> dict:
        spec = self.spec
        self.transport.hello()
        global_batch = spec.batch_size * self.size
        # fewer than a pass: fit(steps_per_epoch=...)
        epoch_size = spec.epoch_size or spec.num_samples
        reply: ReportReply | None = None  # shard 0's control, once a report was answered
        steps = 0
        if (spec.resume or {}).get("restarted"):  # a pause or stop holds from the first step on
            reply = self._report(Report(self.worker))
            self._exchange_control(reply)
            self._follow_lr()
        for epoch in range(self.start[0], spec.epochs):
            offset = self.start[1] if epoch == self.start[0] else 0  # resumed mid-epoch
            steps_per_epoch = -(-(epoch_size - offset) // global_batch)
            step = 0
            while step < steps_per_epoch:
                if self.control[0]:
                    break
                if self.control[1]:  # paused: keep the ranks in lockstep on control only
                    time.sleep(0.05)
                    reply = self._send_state(self._report(Report(self.worker)), steps)
                    self._exchange_control(reply)
                    continue
                batches = self.control[CONTROL_FIELDS:].astype(np.int64)
                lo = offset + step * global_batch + int(batches[: self.rank].sum())
                start, stop = min(lo, epoch_size), min(lo + int(batches[self.rank]), epoch_size)
                step_total = min(global_batch, epoch_size - offset - step * global_batch)
                batch = self.data.batch(epoch, start, stop) if stop > start else self.data.head(1)
                weight = (stop - start) / step_total
                t0 = time.perf_counter()
                if self.batchnorm is not None:
                    self.batchnorm.set_share(weight)
                if self.batchnorm is None:
                    loss, grad, grad_norm = self.collective.gradients(self.flat, batch)
                else:  # BatchNorm's statistics are allreduced in the forward pass
                    loss, grad, grad_norm = self._collective(self.collective.gradients,
                                                             self.flat, batch)
                t1 = time.perf_counter()
                # the last step's report: its round trip hid behind compute
                reply = self._take_report(reply)
                factor = reply.slowdown if reply is not None else 1.0
                if factor > 1.0:  # a simulated slower node: the others wait for it in the allreduce
                    time.sleep((factor - 1.0) * (t1 - t0))
                    t1 = time.perf_counter()
                check_finite(loss, grad_norm, step=steps,
                             where=f"rank {self.rank} (engine {spec.engine})", epoch=epoch)
                outgoing = self._control_out(reply)
                self.control[:] = self._collective(
                    self._allreduce_apply, grad, np.asarray(weight, np.float32), outgoing)
                self._follow_lr()
                t2 = time.perf_counter()
                self.position = (epoch, min(epoch_size, offset + (step + 1) * global_batch))
                step += 1
                steps += 1
                counted[0] = steps
                reply = self._send_state(reply, steps)
                self._send_report(Report(self.worker, samples=stop - start, loss=loss,
                                         compute_s=t1 - t0, comm_s=t2 - t1,
                                         batch=int(batches[self.rank]),
                                         epoch=epoch + self.position[1] / epoch_size,
                                         metrics=step_metrics(
                                             {str(epoch): self.flat.last_metrics.tolist()}
                                             if stop > start else {})))
            if self.control[0]:
                break
            # the epoch's metrics are all in once every rank says so; with a fit call, wait there
            # for the kernel's callbacks (the epoch gate)
            reply = self._report(Report(self.worker, epoch_end=epoch))
            if epoch + 1 < spec.epochs and not self._epoch_gate(reply, epoch, steps):
                self.control[0] = 1.0  # stopped at the gate (every rank sees the same)
                break
            self._evaluate(epoch)
        return self._finish(steps)

    def _epoch_gate(self, reply: ReportReply, epoch: int, steps: int) -> bool:
        """Wait until the kernel opens the next epoch (a cell's fit call ran its callbacks);
        False if it stopped the run instead. Every rank asks the hub itself, so none waits in
        a collective (Gloo's timeout) while the kernel validates. Rank 0 sends its weights
        meanwhile if the kernel asks (`_send_state`)."""
        while reply.open_epoch is not None and reply.open_epoch <= epoch:
            if reply.stop:
                return False
            self._check_peers(reply)
            time.sleep(0.05)
            reply = self._send_state(self._report(Report(self.worker)), steps)
        return True

    def _check_peers(self, reply: ReportReply) -> None:
        """Raise PeerLostError when the hub says a rank of this collective is out of the run
        (its engine died while this rank waits on the hub, not in a collective)."""
        gone = set(reply.lost) & set(self.spec.rank_workers or range(self.size))
        if gone:
            raise PeerLostError(f"the hub says worker(s) {sorted(gone)} left the run")

    def _send_state(self, reply: ReportReply | None, steps: int,
                    final: bool = False) -> ReportReply | None:
        """Rank 0, between two steps: send its state to the hub if the kernel asked for it."""
        wanted = reply.send_state if reply is not None else 0
        if self.rank != 0 or not (final or wanted > self.sent):
            return reply
        self._take_report(None)
        self.sent = max(self.sent, wanted)
        report, buffers = snapshot(self, self.worker, self.sent, *self.position,
                                   self.start[2] + steps, final)
        return self.transport.lines[0].request(report, buffers)[0]

    def _follow_lr(self) -> None:
        """Every rank switches rate at the same step: the new rate came in the allreduce."""
        if float(self.control[2]) != self.lr:
            self.lr = float(self.control[2])
            if set_constant_lr(self.model.optimizer, self.lr) is not None:  # the schedule is gone
                self._allreduce_apply = self._compile_allreduce_apply()

    def _control_out(self, reply: ReportReply | None) -> np.ndarray:
        """Rank 0 contributes the hub's control; the others zeros (the allreduce sums them)."""
        out = np.zeros_like(self.control)
        if self.rank == 0:
            out[:] = self.control
            if reply is not None:
                out[0], out[1] = float(reply.stop), float(reply.paused)
                if reply.lr is not None:  # None: the ranks keep their optimizer's schedule
                    out[2] = reply.lr
                if reply.batches:  # by worker id (0 for one out of the run): in rank order
                    workers = self.spec.rank_workers or range(self.size)
                    out[CONTROL_FIELDS:] = [reply.batches[w] for w in workers]
        return out

    def _exchange_control(self, reply: ReportReply | None) -> None:
        self.control[:] = self._collective(self.collective.allreduce_sum,
                                           self._control_out(reply))

    def _report(self, report: Report) -> ReportReply:
        self._take_report(None)
        return self.transport.lines[0].request(report)[0]

    def _send_report(self, report: Report) -> None:
        """A step's metrics, sent without waiting: the reply is taken after the next step's
        gradient (`_take_report`), so the round trip to the hub overlaps that compute and the
        ranks meet in the allreduce without one of them waiting on the hub."""
        self.transport.lines[0].send(report)
        self._report_pending = True

    def _take_report(self, reply: ReportReply | None) -> ReportReply | None:
        """The reply to the report in flight, if any (else `reply`)."""
        if not self._report_pending:
            return reply
        self._report_pending = False
        return self.transport.lines[0].recv(ReportReply)[0]

    def _evaluate(self, epoch: int) -> None:
        if self.rank != 0 or self.validation is None:
            return
        metrics = evaluate(self.model, self.validation, self.spec.batch_size)
        self._report(Report(self.worker, eval=EvalResult(epoch, metrics, version=0)))

    def _finish(self, steps: int) -> dict:
        """Average non-trainable state (BatchNorm statistics) so every rank ends identical."""
        params, non_trainable = self.flat.read()
        own = non_trainable  # with --sync-batchnorm already the same on every rank
        if non_trainable.size:
            non_trainable = self._collective(
                self.collective.allreduce_sum, non_trainable,
                name="nbdist_final_state") / np.float32(self.size)
            self.flat.assign(params, non_trainable)
        if self.spec.checkpoint:  # the final checkpoint's weights
            self._send_state(None, steps, final=True)
        self._take_report(None)
        self.transport.bye()
        self.transport.close()
        optimizer = self.model.optimizer
        return {"rank": self.rank, "worker": self.worker, "steps": steps, "params": params,
                "non_trainable": non_trainable,
                "own_non_trainable": own, "host": socket.gethostname(),
                "iterations": int(optimizer.iterations.numpy()),
                "slots": read_slots(optimizer),  # for a model saved after the last epoch
                "learning_rate": float(optimizer.learning_rate.numpy())}

    def _stranded(self, lost: PeerLostError, steps: int) -> dict:
        """What this rank holds when its collective failed: the weights, optimizer slots and
        data position of the last step it applied. It leaves without a bye (the kernel tells
        the hub who is out), so the hub waits for the ranks the kernel starts again."""
        with contextlib.suppress(NbdistError):  # the hub's answer is not needed any more
            self._take_report(None)
        self.transport.close()
        params, non_trainable = self.flat.read()
        optimizer = self.model.optimizer
        return {"rank": self.rank, "worker": self.worker, "peer_lost": str(lost),
                "position": list(self.position), "steps": self.start[2] + steps,
                "params": params, "non_trainable": non_trainable, "slots": read_slots(optimizer),
                "slot_shapes": [[int(n) for n in v.shape] for v in optimizer_slots(optimizer)],
                "iterations": int(optimizer.iterations.numpy()), "lr": self.lr,
                "constant_lr": schedule_name(optimizer) is None}
