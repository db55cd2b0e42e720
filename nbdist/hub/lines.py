"""A signed request/reply line from one process to one hub shard, as the worker's transport
(`nbdist.hub.client`), the kernel's control (`nbdist.hub.control`) and shard 0's write-off
relay (`nbdist.hub.writeoff`) use it: a ZeroMQ DEALER socket (`Line`), or on the shard's host
a Unix socket (`LocalLine`, `nbdist.hub.localline`). It sends typed messages
(`nbdist.wire.messages`) and takes back the reply to its latest request, typed as that
request's `REPLY`; whatever else arrives is dropped and counted by reason.
"""

from __future__ import annotations

import select
import time
from collections import Counter
from collections.abc import Callable
from typing import TypeVar

import zmq

from nbdist.cluster.netaddr import host_id
from nbdist.core.liveness import RunningClock
from nbdist.errors import ProtocolError, TrainingError
from nbdist.hub import localline
from nbdist.hub.dial import Dial
from nbdist.hub.protocol import Codec, Message, send_frames
from nbdist.hub.wire import MAX_FRAMES
from nbdist.wire.messages import Error
from nbdist.wire.schema import Wire

W = TypeVar("W", bound=Wire)

SEND_LOOK_MS = 100  # a send that finds no room looks this often whether the connection was lost
DURING_EVERY_S = 1.0  # how often a wait for a reply calls its `during` (any worker failed?)
# and reads its clock: a wait counts only the time this process ran (nbdist.core.liveness)


