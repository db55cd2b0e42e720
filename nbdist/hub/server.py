"""The hub: one parameter-server shard, serving workers and the kernel over ZeroMQ.

A thin loop around the shard's logic (`nbdist.core.shard.ShardCore`: parameters, rule,
optimizer, barrier and, on shard 0, the run's `Coordinator`): it receives and checks a message,
calls the core, and sends what the core answers. What is the hub's own: the socket, the
workers' links (shared memory or a reused send buffer, wire compression), the write-off relay
to the other shards, sync mode's latest rank-0 snapshot, and the kernel's lease (a hub on an
engine ends the run of a kernel that died: `nbdist.hub.orphan`). A reply the core holds (SSP: a
worker too far ahead; group sync: a group still incomplete) is sent as soon as the core
releases it. On a push the reply goes out before the push's bookkeeping, which is done for
`SETTLE_EVERY` pushes at a time (`ShardCore.settle`).

The requests it answers and their replies are typed in `nbdist.wire.messages` (hello, step, bye
from workers; report from a sync rank; stats, control, params, state, peers and shutdown from
the kernel, answered by `Hub`'s kernel ops), all signed (`nbdist.hub.protocol`). Shard 0
also answers a bare `step` (no push, no pull), so idle workers can wait cheaply.
"""

from __future__ import annotations

import json
import logging
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import zmq

from nbdist.algorithms.streaming import StreamingDiLoCo, fragment_span
from nbdist.core import compression
from nbdist.core.compression import PullEncoder
from nbdist.core.liveness import LEASE_GAP_S, Lease, RunningClock
from nbdist.core.plan import Plan
from nbdist.core.shard import GROUP_WAIT_LIMIT_S, ShardCore
from nbdist.engine.rule_by_value import register_packed
from nbdist.errors import ProtocolError, RepeatedMessageError
from nbdist.hub import localline, orphan, shm, writeoff
from nbdist.hub.export import hub_state, shard_state
from nbdist.hub.memory import reuse_large_buffers
from nbdist.hub.profile import marker
from nbdist.hub.protocol import (
    MAX_HEADER_BYTES,
    SIGNATURE_BYTES,
    Codec,
    Message,
    send_frames,
)
from nbdist.hub.threads import split_updates
from nbdist.hub.wire import (
    Inbox,
    Return,
    bind,
    local_path,
    receive,
    remove_socket_files,
    server_socket,
    socket_folder,
)
from nbdist.wire.messages import (
    Bye,
    Control,
    Error,
    Hello,
    Ok,
    Params,
    ParamsReply,
    Peers,
    Reply,
    Report,
    ReportReply,
    ShardState,
    Shutdown,
    State,
    Stats,
    StatsReply,
    Step,
)
from nbdist.wire.schema import Wire

log = logging.getLogger(__name__)
__all__ = ["GROUP_WAIT_LIMIT_S", "Hub", "HubSpec"]
LOST_CHECK_S = 0.5  # how often shard 0 looks for workers silent past their deadline
SETTLE_EVERY = 16  # pushes accounted together after their replies (ShardCore.settle)
MAX_LOCAL_LINES = 256  # same-host lines open at once (workers, and a worker's reopened line)
# a hub told to shut down closes its socket only once the replies it queued are out (the
# Ok that the kernel waits for, which linger 0 could drop: the kernel then waited 30 s), or
# after this long if their peer has gone
CLOSING_LINGER_MS = 2000


