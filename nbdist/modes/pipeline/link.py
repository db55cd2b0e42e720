"""The sockets of one pipeline stage: activations and gradients to and from its neighbours,
reports to the kernel, and the kernel's stop, abort and lease (`Alive`: a stage whose kernel
is silent past `--timeout` less 2 s leaves; the kernel's end: `kernel_link`).

Every message is signed with the run's key by `nbdist.hub.protocol.Codec` (the hub's framing):
a JSON header with the arrays' shapes and dtypes, then the arrays. Nothing is unpickled.
A stage binds one PULL socket (on its engine's address towards its neighbours; loopback when
they share its host) and receives both directions there; messages that arrive before the
schedule needs them wait in a buffer keyed by (kind, step, micro-batch).

Transport, per neighbour (`--transport`, default auto):
- **Same host** (the neighbour's `nbdist.cluster.netaddr.host_id()` travels with its endpoint), like
  the hub's shared-memory path: the sender owns one segment per neighbour (`nbdist.hub.shm.create`:
  an unguessable name, mode 0600) of `slots` equal slots. It copies a message's arrays into a
  free slot and sends only the signed header, which names the segment, its generation, the slot
  and each array's offset; the receiver verifies the MAC over that header, checks the segment
  and generation and the bounds, copies the arrays out and acknowledges the slot with a small
  signed `ack`, which frees it. A slot is only reused after its ack, so it is never overwritten
  before the receiver has copied it out, whatever the schedule (GPipe, 1F1B, validation
  batches) keeps in flight; the slot count only decides how often a message must go by TCP
  instead: when every slot is still unacknowledged (acks that have arrived are read before
  giving up), or when a message is larger than a slot while others are in flight. With no
  slot in flight, a larger message replaces the segment with a bigger one (the next
  generation; the old one is unlinked, and the receiver drops it on seeing the new name), so
  the slots grow to the largest message at the cut (validation batches are the largest).
- **Other hosts**, `--transport tcp`, and the fallback above: the arrays travel as raw frames
  after the header over TCP, all of it under the MAC.
`messages` counts the messages with arrays sent to neighbours, by transport. The creator unlinks its
segments in `close` (end of run, failure, abort); a stage engine that is killed leaves them to
Python's resource tracker, which unlinks what the dead process created (as for the hub's).

Received as strictly as the hub receives: the bound sockets sit behind a gate
(`nbdist.hub.gate`: only holders of the run key finish the handshake, connections still in it
are capped), with the hub's receive high-water mark and a frame limit; a message is read
frame by frame within the stage's limits (`checks.message_limits`), then its MAC, run,
recipient and sequence number (replays) are checked, then its op fields and frame table
(`checks`, against the typed messages of `messages`). Whatever fails is dropped and counted
by reason in `dropped`, never raised.
With `--encrypt` (`encrypt`) every TCP socket here is CurveZMQ: the gate admits only the run's
client key, and the endpoints the stages and the kernel hand out carry the server key.

Links come back (`nbdist.hub.dial`): when the connection of a socket towards a neighbour or the
kernel ends (a TCP reset) or the gate refuses it, a new socket with fresh credentials replaces it,
and the latest messages sent on it (at most `RESEND` of them and `RESEND_BYTES`) are sent again,
in order, before anything newer: the receiver takes those it had not (a reset loses the tail of
a stream) and drops the rest as replays. Each send queue holds at most `SEND_QUEUE` messages; a
send that cannot be queued within the timeout fails, naming the neighbour.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from dataclasses import replace

import numpy as np
import zmq

from nbdist.cluster.netaddr import host_id
from nbdist.core.liveness import LEASE_GAP_S, LEASE_MARGIN_S, Lease, RunningClock, lease_term
from nbdist.errors import ConfigError, ProtocolError, TrainingError
from nbdist.hub import shm
from nbdist.hub.dial import Dial
from nbdist.hub.gate import curve_keys
from nbdist.hub.protocol import Codec, send_frames
from nbdist.hub.wire import recv_bounded, server_socket
from nbdist.modes.pipeline.checks import arrays_of, slot_table, stage_message
from nbdist.modes.pipeline.messages import (
    CONTROLS,
    Abort,
    Ack,
    Alive,
    End,
    NewRate,
    Release,
    Slot,
    Stop,
    decode,
)
from nbdist.wire.schema import Wire

log = logging.getLogger(__name__)
POLL_MS = 200
SEND_RETRY_S = 0.02  # between tries of a send that found no room, each look at the kernel's lease
SEND_QUEUE = 256  # messages queued towards one peer (ZMQ_SNDHWM): a schedule keeps far fewer
# in flight; a full queue means the peer stopped reading
# the latest messages per peer sent again after a redial: what its queue and the TCP buffers can
# have held when the connection ended (a schedule keeps a few micro-batches in flight)
RESEND, RESEND_BYTES = SEND_QUEUE + 64, 256 << 20
ALIGN = 64  # bytes: each array in a slot starts on a cache line
TICK_S = 0.25  # the lease clock's thread reads it this often (well inside LEASE_GAP_S)
PAGE = 4096


class _Recent:
    """The latest messages sent to one peer, at most `RESEND` of them and `RESEND_BYTES` (the
    latest one always), oldest first."""

    def __init__(self):
        self.frames: deque = deque()
        self._sizes: deque = deque()
        self._bytes = 0

    def add(self, frames: list, size: int) -> None:
        self.frames.append(frames)
        self._sizes.append(size)
        self._bytes += size
        while len(self.frames) > 1 and (len(self.frames) > RESEND or self._bytes > RESEND_BYTES):
            self.frames.popleft()
            self._bytes -= self._sizes.popleft()


class _TickingClock:
    """The stage's running time for the kernel's lease (`RunningClock`), read every `TICK_S`
    by a thread of its own. The stage's loop reads it only between its computations, and a
    first step's tracing can keep it away for seconds: counted as gaps, those seconds were
    left out, and a dead kernel's lease lapsed that much later (3.3 s measured). The thread
    stops with the process (SIGSTOP, a closed lid), so a suspend still counts as no time."""

    def __init__(self) -> None:
        self._clock = RunningClock(max_step_s=LEASE_GAP_S)
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self.read()
        self._thread = threading.Thread(target=self._tick, name="nbdist-lease-clock",
                                        daemon=True)
        self._thread.start()

    def read(self) -> float:
        with self._lock:
            return self._clock.read(time.monotonic())

    def _tick(self) -> None:
        while not self._stopping.wait(TICK_S):
            self.read()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(1.0)


class StageAborted(Exception):  # noqa: N818 - a signal to leave, not an error
    """The kernel ended the run (a failure elsewhere, or Ctrl-C): leave at once."""


class _Outbox:
    """The sender's segment towards one neighbour: `slots` slots of `slot_bytes`, which are free."""

    def __init__(self, slots: int, slot_bytes: int, generation: int):
        self.segment = shm.create(slots * slot_bytes)
        self.slot_bytes, self.generation = slot_bytes, generation
        self.free = list(range(slots))[::-1]
        self.slots = slots

    def busy(self) -> int:
        return self.slots - len(self.free)


