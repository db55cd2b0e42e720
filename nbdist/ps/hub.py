"""The hub: one parameter-server shard, serving workers and the kernel over ZeroMQ.

A hub owns one contiguous slice of the flat float32 parameter vector and applies the update
rule to each push. Shard 0 also coordinates the run: it hands out data chunks (global
epochs), counts versions and delays, queues validation jobs, keeps the statistics, and holds
the control state (learning rate, pause, stop) that rides back on every reply.

Ops it answers (all signed, see `nbdist.protocol`):
    hello    worker registers (optionally with its shared-memory segment); gets parameters
    step     worker pushes a gradient and/or pulls parameters; shard 0 also answers a bare
             `step` (no push, no pull) with control and work, to let idle workers wait cheaply
    report   sync-mode rank: one step's metrics (no parameters); gets control back
    bye      worker leaves
    stats    kernel: statistics (shard 0)
    control  kernel: set lr / pause / resume / stop
    params   kernel: this shard's parameters (and non-trainable state on shard 0)
    shutdown kernel: leave the serve loop
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import tempfile
import time
import traceback
from collections import Counter, deque
from dataclasses import dataclass

import numpy as np
import zmq

from nbdist.algorithms import make_rule
from nbdist.errors import ProtocolError
from nbdist.protocol import Codec, Message
from nbdist.ps import shm
from nbdist.ps.schedule import EpochSchedule
from nbdist.ps.stats import RunStats

log = logging.getLogger(__name__)


@dataclass
class HubSpec:
    """Everything one shard needs; sent to its engine by ipyparallel."""

    run_id: str
    key: bytes
    shard: int
    num_shards: int
    num_workers: int
    params: np.ndarray  # this shard's initial slice
    non_trainable: np.ndarray  # float non-trainable state (shard 0 only; empty elsewhere)
    algorithm: str
    lr: float
    batch_size: int
    epochs: int
    num_samples: int
    has_validation: bool
    bind_host: str = "127.0.0.1"
    idle_timeout: float = 120.0


class _WorkerLink:
    """One worker as seen by this shard: its read version and optional shared segment."""

    def __init__(self, segment=None, offset: int = 0, size: int = 0, total: int = 0):
        self.segment = segment
        self.read_version = 0
        self.grad = shm.floats(segment, offset, size) if segment else None
        self.params = shm.floats(segment, total + offset, size) if segment else None


class Hub:
    """One shard's server loop. Create on the engine, then call `serve()` (blocks)."""

    def __init__(self, spec: HubSpec):
        self.spec = spec
        self.coordinator = spec.shard == 0
        self.size = int(spec.params.size)
        nt_bytes = spec.non_trainable.nbytes
        self.codec = Codec(spec.key, f"hub-{spec.shard}",
                           max_buffer_bytes=2 * (4 * self.size + nt_bytes) + 4096)
        self._segment = shm.create(4 * self.size)  # live parameters, readable by hogwild workers
        self.params = shm.floats(self._segment, 0, self.size)
        self.params[:] = spec.params
        self.non_trainable = np.array(spec.non_trainable, dtype=np.float32, copy=True)
        self.rule = make_rule(spec.algorithm, self.size, spec.num_workers)
        self.lr = float(spec.lr)
        self.version = 0
        self.links: dict[int, _WorkerLink] = {}
        self.dropped: Counter[str] = Counter()
        self.error: str | None = None
        self.closing = False
        self.start_time = time.time()
        if self.coordinator:
            self._init_coordinator()
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.MAXMSGSIZE, self.codec.max_buffer_bytes + (1 << 20))
        port = self._sock.bind_to_random_port(f"tcp://{spec.bind_host}")
        self._ipc_path = os.path.join(tempfile.gettempdir(), f"nbdist-{spec.run_id}-{spec.shard}.ipc")
        self._sock.bind(f"ipc://{self._ipc_path}")
        self.endpoints = {"tcp": f"tcp://{spec.bind_host}:{port}", "ipc": f"ipc://{self._ipc_path}",
                          "host": shm.host_id(), "params_shm": self._segment.name, "size": self.size}

    def _init_coordinator(self) -> None:
        spec = self.spec
        self.schedule = EpochSchedule(spec.num_samples, spec.epochs)
        self.stats = RunStats(spec.num_workers, start_time=self.start_time)
        self.paused = False
        self.stopping = False
        self.chunk_of: dict[int, object] = {}  # worker -> outstanding Chunk
        self.eval_queue: deque[int] = deque()
        self.evaluating: dict[int, int] = {}  # worker -> epoch it is evaluating
        self.gone: set[int] = set()  # workers that said bye
        self.arrived: set[int] = set()  # workers that said hello: training starts with all
        self.reported_epochs = 0.0  # progress reported by sync-mode ranks

    # -- the loop ---------------------------------------------------------------------------

    def serve(self) -> dict:
        """Answer messages until `shutdown`, or until nobody has spoken for `idle_timeout`."""
        handlers = {"hello": self._hello, "step": self._step, "bye": self._bye, "report": self._report,
                    "stats": self._stats, "control": self._control, "params": self._params,
                    "shutdown": self._shutdown}
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        last_heard = time.monotonic()
        try:
            while not self.closing:
                if not poller.poll(500):
                    if time.monotonic() - last_heard > self.spec.idle_timeout:
                        log.warning("hub %d: nobody spoke for %.0fs; leaving", self.spec.shard,
                                    self.spec.idle_timeout)
                        self.error = self.error or "hub idle timeout: the kernel and workers went silent"
                        break
                    continue
                frames = self._sock.recv_multipart(copy=False)
                try:
                    msg = self.codec.decode(frames[1:])
                    handler = handlers[msg.op]
                except (ProtocolError, KeyError) as exc:
                    self.dropped[type(exc).__name__ if isinstance(exc, KeyError) else str(exc).split(":")[0]] += 1
                    continue
                last_heard = time.monotonic()
                try:
                    header, buffers = handler(msg)
                except Exception as exc:  # a bug or bad request: tell the sender, keep serving
                    self.error = f"hub {self.spec.shard} failed on {msg.op!r}: {exc}\n{traceback.format_exc()}"
                    log.error("%s", self.error)
                    header, buffers = {"op": "error", "message": str(exc)}, []
                self._sock.send_multipart([frames[0], *self.codec.encode(header, buffers)], copy=False)
        finally:
            self.close()
        return {"shard": self.spec.shard, "version": self.version, "error": self.error,
                "dropped": dict(self.dropped)}

    def close(self) -> None:
        self._sock.close(0)
        self._ctx.term()
        for link in self.links.values():
            shm.release(link.segment)
        self.links.clear()
        self.params = None
        shm.release(self._segment, unlink=True)
        with contextlib.suppress(OSError):
            os.unlink(self._ipc_path)

    # -- worker ops -------------------------------------------------------------------------

    def _hello(self, msg: Message) -> tuple[dict, list]:
        worker = int(msg.header["worker"])
        old = self.links.pop(worker, None)
        if old:
            shm.release(old.segment)
        name = msg.header.get("shm")
        if name:
            segment = shm.attach(name)
            self.links[worker] = _WorkerLink(segment, msg.header["offset"], self.size, msg.header["total"])
        else:
            self.links[worker] = _WorkerLink()
        if self.coordinator:
            w = self.stats.workers[worker]
            w.state, w.host, w.engine = "running", msg.header.get("host", ""), msg.header.get("engine")
            self.gone.discard(worker)
            self.arrived.add(worker)
        return self._reply(worker, pull=True)

    def _step(self, msg: Message) -> tuple[dict, list]:
        worker, h = int(msg.header["worker"]), msg.header
        link = self.links[worker]
        if h.get("push"):
            delay = self.version - link.read_version
            grad = link.grad if link.grad is not None else msg.floats(0)
            if grad.size != self.size:
                raise ValueError(f"push of {grad.size} floats to a shard of {self.size}")
            if self.rule.on_push(worker, self.params, grad, self.lr, delay):
                self.version += 1
            if self.coordinator:
                if self.non_trainable.size:
                    self.non_trainable += msg.floats(len(msg.buffers) - 1)
                self._count_push(worker, h, delay)
        if self.coordinator and "eval" in h:
            ev = h["eval"]
            self.evaluating.pop(worker, None)
            self.stats.record_eval(ev["metrics"], epoch=ev["epoch"], version=ev["version"],
                                   now=time.time() - self.start_time)
        return self._reply(worker, pull=bool(h.get("pull")))

    def _count_push(self, worker: int, h: dict, delay: int) -> None:
        chunk = self.chunk_of.pop(worker, None)
        if chunk is None or chunk.id != h.get("chunk"):
            raise ValueError(f"worker {worker} pushed chunk {h.get('chunk')} but holds {chunk}")
        finished_epoch = self.schedule.complete(chunk.id)
        loss = float(h.get("loss", math.nan))
        self.stats.record_push(worker, samples=chunk.size, loss=loss, compute_s=h.get("compute_s", 0.0),
                               comm_s=h.get("comm_s", 0.0), delay=delay,
                               epoch=self.schedule.epochs_done, now=time.time() - self.start_time,
                               batch_size=self.spec.batch_size)
        if finished_epoch is not None:
            self.stats.record_event("epoch_end", time.time() - self.start_time, epoch=finished_epoch)
            if self.spec.has_validation:
                self.eval_queue.append(finished_epoch)

    def _reply(self, worker: int, pull: bool) -> tuple[dict, list]:
        header: dict = {"op": "reply", "version": self.version}
        buffers: list = []
        if pull:
            link = self.links[worker]
            link.read_version = self.version
            self.rule.on_pull(worker, self.params, self.version)
            if link.params is not None:  # same host: parameters go through shared memory
                if self.rule.consistent_reads:
                    np.copyto(link.params, self.params)
                    header["params"] = "shm"
                else:
                    header["params"] = "live"  # the worker reads our segment, no lock
            else:
                buffers.append(self.params.copy() if self.rule.consistent_reads else self.params)
            if self.coordinator and self.non_trainable.size:
                buffers.append(self.non_trainable.copy())
        if self.coordinator:
            header.update(self._work_for(worker, pull))
        return header, buffers

    def _work_for(self, worker: int, pulled: bool) -> dict:
        """Control state plus the worker's chunk, eval job and whether it is done."""
        work: dict = {"lr": self.lr, "paused": self.paused, "stop": self.stopping}
        chunk = self.chunk_of.get(worker)
        all_here = len(self.arrived) == self.spec.num_workers
        if chunk is None and all_here and not (self.paused or self.stopping):
            chunk = self.schedule.next_chunk(self.spec.batch_size)
            if chunk is not None:
                self.chunk_of[worker] = chunk
        # a paused worker keeps its chunk but must not train on it until resumed
        work["chunk"] = chunk.to_list() if chunk and not self.paused else None
        if self.eval_queue and worker not in self.evaluating and not self.stopping:
            if pulled:
                epoch = self.eval_queue.popleft()
                self.evaluating[worker] = epoch
                work["eval"] = {"epoch": epoch, "version": self.version}
            else:
                work["eval_pending"] = True  # pull first, then evaluate those weights
        work["done"] = self.stopping or (
            self.schedule.finished and not self.eval_queue and not self.evaluating)
        state = "paused" if self.paused else ("running" if chunk else "waiting")
        if not all_here:
            state = "starting"
        self.stats.workers[worker].state = state
        return work

    def _report(self, msg: Message) -> tuple[dict, list]:
        """A synchronous rank's step: metrics in, control out (Horovod moves the gradients)."""
        h, worker = msg.header, int(msg.header["worker"])
        now = time.time() - self.start_time
        if h.get("batch"):
            self.reported_epochs = max(self.reported_epochs, float(h.get("epoch", 0.0)))
            self.stats.record_push(worker, samples=int(h.get("samples", 0)), loss=float(h.get("loss", math.nan)),
                                   compute_s=float(h.get("compute_s", 0.0)), comm_s=float(h.get("comm_s", 0.0)),
                                   delay=0, epoch=self.reported_epochs, now=now, batch_size=int(h["batch"]))
        if "eval" in h:
            ev = h["eval"]
            self.stats.record_eval(ev["metrics"], epoch=ev["epoch"], version=ev["version"], now=now)
        self.stats.workers[worker].state = "paused" if self.paused else "running"
        return {"op": "reply", "lr": self.lr, "paused": self.paused, "stop": self.stopping}, []

    def _bye(self, msg: Message) -> tuple[dict, list]:
        worker = int(msg.header["worker"])
        link = self.links.pop(worker, None)
        if link:
            shm.release(link.segment)
        self.rule.forget(worker)
        if self.coordinator:
            self.gone.add(worker)
            self.stats.workers[worker].state = "done"
            chunk = self.chunk_of.pop(worker, None)
            if chunk is not None:  # stopped mid-chunk: another worker may take it
                self.schedule.requeue(chunk.id)
            self.evaluating.pop(worker, None)
        return {"op": "bye"}, []

    # -- kernel ops -------------------------------------------------------------------------

    def _stats(self, msg: Message) -> tuple[dict, list]:
        snap = self.stats.snapshot(since=int(msg.header.get("since", 0)))
        snap.update(
            finished=len(self.gone) == self.spec.num_workers,
            paused=self.paused, stopping=self.stopping, lr=self.lr, version=self.version,
            epochs_done=max(self.schedule.epochs_done, self.reported_epochs), error=self.error, dropped=dict(self.dropped),
            hub_bytes=int(self.params.nbytes + self.rule.state_nbytes),
            elapsed=time.time() - self.start_time,
        )
        return {"op": "stats"}, [json.dumps(snap).encode()]

    def _control(self, msg: Message) -> tuple[dict, list]:
        h = msg.header
        now = time.time() - self.start_time
        if "lr" in h:
            lr = float(h["lr"])
            if not (math.isfinite(lr) and lr > 0):
                raise ValueError(f"learning rate must be positive and finite, got {lr}")
            self.lr = lr
            if self.coordinator:
                self.stats.record_event("set_lr", now, lr=lr)
        if self.coordinator:
            for flag, event_on, event_off in (("paused", "pause", "resume"),):
                if flag in h and bool(h[flag]) != self.paused:
                    self.paused = bool(h[flag])
                    self.stats.record_event(event_on if self.paused else event_off, now)
            if h.get("stop") and not self.stopping:
                self.stopping = True
                self.stats.record_event("stop", now)
        return {"op": "ok"}, []

    def _params(self, msg: Message) -> tuple[dict, list]:
        return {"op": "params", "version": self.version}, [self.params.copy(), self.non_trainable.copy()]

    def _shutdown(self, msg: Message) -> tuple[dict, list]:
        self.closing = True
        return {"op": "ok"}, []