@dataclass
class HubSpec:
    """Everything one shard needs; sent to its engine by ipyparallel."""

    run_id: str
    key: bytes = field(repr=False)  # the run key: signs every message, never printed
    shard: int
    num_shards: int
    plan: Plan
    params: np.ndarray  # this shard's initial slice
    non_trainable: np.ndarray  # float non-trainable state (shard 0 only; empty elsewhere)
    rule_options: dict = field(default_factory=dict)
    local_steps: int = 1
    # what applies the rule's gradient (nbdist.core.updater); None: easgd
    optimizer: dict | None = None
    # where this shard's slice starts in the flat vector (for per-variable clipping)
    offset: int = 0
    # the model's Keras constraints (nbdist.algorithms.constraints)
    constraints: list = field(default_factory=list)
    bind_host: str = "127.0.0.1"
    idle_timeout: float = 120.0
    restore: dict | None = None  # a checkpoint's state for this shard (nbdist.resume)
    extra_bytes: int = 0  # sync mode: room for rank 0's state (weights, optimizer slots)
    encrypt: bool = False  # CurveZMQ on this shard's socket (--encrypt)
    profile: bool = False  # CPU time per phase of a push (nbdist.hub.profile; benchmarks)
    # > 0: poll this long before sleeping, where the hub has a core of its own (--spin)
    spin_s: float = 0.0
    # the kernel's lease (nbdist.core.liveness.Lease): a shard whose kernel has been silent this
    # long ends the run (nbdist.hub.orphan); None: no lease (a hub that lives in the kernel)
    lease_s: float | None = None
    # where a run whose kernel died writes its last checkpoint (shard 0): {"dir": the folder,
    # "info": what every checkpoint of the run records, Job.checkpoint_info}; None: nowhere
    last_checkpoint: dict | None = None
    # the TCP addresses of the hosts of the run's workers and kernel: the gate reserves their
    # share of its handshake slots (nbdist.hub.gate); None: not known, no share reserved
    peer_hosts: list[str] | None = None
    # a rule written in the notebook, by value (`nbdist.engine.rule_by_value.pack`); None: built-in
    rule: bytes | None = None
    # the trainable variables' shapes, in flat order: where --compression powersgd finds the
    # matrices of this shard's slice (`nbdist.core.low_rank`), as its workers do
    shapes: list = field(default_factory=list)