def _layout(arrays: list) -> tuple[list[int], int]:
    """Each array's byte offset in a slot (cache-line aligned) and the bytes the slot needs."""
    offsets, end = [], 0
    for a in arrays:
        offsets.append(end)
        end += -(-a.nbytes // ALIGN) * ALIGN
    return offsets, end


class StageLink:
    """One stage's endpoint; `bind_host` is where its neighbours reach it. `limits`: (frames,
    bytes) at most per message it receives (`checks.message_limits`). `transport`: auto
    (shared memory with same-host neighbours), tcp, or shm (refuses a neighbour elsewhere);
    `slots`: shared-memory slots per neighbour; `encrypt`: CurveZMQ on every socket (the gate
    admits only the run's client key)."""

    def __init__(self, key: bytes, run_id: str, stage: int, bind_host: str, timeout: float,
                 limits: tuple[int, int], transport: str = "auto", slots: int = 8,
                 encrypt: bool = False):
        self.stage, self.timeout = stage, timeout
        # the kernel's lease on the run (messages.Alive renews it; nbdist.core.liveness)
        self._lease_clock = _TickingClock()
        self.lease = Lease(lease_term(timeout), self.lease_time())
        self.name = f"stage-{stage}"
        self.transport, self.slots = str(transport), max(1, slots)
        self.codec, self._key = Codec(key, self.name, run_id), key
        self.max_frames, self.max_bytes = limits
        self.dropped: Counter[str] = Counter()  # messages refused, by reason
        self.host = host_id()
        self.peers: dict[str, object] = {}
        self.sub = None
        self._dials: dict[str, Dial] = {}  # peer ("kernel" too, "control": the SUB) -> its dial
        self._recent: dict[str, _Recent] = {}  # peer -> the latest frames sent to it
        # peer made again -> the first of its latest messages not sent again yet (`_send_again`)
        self._unsent: dict[str, int] = {}
        self.buffer: dict[tuple, tuple[Wire, list]] = {}  # key -> (message, arrays)
        self.stop_requested = False
        self.released = -1  # the latest epoch the kernel let pass (a fit call's epoch gate)
        self.rate: float | None = None  # the latest rate the kernel set (NewRate, Alive)
        self.new_rate: float | None = None  # run.set_lr's, until the stage takes it
        self.sent_bytes = 0
        # messages with arrays sent to neighbours, by transport
        self.messages = {"shm": 0, "tcp": 0}
        self.shm_peers: set[str] = set()
        self.outboxes: dict[str, _Outbox] = {}  # neighbour -> this stage's segment towards it
        # neighbour -> (name, generation, segment)
        self.inboxes: dict[str, tuple[str, int, object]] = {}
        self._generation = 0
        self.ctx = zmq.Context()
        self.pull, self.gate = server_socket(self.ctx, key, self.max_bytes, encrypt, kind=zmq.PULL,
                                             peers=2)
        self.curve = curve_keys(key)["server_public"].decode() if encrypt else None
        try:
            port = self.pull.bind_to_random_port(f"tcp://{bind_host}")
            self.endpoint = f"tcp://{bind_host}:{port}"
        except BaseException:  # e.g. an address it cannot bind: give back the socket and the gate
            self.close()
            raise

    @property
    def info(self) -> dict:
        """What the neighbours need: where to connect, the gate to pass, and the host (to
        choose shared memory)."""
        return {"endpoint": self.endpoint, "gate": self.gate.id, "host": self.host,
                **({"curve": self.curve} if self.curve else {})}

    def drops(self) -> dict[str, int]:
        """Messages refused, and connections refused or cut at the gate, by reason."""
        return {**self.dropped, **self.gate.counts()}

    def connect(self, neighbours: dict, report: dict, control: dict) -> None:
        """PUSH sockets to the neighbours (`{"stage-1": info, ...}`, each `info` as `self.info`
        gives it) and to the kernel's report socket; a SUB socket on the kernel's control socket
        (`report` and `control` as `kernel_link.KernelLink` gives them). The kernel's lease
        starts now, with no longer first term: the kernel has just started this stage and is
        polling, and one killed before its first `Alive` got here (a slow joiner's first
        broadcasts are lost) must end the run as fast (it took 13 s at --timeout 8)."""
        term = self.lease.term_s
        self.lease = Lease(term, self.lease_time(), first_s=term)
        for name, info in neighbours.items():
            host = info.get("host")
            if self.transport != "tcp" and host == self.host:
                self.shm_peers.add(name)
            elif self.transport == "shm":
                raise ConfigError(f"--transport shm needs every pipeline stage on one host, but "
                                  f"{name} is on {str(host).split(':')[0]} and {self.name} on "
                                  f"{self.host.split(':')[0]}. Use --transport auto.")
        def bounded(sock):
            sock.setsockopt(zmq.LINGER, 2000)
            sock.setsockopt(zmq.SNDHWM, SEND_QUEUE)
            sock.setsockopt(zmq.SNDTIMEO, int(self.timeout * 1000))

        for name, info in {**neighbours, "kernel": report}.items():
            self._dials[name] = Dial(self.ctx, info, self._key, zmq.PUSH, info["endpoint"],
                                     setup=bounded)
            self.peers[name] = self._dials[name].open()
            self._recent[name] = _Recent()
        self._dials["control"] = Dial(self.ctx, control, self._key, zmq.SUB, control["endpoint"],
                                      setup=lambda sock: sock.setsockopt(zmq.SUBSCRIBE, b""))
        self.sub = self._dials["control"].open()

    @property
    def redials(self) -> dict[str, int]:
        """Sockets made again after their connection ended, by peer ("control": the kernel's
        stop and abort)."""
        return {name: dial.redials for name, dial in self._dials.items()}

    def _push(self, to: str, frames: list, wait: bool = True) -> None:
        """Send `frames` to the peer `to` (a neighbour or "kernel"), after making its socket
        again if its connection ended; kept among the latest, to be sent again after a loss.
        `wait=False` (an ack): sent only if there is room now, else dropped and counted; a
        neighbour that has finished reads no more, and waiting for it held a stage until its
        timeout at the end of a run."""
        if self._dials[to].lost():
            self._redial(to)
        try:
            deadline = time.monotonic() + self.timeout
            while True:
                try:
                    if not self._send_again(to):  # nothing new may overtake them
                        raise zmq.Again
                    sent = send_frames(self.peers[to], frames, zmq.DONTWAIT)
                    break
                except zmq.Again:  # its connection lost (nowhere to queue), or its queue full
                    if not wait:
                        self.dropped["not sent: no room"] += 1
                        return
                    self.check_control()  # the kernel's Alive, read while this waits
                    if self.kernel_gone():  # the run is over (a dead kernel): each stage leaves
                        return  # on its own lease, so no waiting on the kernel or a neighbour
                    if time.monotonic() > deadline:
                        raise
                    if self._dials[to].lost():
                        self._redial(to)
                    time.sleep(SEND_RETRY_S)
            self.sent_bytes += sent
            self._recent[to].add(frames, sent)
        except zmq.Again:
            raise TrainingError(
                f"Stage {self.stage} could not send to {to} for {self.timeout:.0f}s: its queue "
                f"of {SEND_QUEUE} messages stayed full (Received: no room), so {to} stopped "
                "reading. Its engine may have stalled or died; see run.error and %nbdist status, "
                "then run the cell again (raise --timeout for very slow stages).") from None

    def _redial(self, to: str) -> None:
        """A new socket to `to` (fresh credentials), and the latest messages sent again."""
        self.peers[to] = self._dials[to].redial()
        self._unsent[to] = 0  # a new socket: all of them, whatever the last one had taken
        self._send_again(to)

    def _send_again(self, to: str) -> bool:
        """After a redial, the latest messages to `to` sent again, in order; False while the
        new socket takes none (not connected yet, lost again, or its peer has left). They are
        tried again at each look at the link and before anything new goes to `to`: the
        receiver drops a message older than one it has as a replay, so a newer message sent
        first would make them lost for good (a stage then waited for one until --timeout).
        Each try goes on from the first not yet sent (the latest are kept unchanged meanwhile:
        nothing new is sent), so a queue smaller than the latest fills and drains in turn."""
        start = self._unsent.get(to)
        if start is None:
            return True
        recent = self._recent[to].frames  # those the receiver had are dropped as replays
        for i in range(start, len(recent)):
            try:
                self.sent_bytes += send_frames(self.peers[to], recent[i], zmq.DONTWAIT)
            except zmq.Again:
                self._unsent[to] = i
                return False
        del self._unsent[to]
        return True

    def check_links(self) -> None:
        """Make again every socket whose connection ended (without waiting)."""
        for name, dial in self._dials.items():
            if dial.lost():
                if name == "control":
                    self.sub = dial.redial()
                else:
                    self._redial(name)
            elif name in self._unsent:
                self._send_again(name)

    def send(self, to: str, message: Wire, arrays=()) -> None:
        """`message` (`messages.Forward`, `Backward`, `Validation` or `End`) to the neighbour
        `to`, from this stage, with `arrays`: in a shared-memory slot when one is free, else
        in frames."""
        arrays = [np.ascontiguousarray(a) for a in arrays]
        table = {} if isinstance(message, End) else {"shapes": [list(a.shape) for a in arrays],
                                                     "dtypes": [a.dtype.str for a in arrays]}
        message = replace(message, src=self.name, **table)
        if arrays and to in self.shm_peers and self._send_shm(to, message, arrays):
            self.messages["shm"] += 1
            return
        if arrays:
            self.messages["tcp"] += 1
        self._push(to, self.codec.encode(message.encode(), arrays, to=to))

    def _send_shm(self, to: str, message: Wire, arrays: list) -> bool:
        """Copy `arrays` into a free slot of the segment towards `to` and send the header alone;
        False (send by TCP) when no slot is free or big enough."""
        offsets, need = _layout(arrays)
        box = self._slot_box(to, need)
        if box is None:
            return False
        slot = box.free.pop()
        base = slot * box.slot_bytes
        for a, off in zip(arrays, offsets, strict=True):
            np.ndarray(a.shape, a.dtype, buffer=box.segment.buf, offset=base + off)[...] = a
        message.shm = Slot(box.segment.name, box.generation, slot, [base + off for off in offsets])
        self._push(to, self.codec.encode(message.encode(), to=to))
        return True

    def _slot_box(self, to: str, need: int) -> _Outbox | None:
        box = self.outboxes.get(to)
        if box is not None and not box.free:
            self.drain()  # acks that have arrived free their slots
        if box is not None and need <= box.slot_bytes:
            return box if box.free else None
        if box is not None and box.busy():
            self.drain()
            if box.busy():
                return None  # a bigger segment only once nothing is in flight in this one
        self._generation += 1
        size = max(need, box.slot_bytes if box else 0)
        try:
            replacement = _Outbox(self.slots, -(-size // PAGE) * PAGE, self._generation)
        except OSError as exc:  # /dev/shm has no room (nbdist.hub.shm.create): TCP from now on
            log.warning("%s -> %s: %s", self.name, to,
                        shm.unavailable(exc, self.slots * -(-size // PAGE) * PAGE))
            self.shm_peers.discard(to)
            return None
        if box is not None:
            shm.release(box.segment, unlink=True)
        self.outboxes[to] = replacement
        return replacement

    def report(self, message: Wire, arrays=()) -> None:
        """A report (`messages.REPORTS`) to the kernel, with `arrays` in frames (`Weights`)."""
        arrays = [np.ascontiguousarray(a) for a in arrays]
        if arrays:
            message = replace(message, shapes=[list(a.shape) for a in arrays],
                              dtypes=[a.dtype.str for a in arrays])
        self._push("kernel", self.codec.encode(message.encode(), arrays, to="kernel"))

    def wait_release(self, epoch: int) -> None:
        """Wait at a fit call's epoch gate until the kernel lets `epoch`'s end pass (its
        callbacks have run), or asks to stop; as long as the kernel is alive (its lease), with
        no other deadline: callbacks may take long."""
        while self.released < epoch and not self.stop_requested:
            self.check_links()
            if self.sub.poll(POLL_MS):
                self.check_control()
            else:
                self.check_lease()

    def wait(self, *keys: tuple) -> tuple[tuple, Wire, list]:
        """The first of `keys` to arrive (kind, step, micro-batch): (key, message, arrays). Fails
        with the neighbour named when nothing comes for `timeout` seconds."""
        deadline = time.monotonic() + self.timeout
        poller = sub = None
        while True:
            self.check_links()
            if sub is not self.sub:  # made again
                sub, poller = self.sub, zmq.Poller()
                poller.register(self.pull, zmq.POLLIN)
                poller.register(sub, zmq.POLLIN)
            for key in keys:
                if key in self.buffer:
                    return (key, *self.buffer.pop(key))
            if time.monotonic() > deadline:
                drops = self.drops()
                raise TrainingError(
                    f"Stage {self.stage} waited {self.timeout:.0f}s for {keys[0][0]} of step "
                    f"{keys[0][1]} from its neighbour and got nothing (Received: no message"
                    f"{f'; refused {drops}' if drops else ''}). The neighbouring stage's engine "
                    "may have died or stalled; see run.error and %nbdist status, then run the cell "
                    "again (raise --timeout for very slow stages).")
            ready = dict(poller.poll(POLL_MS))
            if self.sub in ready:
                self.check_control()
            else:
                self.check_lease()
            if self.pull in ready:
                self._receive()

    def drain(self) -> None:
        """Read every message already here without waiting (acks free slots; the rest wait in
        the buffer)."""
        while self.pull.poll(0):
            self._receive()

    def check_control(self) -> None:
        """Read what the kernel sent without waiting: stop (finish the step), abort (raise),
        the lease, a fit call's epoch gate, a new learning rate."""
        while self.sub.poll(0):
            try:
                msg = self.codec.decode(self.sub.recv_multipart(copy=False, flags=zmq.NOBLOCK))
                control = decode(CONTROLS, msg.header)
            except ProtocolError:
                continue  # addressed to another stage, or not ours
            if isinstance(control, Abort):
                raise StageAborted(control.reason)
            if isinstance(control, Stop):
                self.stop_requested = True
            if isinstance(control, Alive):
                self.lease.renew(self.lease_time())
                self.released = max(self.released, control.released)
                self.stop_requested = self.stop_requested or control.stop
                if control.lr is not None and control.lr != self.rate:
                    self.new_rate = self.rate = control.lr
            if isinstance(control, Release):
                self.released = max(self.released, control.epoch)
            if isinstance(control, NewRate):
                self.new_rate = self.rate = control.lr
        self.check_lease()

    def kernel_gone(self) -> bool:
        """Whether the kernel's lease has lapsed (it is taken for dead, `check_lease`)."""
        return self.lease.lapsed(self.lease_time())

    def lease_time(self) -> float:
        """The stage's running time that the kernel's lease is kept on (gaps count LEASE_GAP_S)."""
        return self._lease_clock.read()

    def check_lease(self) -> None:
        """Once the kernel has been silent past its lease (dead: SIGKILL, a crash, its host
        lost), the run stops as on the kernel's Stop: the first stage ends at its next step and
        tells the next, and every stage returns what it has (so the engines of a connected,
        Slurm or MPI cluster are idle again). A stage still here LEASE_MARGIN_S later (the
        stage before it is gone) leaves at once (StageAborted)."""
        now = self.lease_time()
        if not self.lease.lapsed(now):
            return
        silent = self.lease.silent(now)
        if not self.stop_requested:
            log.warning("%s: the kernel has been silent for %.1fs (its lease: %.1fs, --timeout "
                        "less %gs); taking it for dead and stopping", self.name, silent,
                        self.lease.term_s, LEASE_MARGIN_S)
            self.stop_requested = True
        if silent > self.lease.term_s + LEASE_MARGIN_S:
            raise StageAborted(f"the kernel has been silent for {silent:.1f}s (its lease: "
                               f"{self.lease.term_s:.1f}s); taking it for dead, this stage leaves")

    def _receive(self) -> None:
        """Read one message into the buffer (or, an ack, free its slot). What fails the limits,
        the MAC, the envelope (run, recipient, replay) or the checks is dropped and counted."""
        try:
            msg = self.codec.decode(recv_bounded(self.pull, self.max_frames, self.max_bytes))
            message = stage_message(msg.header, self.peers.keys() - {"kernel"})
            if isinstance(message, Ack):
                self._freed(message)
                return
            if isinstance(message, End):
                arrays = arrays_of([], [], msg.buffers)
            elif message.shm is not None:
                if msg.buffers:
                    raise ProtocolError("malformed header",
                                        "arrays both in shared memory and in frames")
                arrays = self._copy_out(message)
            else:
                arrays = arrays_of(message.shapes, message.dtypes, msg.buffers)
        except ProtocolError as exc:
            self.dropped[exc.reason] += 1
            return
        self.buffer[message.key] = (message, arrays)

    def _freed(self, ack: Ack) -> None:
        """An ack: the slot it names, of this stage's current segment towards its sender, is
        free."""
        box, slot = self.outboxes.get(ack.src), ack.slot
        if box is None or ack.seg != box.segment.name or ack.gen != box.generation \
                or not 0 <= slot < box.slots or slot in box.free:
            raise ProtocolError("stale ack", f"slot {slot!r} of {ack.seg!r} from {ack.src}")
        box.free.append(slot)

    def _copy_out(self, message) -> list:
        """The arrays of a verified shared-memory message, copied out of the sender's slot,
        which is then acknowledged (freed)."""
        src, where = message.src, message.shm
        if not where.seg.startswith("nbdist-"):
            raise ProtocolError("malformed header",
                                f"segment {where.seg!r}, expected an nbdist segment")
        segment = self._segment(src, where.seg, where.gen)
        arrays = [np.ndarray(shape, dtype, buffer=segment.buf, offset=off).copy()
                  for dtype, shape, off in slot_table(message.shapes, message.dtypes,
                                                      where.offsets, segment.size)]
        ack = Ack(self.name, where.seg, where.gen, where.slot)
        # best effort: a slot never acked only sends the sender's later arrays in frames
        self._push(src, self.codec.encode(ack.encode(), to=src), wait=False)
        return arrays

    def _segment(self, src: str, name: str, gen: int):
        """`src`'s segment `name`: the one registered, or a newer generation (which replaces it)."""
        known = self.inboxes.get(src)
        if known is not None and known[0] == name:
            if gen != known[1]:
                raise ProtocolError("stale segment",
                                    f"{name!r} generation {gen}, registered as {known[1]}")
            return known[2]
        if known is not None and gen <= known[1]:
            raise ProtocolError("stale segment", f"{name!r} generation {gen} from {src}, "
                                f"already at generation {known[1]}")
        try:
            segment = shm.attach(name)
        except (OSError, ValueError) as exc:
            raise ProtocolError("bad segment", f"{name!r} cannot be opened ({exc})") from None
        if known is not None:
            shm.release(known[2])
        self.inboxes[src] = (name, gen, segment)
        return segment

    def close(self) -> None:
        self._lease_clock.stop()
        if self.pull is not None:
            self.pull.close(linger=500)
        for dial in self._dials.values():
            dial.close(linger=500)
        self.gate.stop()
        self.ctx.term()
        for _, _, segment in self.inboxes.values():
            shm.release(segment)
        for box in self.outboxes.values():
            shm.release(box.segment, unlink=True)
        self.inboxes, self.outboxes = {}, {}
