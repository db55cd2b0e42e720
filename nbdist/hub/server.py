"""The hub: one parameter-server shard, serving workers and the kernel over ZeroMQ.

A hub owns one contiguous slice of the flat float32 parameter vector and applies the update
rule to each push (or, for group sync, to the mean of a group's pushes). Shard 0 also holds
the run's `Coordinator` (chunks, statistics, control, DBS, SSP, groups), whose answers ride
back on every reply. A reply may be held (SSP: a worker too far ahead; group sync: a group
still incomplete) and is sent as soon as the worker may go on.

Ops it answers (all signed, see `nbdist.hub.protocol`):
    hello    worker registers (optionally with its shared-memory segment); gets parameters
    step     worker pushes a gradient (or a local-steps delta) and/or pulls parameters; shard 0
             also answers a bare `step` (no push, no pull), so idle workers can wait cheaply
    report   sync-mode rank: one step's metrics (no parameters); gets control back
    bye      worker leaves
    stats    kernel: statistics (shard 0)
    control  kernel: lr, pause, stop, slow-down, batch policy, rule options, regroup, add_worker
    params   kernel: this shard's parameters (and non-trainable state on shard 0)
    state    kernel: everything a checkpoint saves of this shard (see `nbdist.checkpoint.store`)
    peers    kernel: the other shards' endpoints (shard 0 tells them of write-offs)
    shutdown kernel: leave the serve loop
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import zmq

from nbdist.checkpoint.shard_state import restore_shard, shard_state
from nbdist.core import compression
from nbdist.core.barrier import GroupBarrier, GroupStep
from nbdist.core.coordinator import Coordinator, Plan
from nbdist.core.updater import make_updater
from nbdist.errors import ProtocolError
from nbdist.hub import shm, writeoff
from nbdist.hub.protocol import MAX_HEADER_BYTES, SIGNATURE_BYTES, Codec, Message, send_frames
from nbdist.hub.threads import split_updates
from nbdist.hub.wire import Return, admit, bind, receive, server_socket

log = logging.getLogger(__name__)
GROUP_WAIT_LIMIT_S = 5.0  # longest a group step waits for a missing member
LOST_CHECK_S = 0.5  # how often shard 0 looks for workers silent past their deadline


@dataclass
class HubSpec:
    """Everything one shard needs; sent to its engine by ipyparallel."""

    run_id: str
    key: bytes
    shard: int
    num_shards: int
    plan: Plan
    params: np.ndarray  # this shard's initial slice
    non_trainable: np.ndarray  # float non-trainable state (shard 0 only; empty elsewhere)
    rule_options: dict = field(default_factory=dict)
    local_steps: int = 1
    optimizer: dict | None = None  # what applies the rule's gradient (nbdist.core.updater); None: easgd
    offset: int = 0  # where this shard's slice starts in the flat vector (for per-variable clipping)
    bind_host: str = "127.0.0.1"
    idle_timeout: float = 120.0
    restore: dict | None = None  # a checkpoint's state for this shard (nbdist.resume)
    extra_bytes: int = 0  # sync mode: room for rank 0's state (weights, optimizer slots)
    encrypt: bool = False  # CurveZMQ on this shard's socket (--encrypt)


class Hub:
    """One shard's server loop. Create on the engine, then call `serve()` (blocks)."""

    def __init__(self, spec: HubSpec):
        self.spec = spec
        plan = spec.plan
        self.size = int(spec.params.size)
        self.codec = Codec(spec.key, f"hub-{spec.shard}", spec.run_id,
                           max_buffer_bytes=2 * (4 * self.size + spec.non_trainable.nbytes) + 4096 + spec.extra_bytes)
        self.peers = None  # shard 0: lines to the other shards, for write-offs (nbdist.hub.writeoff)
        self._segment = shm.create(4 * self.size)  # live parameters, readable by hogwild workers
        self.params = shm.floats(self._segment, 0, self.size)
        self.params[:] = spec.params
        self.non_trainable = np.array(spec.non_trainable, dtype=np.float32, copy=True)
        self.updater = make_updater(plan, spec.rule_options, spec.optimizer, self.size, spec.offset)
        self._update_pool = split_updates(self.updater)  # large updates on a few threads
        self.barrier = GroupBarrier(self.size) if plan.algorithm == "group" else None
        self.version = 0
        self.num_workers = plan.num_workers  # worker ids accepted: grows as workers join mid-run
        self.links: dict[int, shm.WorkerLink] = {}
        self.held: dict[int, tuple[object, bool]] = {}  # worker -> (routing id, pull) of a held reply
        self.dropped: Counter[str] = Counter()
        self.error: str | None = None
        self.closing = False
        self.start_time = time.time()
        self.sync_snapshot = None  # sync mode: rank 0's latest state (nbdist.checkpoint.sync_state)
        self.coordinator = Coordinator(plan, self.start_time) if spec.shard == 0 else None
        if spec.restore is not None:
            restore_shard(self, spec.restore)
        self._ctx = zmq.Context()
        self._max_bytes = self.codec.max_buffer_bytes + MAX_HEADER_BYTES + SIGNATURE_BYTES + 256
        self._sock, self._auth = server_socket(self._ctx, spec.key, self._max_bytes + (1 << 20), spec.encrypt)
        self.endpoints = bind(self._sock, spec, params_shm=self._segment.name, size=self.size)

    def now(self) -> float:
        return time.time() - self.start_time

    # -- the loop ---------------------------------------------------------------------------

    def serve(self) -> dict:
        """Answer messages until `shutdown`, or until nobody has spoken for `idle_timeout`."""
        handlers = {"hello": self._hello, "step": self._step, "report": self._report, "bye": self._bye,
                    "stats": self._stats, "control": self._control, "params": self._params,
                    "state": lambda msg, ret: shard_state(self), "peers": self._peers,
                    "shutdown": self._shutdown}
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        last_heard = last_check = time.monotonic()
        try:
            while not self.closing:
                if self.barrier is not None and self.barrier.pending:
                    self._expire_group_steps()
                if self.coordinator and time.monotonic() - last_check > LOST_CHECK_S:
                    last_check = time.monotonic()
                    self._find_lost()
                if not poller.poll(100 if self.barrier is not None else 500):
                    if time.monotonic() - last_heard > self.spec.idle_timeout:
                        log.warning("hub %d: nobody spoke for %.0fs; leaving", self.spec.shard,
                                    self.spec.idle_timeout)
                        self.error = self.error or "hub idle timeout: the kernel and workers went silent"
                        break
                    continue
                try:  # limits, MAC, run, recipient, seq, op, field types, segment
                    msg, ret = receive(self._sock, self.codec, handlers, self._max_bytes,
                                       self.num_workers, self.links)
                except ProtocolError as exc:
                    self.dropped[str(exc).split(":")[0]] += 1
                    continue
                last_heard = time.monotonic()
                handler = handlers[msg.op]
                try:
                    answer = handler(msg, ret)
                except Exception as exc:  # a bug or bad request: tell the sender, keep serving
                    self.error = f"hub {self.spec.shard} failed on {msg.op!r}: {exc}\n{traceback.format_exc()}"
                    log.error("%s", self.error)
                    answer = {"op": "error", "message": str(exc)}, []
                if answer is not None:
                    self._send(ret, *answer)
                self._release_held()
        finally:
            self.close()
        return {"shard": self.spec.shard, "version": self.version, "error": self.error,
                "dropped": dict(self.dropped)}

    def _send(self, ret: Return, header: dict, buffers: list) -> None:
        send_frames(self._sock, [ret.ident, *self.codec.encode(header, buffers, to=ret.to, re=ret.re)])

    def _release_held(self) -> None:
        """Send every held reply whose worker may now go on."""
        for worker, (ident, pull) in list(self.held.items()):
            if self.barrier is not None and self.barrier.waiting(worker):
                continue
            answer = self._reply(worker, pull)
            if answer is not None:
                del self.held[worker]
                self._send(ident, *answer)
                if self.coordinator:
                    self.coordinator.heard(worker, self.now())  # its silence counts from now

    def close(self) -> None:
        writeoff.close(self)
        if self._update_pool is not None:
            self._update_pool.close()
        self._sock.close(0)
        if self._auth is not None:
            self._auth.stop()
        self._ctx.term()
        for link in self.links.values():
            shm.release(link.segment)
        self.links.clear()
        self.params = None
        shm.release(self._segment, unlink=True)
        try:
            os.unlink(self.endpoints["ipc"][len("ipc://"):])
        except OSError:
            pass

    # -- worker ops -------------------------------------------------------------------------

    def _hello(self, msg: Message, ident) -> tuple[dict, list] | None:
        worker = int(msg.header["worker"])
        old = self.links.pop(worker, None)
        if old:
            shm.release(old.segment)
        name = msg.header.get("shm")
        self.links[worker] = (shm.WorkerLink(shm.attach(name), msg.header["offset"], self.size, msg.header["total"])
                              if name else shm.WorkerLink())
        self.links[worker].compression = msg.header.get("compression", "none")
        if self.coordinator:
            self.coordinator.hello(worker, msg.header.get("host", ""), msg.header.get("engine"), msg.header)
            self.coordinator.heard(worker, self.now())
        return self._reply_or_hold(worker, ident, pull=True)

    def _step(self, msg: Message, ident) -> tuple[dict, list] | None:
        worker, h = int(msg.header["worker"]), msg.header
        if worker not in self.links or (self.coordinator and worker in self.coordinator.lost):
            # written off as lost, yet alive: its chunks went to others, so it must leave
            self.dropped["written-off worker"] += 1
            return {"op": "reply", "version": self.version, "lost": True, "stop": True, "done": True}, []
        if self.coordinator:
            self.coordinator.heard(worker, self.now())
        link, pull = self.links[worker], bool(h.get("pull"))
        copied = False  # whether the pull buffer already holds the new weights
        if h.get("push"):
            grad = link.grad if link.grad is not None else compression.decode(msg.buffers[0], link.compression)
            if grad.size != self.size:
                raise ValueError(f"push of {grad.size} floats to a shard of {self.size}")
            if self.coordinator and self.non_trainable.size:
                self.non_trainable += msg.floats(len(msg.buffers) - 1)
            members = tuple(h.get("group") or (worker,))
            if self.barrier is not None:  # a singleton completes at once and flushes old groups
                for step in self.barrier.add(members, worker, grad, int(h.get("batch", 1)),
                                             link.read_version, h):
                    self._apply_group(step)
            else:
                delay = self.version - link.read_version
                copied = self._apply(worker, grad, delay, into=self._reply_buffer(link) if pull else None,
                                     norm=h.get("norm"))
                if self.coordinator:
                    self.coordinator.push(worker, h, delay, self.now())
        if self.coordinator:
            self.coordinator.eval_result(worker, h, self.now())
        return self._reply_or_hold(worker, ident, pull=pull, copied=copied)

    def _reply_buffer(self, link: shm.WorkerLink) -> np.ndarray | None:
        """Where a consistent pull of this worker is written: its shared segment, or a send
        buffer reused across replies (safe: the worker sends again only after receiving)."""
        if not self.updater.rule.consistent_reads:
            return None
        if link.params is not None:
            return link.params
        if link.send_buffer is None:
            link.send_buffer = np.empty(self.size, dtype=np.float32)
        return link.send_buffer

    def _apply(self, worker: int, grad: np.ndarray, delay: int, scale: float = 1.0,
               into: np.ndarray | None = None, norm: float | None = None) -> bool:
        """One update (the rule decides, the optimizer steps: `nbdist.core.updater`). With
        `into`, the new weights are also copied there; returns whether that copy was made.
        `norm`: the whole gradient's norm, which global clipping needs when a shard sees part."""
        changed, copied = self.updater.push(worker, self.params, grad, delay, scale, into,
                                            norm if self.spec.num_shards > 1 else None)
        self.version += int(changed)
        return copied

    def _apply_group(self, step: GroupStep) -> None:
        """A completed group step: its batch-weighted mean at the group's rate
        `lr · B_g / B_ref` (`group_lr`), i.e. lr / B_ref x the sum of per-sample gradients."""
        delay = self.version - min(step.read_versions.values())
        self._apply(min(step.members), step.mean, delay, scale=step.batch / self.spec.plan.batch_size)
        if self.coordinator:
            for member, header in step.headers.items():
                self.coordinator.push(member, header, self.version - 1 - step.read_versions[member], self.now())

    def _expire_group_steps(self) -> None:
        """A member that never pushes (it died, or a regroup crossed its push) must not stall
        its group: after GROUP_WAIT_LIMIT_S the step is applied with the pushes that came."""
        steps = self.barrier.expired(GROUP_WAIT_LIMIT_S)
        for step in steps:
            self._apply_group(step)
            if self.coordinator:
                self.coordinator.stats.record_event("group_timeout", self.now(), members=list(step.members),
                                                    pushed=sorted(step.headers))
        if steps:
            self._release_held()

    def _reply_or_hold(self, worker: int, ident, pull: bool, copied: bool = False) -> tuple[dict, list] | None:
        if self.barrier is not None and self.barrier.waiting(worker):
            self.held[worker] = (ident, pull)
            return None
        answer = self._reply(worker, pull, copied)
        if answer is None:
            self.held[worker] = (ident, pull)
        return answer

    def _reply(self, worker: int, pull: bool, copied: bool = False) -> tuple[dict, list] | None:
        """The answer to `worker`; `copied`: its pull buffer already holds the weights."""
        work = self.coordinator.work_for(worker, pull, self.version) if self.coordinator else {}
        if work is None:
            return None
        header: dict = {"op": "reply", "version": self.version, **work}
        buffers: list = []
        if pull:
            link = self.links[worker]
            link.read_version = self.version
            self.updater.rule.on_pull(worker, self.params, self.version)
            target = self._reply_buffer(link)
            if target is not None and not copied:
                np.copyto(target, self.params)
            if link.params is not None:  # same host: parameters go through shared memory
                header["params"] = "shm" if target is not None else "live"  # live: no lock
                header["seg"] = link.segment.name
            else:
                buffers.append(compression.encode(target if target is not None else self.params, link.compression))
            if self.coordinator and self.non_trainable.size:
                buffers.append(self.non_trainable.copy())
        return header, buffers

    def _report(self, msg: Message, ident) -> tuple[dict, list]:
        worker = int(msg.header["worker"])
        if worker == 0 and "state" in msg.header:
            self.sync_snapshot = (msg.header["state"], [msg.floats(i).copy() for i in range(3)])
        return {"op": "reply", **self.coordinator.report(worker, msg.header, self.now())}, []

    def _bye(self, msg: Message, ident) -> tuple[dict, list]:
        worker = int(msg.header["worker"])
        self._forget(worker)
        if self.coordinator and worker not in self.coordinator.lost:
            self.coordinator.bye(worker, self.now())
        return {"op": "bye"}, []

    def _forget(self, worker: int) -> None:
        """`worker` left or died: free its link and rule state; nothing waits for it any more."""
        link = self.links.pop(worker, None)
        if link:
            shm.release(link.segment)
        self.held.pop(worker, None)
        self.updater.rule.forget(worker)
        if self.barrier is not None:
            for step in self.barrier.drop(worker):
                self._apply_group(step)

    def _find_lost(self) -> None:
        """Workers silent past their deadline (killed, engine died) are written off."""
        for worker in self.coordinator.overdue(self.now(), exempt=self.held):
            deadline = self.coordinator.deadline(worker)
            log.warning("hub: worker %d silent for over %.1fs; counting it as lost", worker, deadline)
            writeoff.relay(self, worker, f"silent for over {deadline:.1f}s")  # every shard first
            self._lose(worker, f"silent for over {deadline:.1f}s")

    def _lose(self, worker: int, reason: str) -> None:
        self._forget(worker)
        if self.coordinator:
            self.coordinator.lose(worker, self.now(), reason)
        self._release_held()  # e.g. SSP: the others no longer wait for its clock

    # -- kernel ops -------------------------------------------------------------------------

    def _stats(self, msg: Message, ident) -> tuple[dict, list]:
        h = msg.header
        snap = self.coordinator.snapshot(int(h.get("since", 0)), bool(h.get("timeline")))
        snap.update(version=self.version, error=self.error, dropped=dict(self.dropped),
                    hub_bytes=int(self.params.nbytes + self.updater.state_nbytes),
                    rule_options=self.updater.rule.options, elapsed=self.now())
        if self.spec.plan.lr_owner == "hub":
            snap["lr"] = self.updater.learning_rate()  # the schedule's value at this step
        return {"op": "stats"}, [json.dumps(snap).encode()]

    def _control(self, msg: Message, ident) -> tuple[dict, list]:
        h = msg.header
        if "lr" in h:
            lr = float(h["lr"])
            if not (math.isfinite(lr) and lr > 0):
                raise ValueError(f"learning rate must be positive and finite, got {lr}")
            if self.spec.plan.lr_owner == "hub":  # else the coordinator tells the workers
                self.updater.set_learning_rate(lr)
        if "option" in h:
            self.updater.rule.set_option(str(h["option"][0]), float(h["option"][1]))
        if "add_worker" in h:  # a worker joins mid-run: shard 0 (asked first) may refuse, then all admit
            if self.coordinator:
                self.coordinator.add_worker(h["add_worker"], self.now(), h.get("engine"))
            self.num_workers = admit(self.num_workers, h["add_worker"])
        if "lost" in h:  # the kernel saw the worker's engine die
            self._lose(int(h["lost"]), str(h.get("reason", "engine died")))
        if h.get("stop") and self.barrier is not None:
            for step in self.barrier.flush_all():
                self._apply_group(step)
        if self.coordinator:
            self.coordinator.control(h, self.now())
        return {"op": "ok"}, []

    def _params(self, msg: Message, ident) -> tuple[dict, list]:
        return {"op": "params", "version": self.version}, [self.params.copy(), self.non_trainable.copy()]

    def _peers(self, msg: Message, ret) -> tuple[dict, list]:
        writeoff.link(self, msg.header["shards"])
        return {"op": "ok"}, []

    def _shutdown(self, msg: Message, ident) -> tuple[dict, list]:
        self.closing = True
        return {"op": "ok"}, []