class Line:
    """One DEALER socket to one shard: signing, a reply timeout, and replies matched to their
    request (a reply whose `re` is not the last request's seq, from another endpoint, or not
    the message expected, is dropped and counted in `dropped` by reason); `sent` and
    `received` count the bytes of every frame that crossed the socket. After a timeout the
    socket is replaced (a new routing id), so a reply that comes late can never be taken for
    the answer to a later request.

    A line comes back (`nbdist.hub.dial`): when its connection ends (a TCP reset) or the gate
    refuses it, a new socket with new credentials and the same routing id takes its place,
    and the latest request is sent again, the same frames: a hub that had it answers again
    from its cache (its sequence number is not new), one that had not takes it as new, so a
    request is never applied twice. `redials` counts these."""

    def __init__(self, ctx: zmq.Context, endpoint: dict, address: str, codec: Codec, key: bytes,
                 timeout: float, name: str, peer: str):
        self._ctx, self.endpoint, self.address, self._key = ctx, endpoint, address, key
        self.codec, self.timeout_ms, self.name, self.peer = codec, int(timeout * 1000), name, peer
        self.dropped: Counter[str] = Counter()
        self.sent = self.received = 0
        self._last: list = []  # the latest request's frames, sent again after a redial
        self.sock = self._open()

    def _open(self) -> zmq.Socket:
        self._dial = Dial(self._ctx, self.endpoint, self._key, zmq.DEALER, self.address,
                          keep_id=True)
        return self._dial.open()

    @property
    def redials(self) -> int:
        return self._dial.redials

    def reopen(self) -> None:
        """A fresh socket (new routing id): whatever the old one would still receive is lost."""
        redials = self._dial.redials
        self._dial.close()
        self.sock = self._open()
        self._dial.redials = redials

    def send(self, message: Wire, buffers: list | tuple = ()) -> None:
        frames = self.codec.encode(message.encode(), buffers, to=self.peer)
        self._last = frames
        self.sent += self._send_frames(frames)

    def _send_frames(self, frames: list) -> int:
        """Send, waiting up to the line's timeout for room. Only a lost connection (ended, or
        refused again at the gate: it has nowhere to queue) makes the socket again; a full
        queue is a peer that reads slowly or not at all, and making the socket again would
        drop the replies queued for this one, so it waits for room instead."""
        deadline = time.monotonic() + self.timeout_ms / 1000
        while True:
            if self._dial.lost():
                self.sock = self._dial.redial()
            try:
                return send_frames(self.sock, frames, zmq.DONTWAIT)
            except zmq.Again:
                left_ms = int((deadline - time.monotonic()) * 1000)
                if left_ms <= 0:
                    raise TrainingError(
                        f"{self.name} took no request for {self.timeout_ms / 1000:.0f}s: its queue "
                        "stayed full. Its engine may be stopped or overloaded; check `%nbdist "
                        "status`, then run the cell again.") from None
                self._dial.writable(min(left_ms, SEND_LOOK_MS))

    def _receive_frames(self, timeout_ms: int, first: bool = True) -> list | None:
        """One message's frames, or None if none came within `timeout_ms` (`first`: the
        first slice of a wait). A lost connection is made again, and the latest request
        sent again, meanwhile."""
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            state = self._dial.poll(max(0, int((deadline - time.monotonic()) * 1000)))
            if state == "ready":
                return self.sock.recv_multipart(copy=False)
            if state == "lost":
                self.sock = self._dial.redial()
                if self._last:
                    self.sent += send_frames(self.sock, self._last)
            if time.monotonic() >= deadline:
                return None

    def recv(self, expect: type[W], timeout: float | None = None,
             during: Callable[[], None] | None = None,
             clock: Callable[[], float] | None = None) -> tuple[W, Message]:
        """The reply to the latest request, as an `expect` message, and its frames (for the
        buffers); anything else that arrives first is dropped. It waits the line's timeout,
        or `timeout` seconds when given and shorter, calling `during()` about every second
        meanwhile (it may raise to give up the wait). An `Error` reply raises TrainingError.
        The wait is measured on `clock` (default: a `RunningClock` of its own), so time during
        which this process was stopped (a suspend) is not counted against the hub."""
        expected = self.codec.last_sent(self.peer)
        wait_ms = self.timeout_ms if timeout is None else min(self.timeout_ms, int(timeout * 1000))
        if clock is None:
            running = RunningClock()
            clock = lambda: running.read(time.monotonic())  # noqa: E731
        deadline = clock() + wait_ms / 1000
        first = True
        while True:
            left = deadline - clock()
            step = min(left, DURING_EVERY_S)
            frames = self._receive_frames(max(1, int(step * 1000)), first) if left > 0 else None
            first = False
            if frames is None and clock() < deadline:
                if during is not None:
                    during()
                continue
            if frames is None:
                self.reopen()
                raise TrainingError(
                    f"{self.name} did not answer within {wait_ms / 1000:.0f}s. Its engine may "
                    "have died or be overloaded; check `%nbdist status`, then run the cell again."
                )
            self.received += sum(len(f) for f in frames)
            try:
                msg = self.codec.decode(frames)
                if not msg.header["from"].startswith(self.peer + "/"):
                    reason = "wrong sender"
                elif msg.header.get("re") != expected:
                    reason = "unmatched reply"
                else:
                    return self._typed(msg, expect), msg
            except ProtocolError as exc:
                reason = exc.reason
            self.dropped[reason] += 1

    def _typed(self, msg: Message, expect: type[W]) -> W:
        """The reply as the message expected, or ProtocolError ("unexpected op", "malformed
        header"); a hub's `Error` raises TrainingError."""
        if msg.op == Error.OP:
            raise TrainingError(f"{self.name} refused the request: "
                                f"{Error.decode(msg.header).message}")
        if msg.op != expect.OP:
            raise ProtocolError("unexpected op", f"{msg.op!r}, expected {expect.OP!r}")
        return expect.decode(msg.header)

    def request(self, message: Wire, buffers: list | tuple = (), timeout: float | None = None,
                during: Callable[[], None] | None = None,
                clock: Callable[[], float] | None = None) -> tuple[Wire, Message]:
        """Send `message` and return its reply (its class's `REPLY`) and the reply's frames."""
        self.send(message, buffers)
        return self.recv(type(message).REPLY, timeout, during, clock)

    def close(self) -> None:
        self._dial.close()