class Hub:
    """One shard's server loop. Create on the engine, then call `serve()` (blocks). `clock`:
    the shard's time in seconds (default: the seconds its loop has run since it was built, on
    `time.monotonic()` with the gaps of a stopped or starved hub left out, so neither a wall
    clock's jump nor a suspend makes its workers look silent: `nbdist.core.liveness`); a test
    passes its own to move time without waiting."""

    def __init__(self, spec: HubSpec, clock: Callable[[], float] | None = None):
        self.spec = spec
        register_packed(spec.rule)  # before the shard makes its rule, which finds it by name
        self.start_time = time.time()  # a timestamp for the views, never a duration
        self.running = RunningClock()
        self.running.read(time.monotonic())
        self.now = clock or self._running_time
        self.size = int(spec.params.size)
        self.codec = Codec(spec.key, f"hub-{spec.shard}", spec.run_id,
                           max_buffer_bytes=2 * (4 * self.size + spec.non_trainable.nbytes)
                                            + 4096 + spec.extra_bytes)
        # shard 0: lines to the other shards, for write-offs (nbdist.hub.writeoff)
        self.peers = None
        # what run.warnings should say of this shard (a full /dev/shm), in its stats replies
        self.warnings: list[str] = []
        self._segment, params = self._live_segment()  # live parameters, read by hogwild workers
        params[:] = spec.params
        self.core = ShardCore(spec.plan, params, spec.non_trainable, now=self.now, shard=spec.shard,
                              num_shards=spec.num_shards, rule_options=spec.rule_options,
                              optimizer=spec.optimizer, offset=spec.offset,
                              constraints=spec.constraints, start_time=self.start_time,
                              settle_every=SETTLE_EVERY)
        self._update_pool = split_updates(self.core.updater)  # large updates on a few threads
        reuse_large_buffers(4 * self.size)  # a 40 MB push frame: no fresh mapping per message
        self.links: dict[int, shm.WorkerLink] = {}
        # worker -> the sender (process) of its latest hello, and the earlier ones it replaced
        self.incarnation: dict[int, str] = {}
        self.retired: dict[int, set[str]] = {}
        self.dropped: Counter[str] = Counter()
        # requester (sender) -> its latest answer over ZeroMQ (where to, reply, buffers): sent
        # again when the request comes again from a line whose connection came back
        self.answers: dict[str, tuple[Return, Wire, list]] = {}
        self.error: str | None = None
        self.closing = False
        self.sync_snapshot = None  # sync mode: rank 0's latest state (nbdist.checkpoint.sync_state)
        # the kernel's lease on the run, and when it lapsed (nbdist.hub.orphan)
        self.lease_clock = RunningClock(max_step_s=LEASE_GAP_S)
        self.lease = (None if spec.lease_s is None
                      else Lease(spec.lease_s, self.lease_clock.read(time.monotonic())))
        self.orphaned_at: float | None = None
        if spec.restore is not None:
            self.core.restore(spec.restore)
        self._ctx = zmq.Context()
        self._max_bytes = self.codec.max_buffer_bytes + MAX_HEADER_BYTES + SIGNATURE_BYTES + 256
        self._sock = self._auth = self._listener = self._folder = None
        self.endpoints: dict = {}
        try:
            self._sock, self._auth = server_socket(self._ctx, spec.key,
                                                   self._max_bytes + (1 << 20), spec.encrypt,
                                                   peers=spec.plan.num_workers + spec.num_shards,
                                                   planned=spec.peer_hosts)
            self._folder = socket_folder(spec)
            self._listener = localline.listen(local_path(self._folder), MAX_LOCAL_LINES)
            self.endpoints = bind(self._sock, spec, self._folder, self._listener,
                                  params_shm=None if self._segment is None else self._segment.name,
                                  size=self.size, spin_s=spec.spin_s,
                                  gate=self._auth.id)
        except BaseException:  # e.g. an address it cannot bind: give back what it took
            self.close()
            raise
        self._inbox = Inbox(self._sock, self._listener, self._max_bytes, spin_s=spec.spin_s)
        self.profile, self._mark = marker(spec.profile)

    def _live_segment(self):
        """The segment of the live parameters and its float view; where `/dev/shm` has no room
        for it, None and an array of the hub's own (hogwild workers beside it then read a copy
        in their own segment, `_reply_buffer`), and `run.warnings` says so."""
        try:
            segment = shm.create(4 * self.size)
        except OSError as exc:
            self.warn(f"hub shard {self.spec.shard}: {shm.unavailable(exc, 4 * self.size)}")
            return None, np.empty(self.size, dtype=np.float32)
        return segment, shm.floats(segment, 0, self.size)

    def warn(self, note: str) -> None:
        """A line for `run.warnings` (each once), sent with this shard's statistics."""
        log.warning("%s", note)
        if note not in self.warnings:
            self.warnings.append(note)

    def _running_time(self) -> float:
        return self.running.read(time.monotonic())

    def lease_time(self) -> float:
        """The running time the kernel's lease is kept on (`nbdist.core.liveness.LEASE_GAP_S`)."""
        return self.lease_clock.read(time.monotonic())

    @property
    def num_workers(self) -> int:
        return self.core.num_workers

    @property
    def version(self) -> int:
        return self.core.version

    @property
    def local_lines(self) -> int:
        """Same-host lines open now (`nbdist.hub.localline`): one per worker beside the hub."""
        return 0 if self._listener is None else len(self._listener.conns)

    # -- the loop ---------------------------------------------------------------------------

    def serve(self) -> dict:
        """Answer messages until `shutdown`, or until nobody has spoken for `idle_timeout`."""
        handlers = {Hello: self._hello, Step: self._step, Report: self._report, Bye: self._bye,
                    Stats: self._stats, Control: self._control, Params: self._params,
                    State: self._state, Peers: self._peers, Shutdown: self._shutdown}
        timeout_ms = 100 if self.core.barrier is not None else 500  # wakes the loop for its checks
        last_heard = self._running_time()
        last_check, last_lease_check = self.now(), self.lease_time()
        grouped = self.core.barrier is not None
        mark = self._mark
        try:
            while not self.closing:
                self._running_time()  # every turn: a longer interval is a gap of the hub itself
                self.lease_time()
                if grouped and self.core.barrier.pending and (
                        self.core.apply_gate_groups()
                        or self.core.expire_groups(GROUP_WAIT_LIMIT_S)):
                    self._release_held()
                if self.core.coordinator and self.now() - last_check > LOST_CHECK_S:
                    last_check = self.now()
                    self._find_lost()
                if self.lease is not None and self.lease_time() - last_lease_check > LOST_CHECK_S:
                    last_lease_check = self.lease_time()
                    if orphan.check(self):  # the kernel is gone and the run has ended
                        break
                mark("loop")
                try:  # limits, MAC, run, recipient, seq, op, field types, segment
                    request, msg, ret = receive(self._inbox, timeout_ms, self.codec,
                                                self.core.num_workers, self.links, mark)
                except zmq.Again:  # nothing came within the timeout
                    self.core.settle()
                    if self._running_time() - last_heard > self.spec.idle_timeout:
                        log.warning("hub %d: nobody spoke for %.0fs; leaving", self.spec.shard,
                                    self.spec.idle_timeout)
                        self.error = self.error or ("hub idle timeout: the kernel and workers "
                                                    "went silent")
                        break
                    continue
                except RepeatedMessageError as exc:  # never applied twice: answered again
                    self.dropped[exc.reason] += 1
                    self._answer_again(exc.sender, exc.seq)
                    continue
                except ProtocolError as exc:
                    self.dropped[exc.reason] += 1
                    continue
                last_heard = self._running_time()
                if self.lease is not None and ret.to.partition("/")[0] == orphan.KERNEL:
                    self.lease.renew(self.lease_time())
                try:
                    answer = handlers[type(request)](request, msg, ret)
                    delivered = answer is None or self._send(ret, *answer)
                    if not delivered and type(request) in (Hello, Step):
                        self._not_reading([request.worker])
                    # pushes' bookkeeping, once their replies are out
                    self.core.settle(due_only=True)
                    mark("settle")
                # a bug or bad request: tell the sender, keep serving
                except Exception as exc:  # noqa: BLE001
                    self.error = (f"hub {self.spec.shard} failed on {msg.op!r}: {exc}\n"
                                  f"{traceback.format_exc()}")
                    log.error("%s", self.error)
                    self._send(ret, Error(str(exc)), [])
                if self.core.held:
                    self._release_held()
        finally:
            self.close()
        return {"shard": self.spec.shard, "version": self.core.version, "error": self.error,
                "dropped": self.dropped_counts(), "orphaned": self.orphaned_at is not None,
                **({"profile": self.profile.summary()} if self.profile is not None else {})}

    def dropped_counts(self) -> dict[str, int]:
        """Messages dropped, by reason, and connections the gate refused or cut."""
        return {**self.dropped, **(self._auth.counts() if self._auth is not None else {})}

    def _send(self, ret: Return, reply: Wire, buffers: list) -> bool:
        """Send a reply without ever waiting; False (and counted) if it could not be delivered
        because its peer does not read (its line or ZeroMQ queue is full) or its line is gone.
        A reply over ZeroMQ is kept (`answers`) until the requester's next one: a peer whose
        connection ended (no route to its id now) gets it when it comes back and asks again
        (`nbdist.hub.lines`); counted, but not a peer that does not read."""
        mark = self._mark
        mark("reply")
        frames = self.codec.encode(reply.encode(), buffers, to=ret.to, re=ret.re, mark=mark)
        try:
            if type(ret.ident) is localline.Conn:
                ret.ident.send(frames, block=False)
            else:
                self.answers[ret.to] = (ret, reply, buffers)
                send_frames(self._sock, [ret.ident, *frames], zmq.DONTWAIT)
        except zmq.ZMQError as exc:
            self.dropped["reply not delivered"] += 1
            return exc.errno == zmq.EHOSTUNREACH  # no connection now: kept for a repeat
        except (OSError, ProtocolError):  # gone, not reading, or (a bug) too large
            self.dropped["reply not delivered"] += 1
            return False
        finally:
            mark("send")
        return True

    def _answer_again(self, sender: str, seq: int) -> None:
        """`sender` sent its latest request again (its connection came back): the answer, if
        that request was answered; a request still held is answered when it is released."""
        ret, reply, buffers = self.answers.get(sender, (None, None, None))
        if ret is not None and ret.re == seq:
            self._send(ret, reply, buffers)

    def _release_held(self) -> None:
        """Send every held reply the core lets go."""
        unread = []
        for worker, ret, pull, reply in self.core.release():
            if not self._send(ret, *self._reply(worker, pull, reply)):
                unread.append(worker)
            self.core.heard(worker)  # its silence counts from now
        self._not_reading(unread)

    def _not_reading(self, workers: list[int]) -> None:
        """Workers whose reply could not be delivered would wait for it until their --timeout
        and fail the run: shard 0 writes them off at once instead (their chunks go to the
        others). Another shard only counts the drop; its worker, waiting for that reply, goes
        silent and shard 0 writes it off at its deadline."""
        if self.core.coordinator is None or not self.core.plan.silence_is_loss:
            return
        for worker in workers:
            if not self.core.written_off(worker):
                log.warning("hub: worker %d's reply could not be delivered; counting it as lost",
                            worker)
                self._write_off(worker, "its replies were not read (its queue was full or its "
                                        "socket gone)")
        if workers:
            self._release_held()

    def close(self) -> None:
        writeoff.close(self)
        if self._update_pool is not None:
            self._update_pool.close()
        if self._sock is not None:  # after a Shutdown its Ok is queued: it must still go out
            self._sock.close(CLOSING_LINGER_MS if self.closing else 0)
        if self._listener is not None:
            self._listener.close()
        if self._auth is not None:
            self._auth.stop()
        self._ctx.term()
        for link in self.links.values():
            shm.release(link.segment)
        self.links.clear()
        self.core.params = None  # the last view of the segment, which is released now
        shm.release(self._segment, unlink=True)
        remove_socket_files(self.endpoints, self._folder)  # the line's listener removed its own

    # -- worker ops -------------------------------------------------------------------------

    def _hello(self, hello: Hello, msg: Message, ret: Return) -> tuple[Reply, list] | None:
        """Register a worker's process, which replaces any earlier one of its id. A hello from
        a process already replaced (a late message of an earlier incarnation) is dropped, as
        its other messages are (`wire.check_link`): it would re-register the old process, and
        the live one's steps would then be dropped as stale."""
        worker, sender = hello.worker, ret.to
        if sender in self.retired.get(worker, ()):
            self.dropped["stale incarnation"] += 1
            return None
        last = self.incarnation.get(worker)
        if last is not None and last != sender:
            self.retired.setdefault(worker, set()).add(last)
        self.incarnation[worker] = sender
        old = self.links.pop(worker, None)
        if old:
            shm.release(old.segment)
        self.links[worker] = (shm.WorkerLink(shm.attach(hello.shm), hello.offset, self.size,
                                             hello.total)
                              if hello.shm else shm.WorkerLink())
        # shared memory carries no frames: the codec acts over TCP (and ipc) only
        link = self.links[worker]
        link.codec = compression.parse(hello.compression if hello.link == "tcp" else "none").bind(
            self.spec.shapes, self.spec.offset, self.spec.offset + self.size)
        if hello.link == "shm" and hello.compression != "none" and self.core.coordinator:
            self.warn(f"--compression {hello.compression} applies only to workers that reach "
                      "their hub shards over TCP; the workers on the hub's host share memory "
                      "with it, so no bytes cross a network and nothing is compressed. Pass "
                      "--transport tcp to send compressed frames over loopback (to study a "
                      "codec on one machine).")
        if hello.shm_fallback and self.core.coordinator is not None:  # said once, by shard 0
            self.warn(f"worker {worker}: {hello.shm_fallback}")
        self.links[worker].sender = ret.to
        self.core.hello(hello)
        return self._reply_or_hold(worker, ret, pull=True)

    def _step(self, step: Step, msg: Message, ret: Return) -> tuple[Reply, list] | None:
        worker = step.worker
        if worker not in self.links or self.core.written_off(worker):
            # written off as lost, yet alive: its chunks went to others, so it must leave
            self.dropped["written-off worker"] += 1
            return Reply.written_off(self.core.version), []
        self.core.heard(worker)
        link = self.links[worker]
        copied = False  # whether the pull buffer already holds the new weights
        link.fragment = step.fragment if step.pull else None
        if step.push:
            grad = (link.grad if link.grad is not None
                    else self._pushed(link, msg.buffers[0], step.fragment))
            delta = (msg.floats(len(msg.buffers) - 1)
                     if self.core.coordinator and self.core.non_trainable.size else None)
            self._mark("parse")
            if self.profile is not None:
                self.profile.pushes += 1
            copied = self.core.push(step, grad,
                                    into=self._reply_buffer(link) if step.pull else None,
                                    non_trainable_delta=delta)
            self._mark("update")
        self.core.eval_result(worker, step.eval)
        return self._reply_or_hold(worker, ret, pull=step.pull, copied=copied)

    def _reply_buffer(self, link: shm.WorkerLink) -> np.ndarray | None:
        """Where a consistent pull of this worker is written: its shared segment, or a send
        buffer reused across replies (safe: the worker sends again only after receiving)."""
        if not self.core.updater.rule.consistent_reads and (self._segment is not None
                                                             or link.params is None):
            return None  # hogwild: it reads the live segment, or the live array is sent
        if link.params is not None:
            return link.params
        if link.send_buffer is None:
            link.send_buffer = np.empty(self.size, dtype=np.float32)
        return link.send_buffer

    def _reply_or_hold(self, worker: int, ret: Return, pull: bool,
                       copied: bool = False) -> tuple[Reply, list] | None:
        reply = self.core.reply(worker, pull, ret)
        return None if reply is None else self._reply(worker, pull, reply, copied)

    def _reply(self, worker: int, pull: bool, reply: Reply,
               copied: bool = False) -> tuple[Reply, list]:
        """The core's reply, with the weights on a pull (`copied`: the worker's pull buffer
        already holds them)."""
        buffers = []
        if pull:
            link, params = self.links[worker], self.core.params
            target = self._reply_buffer(link)
            if target is not None and not copied:  # an evaluation reads the weights themselves
                self.core.read_into(worker, target, plain=reply.eval is not None)
            if link.params is not None:  # same host: parameters go through shared memory
                reply.params = "shm" if target is not None else "live"  # live: no lock
                reply.seg = link.segment.name
            else:
                weights = params if target is None else target
                buffers.append(self._pull_frame(worker, link, weights, reply)
                               if link.fragment is None or reply.eval is not None
                               else self._fragment_frame(link, weights))
            if self.core.coordinator and self.core.non_trainable.size:
                buffers.append(self.core.non_trainable.copy())
        return reply, buffers

    def _pushed(self, link: shm.WorkerLink, frame, fragment: int | None = None) -> np.ndarray:
        """The gradient a TCP push's frame holds (a lossy codec's into a buffer the link
        reuses: its worker pushes again only after this push's reply). A push of one
        `fragment` (streaming-diloco) fills that fragment's span: the rule reads nothing else."""
        if fragment is not None:
            if link.decoded is None:
                link.decoded = np.zeros(self.size, dtype=np.float32)
            lo, hi = self._span(fragment)
            compression.decode_into(frame, link.codec, link.decoded[lo:hi])
            return link.decoded
        if not link.codec.lossy:
            return compression.decode(frame, link.codec)
        if link.decoded is None:
            link.decoded = np.empty(self.size, dtype=np.float32)
        compression.decode_into(frame, link.codec, link.decoded)
        return link.decoded

    @property
    def _streaming(self) -> bool:
        """streaming-diloco: pushes of one fragment, and evaluations of whole float32 pulls."""
        return isinstance(self.core.updater.rule, StreamingDiLoCo)

    def _span(self, fragment: int) -> tuple[int, int]:
        """[lo, hi) of `fragment` in this shard's slice (streaming-diloco's fragments)."""
        return fragment_span(self.size, int(self.core.updater.rule.options["fragments"]),
                             fragment)

    def _fragment_frame(self, link: shm.WorkerLink, weights: np.ndarray) -> np.ndarray:
        """The pull of one fragment over TCP: its float32 weights alone. A lossy codec's copy
        of what the worker holds takes them too, so its later pulls of changes stay exact."""
        lo, hi = self._span(link.fragment)
        if link.pull is not None:
            np.copyto(link.pull.held[lo:hi], weights[lo:hi])
        return weights[lo:hi]

    def _pull_frame(self, worker: int, link: shm.WorkerLink, weights: np.ndarray,
                    reply: Reply) -> np.ndarray:
        """The frame of a TCP pull. A lossy codec sends the change from the copy the worker
        holds, after a first pull of the weights themselves (as an evaluation's pull is, so
        that it scores this shard's weights): `reply.params` is then "full"."""
        if reply.eval is not None and self._streaming and not link.codec.lossy:
            reply.params = "full"  # streaming-diloco evaluates these: float32, as the hub's
            return weights
        if not link.codec.lossy:
            return compression.encode(weights, link.codec)
        if link.pull is None or reply.eval is not None:
            if link.pull is None:
                link.pull = PullEncoder(link.codec, self.size,
                                        np.random.default_rng([self.spec.shard, worker]))
            np.copyto(link.pull.held, weights)
            reply.params = "full"
            return link.pull.held.copy()
        return link.pull.encode(weights)

    def _report(self, report: Report, msg: Message, ret: Return) -> tuple[ReportReply, list]:
        if report.state is not None:  # rank 0's (worker 0's, unless the ranks were restarted)
            self.sync_snapshot = (report.state, [msg.floats(i).copy() for i in range(3)])
        return self.core.coordinator.report(report, self.now()), []

    def _bye(self, bye: Bye, msg: Message, ret: Return) -> tuple[Ok, list]:
        self.unlink(bye.worker)
        self.core.bye(bye.worker)
        return Ok(), []

    def unlink(self, worker: int) -> None:
        """Forget `worker`'s link and release its shared segment (bye, or written off)."""
        link = self.links.pop(worker, None)
        if link:
            self.answers.pop(getattr(link, "sender", None), None)
            shm.release(link.segment)

    # -- kernel ops: the kernel's requests (`HubControl`), a few a second at most -----------

    def _stats(self, stats: Stats, msg: Message, ret: Return) -> tuple[StatsReply, list]:
        """Shard 0's statistics; another shard's answer says that it is alive, and its error."""
        if self.core.coordinator is None:
            snap = {"shard": self.spec.shard, "version": self.core.version}
        else:
            snap = self.core.stats(stats.since, stats.timeline)
        snap.update(error=self.error, dropped=self.dropped_counts(), warnings=self.warnings)
        return StatsReply(), [json.dumps(snap).encode()]

    def _control(self, control: Control, msg: Message, ret: Return) -> tuple[Ok, list]:
        if control.lost is not None:
            self.unlink(control.lost)
        self.core.control(control)
        return Ok(), []

    def _params(self, params: Params, msg: Message, ret: Return) -> tuple[ParamsReply, list]:
        return ParamsReply(self.core.version), [self.core.result_weights(),
                                                self.core.non_trainable.copy()]

    def _state(self, state: State, msg: Message, ret: Return) -> tuple[ShardState, list]:
        if self.sync_snapshot is not None:  # sync mode: the weights rank 0 sent
            return hub_state(self.core, self.sync_snapshot)
        return shard_state(self.core)

    def _peers(self, peers: Peers, msg: Message, ret: Return) -> tuple[Ok, list]:
        writeoff.link(self, peers.shards)
        return Ok(), []

    def _shutdown(self, shutdown: Shutdown, msg: Message, ret: Return) -> tuple[Ok, list]:
        self.core.settle()
        self.closing = True
        return Ok(), []

    def _find_lost(self) -> None:
        """Workers silent past their deadline (killed, engine died) are written off."""
        for worker, deadline in self.core.overdue():
            log.warning("hub: worker %d silent for over %.1fs; counting it as lost", worker,
                        deadline)
            self._write_off(worker, f"silent for over {deadline:.1f}s")
        self._release_held()  # e.g. SSP: the others no longer wait for its clock

    def _write_off(self, worker: int, reason: str) -> None:
        writeoff.relay(self, worker, reason)  # every shard first
        self.unlink(worker)
        self.core.lose(worker, reason)