class LocalLine(Line):
    """A line over a same-host Unix socket (`nbdist.hub.localline`) instead of ZeroMQ: the
    same signed messages, without ZeroMQ's I/O threads in the round trip. With `spin_s` it
    polls for a reply that long before it sleeps (`--spin`, where the hub has a core)."""

    spin_s = 0.0
    redials = 0

    def _open(self) -> localline.Conn:
        try:
            return localline.connect(self.address, self.timeout_ms / 1000)
        except OSError as exc:
            raise self._gone(exc) from None

    def reopen(self) -> None:
        self.sock.close()
        self.sock = self._open()

    def send(self, message: Wire, buffers: list | tuple = ()) -> None:
        self.sent += self._send_frames(self.codec.encode(message.encode(), buffers, to=self.peer))

    def _send_frames(self, frames: list) -> int:
        try:
            return self.sock.send(frames)
        except OSError as exc:
            # the hub's end is closed (it stopped or died), or it stopped reading
            raise self._gone(exc) from None

    def _gone(self, exc: OSError) -> TrainingError:
        return TrainingError(f"{self.name} cannot be reached on its local line {self.address} "
                             f"({exc.strerror or exc}): its engine may have stopped or died. Check "
                             "`%nbdist status`, then run the cell again.")

    def _receive_frames(self, timeout_ms: int, first: bool = True) -> list | None:
        deadline = time.monotonic() + timeout_ms / 1000
        if self.spin_s and first:  # a wait's first slice: the reply of a quick hub comes now
            self._spin(min(deadline, time.monotonic() + self.spin_s))
        while True:
            try:
                frames = self.sock.receive(MAX_FRAMES, max(0.001, deadline - time.monotonic()))
            except TimeoutError:
                return None
            except ProtocolError as exc:
                self.dropped[exc.reason] += 1
                if time.monotonic() < deadline:
                    continue
                return None
            if frames is None:  # the hub closed the line: it has left
                raise TrainingError(f"{self.name} closed its line: its engine may have stopped or "
                                    "died. Check `%nbdist status`, then run the cell again.")
            return frames

    def _spin(self, until: float) -> None:
        """Return once the line is readable, or at `until` (monotonic seconds)."""
        readable = select.poll()
        readable.register(self.sock.fileno(), select.POLLIN)
        while not readable.poll(0) and time.monotonic() < until:
            pass

    def close(self) -> None:
        self.sock.close()


def open_lines(ctx: zmq.Context, key: bytes, shards: list[dict], name: str, timeout: float,
               transport: str = "tcp", spin_s: float = 0.0) -> list[Line]:
    """One line per shard, all signing with one codec named `name` for this run. `transport`
    names the endpoint: "tcp", "ipc" (ZeroMQ), "local" (`nbdist.hub.localline`, which polls
    for `spin_s` before it sleeps), or "auto": ipc to a shard on this host (its gate counts an
    ipc connection as the run's own, `nbdist.hub.gate`), else tcp."""
    codec = Codec(key, name, shards[0].get("run", ""))
    kind = LocalLine if transport == "local" else Line
    here = host_id()
    lines = [kind(ctx, s, s[_endpoint_kind(s, transport, here)], codec, key, timeout,
                  f"hub shard {i}", f"hub-{i}")
             for i, s in enumerate(shards)]
    for line in lines:
        if isinstance(line, LocalLine):
            line.spin_s = spin_s
    return lines


def _endpoint_kind(shard: dict, transport: str, here: str) -> str:
    if transport != "auto":
        return transport
    return "ipc" if shard.get("ipc") and shard.get("host") == here else "tcp"


def choose_line(same_host: bool, shards: list[dict], non_trainable_size: int) -> str:
    """How a worker's messages travel: "tcp" across hosts; on its shards' host a local line
    ("local", `nbdist.hub.localline`) where every shard offers one and every message fits in a
    packet (the non-trainable state travels in them), else ZeroMQ's "ipc"."""
    if not same_host:
        return "tcp"
    fits = 4 * non_trainable_size + 32 * 1024 <= localline.MAX_PACKET_BYTES
    return ("local" if fits and localline.enabled() and all(s.get("local") for s in shards)
            else "ipc")
