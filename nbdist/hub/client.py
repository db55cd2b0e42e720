"""The two clients of the hub: a worker's transport, and the kernel's control line.

`WorkerTransport` moves one flat gradient buffer to every shard and one flat parameter buffer
back per step. On the same host it uses one shared segment `[gradient | parameters]` that
every shard reads and writes at its own offset, so only signed headers cross ZeroMQ; across
hosts the slices travel as zero-copy frames over TCP. No TensorFlow here: benchmarks drive it
with NumPy.
"""

from __future__ import annotations

import contextlib
import json
import select
import threading
import time
from collections import Counter
from collections.abc import Callable

import numpy as np
import zmq

from nbdist.cluster.netaddr import check_reachable
from nbdist.core import compression
from nbdist.engine.gpu import GpuMonitor
from nbdist.errors import ProtocolError, TrainingError
from nbdist.hub import localline, shm
from nbdist.hub.memory import reuse_large_buffers
from nbdist.hub.protocol import Codec, Message, send_frames
from nbdist.hub.wire import MAX_FRAMES, client_socket

DURING_EVERY_S = 1.0  # how often a wait for a reply calls its `during` (any worker failed?)


class _Line:
    """One DEALER socket to one shard: signing, a reply timeout, and replies matched to their
    request (a reply whose `re` is not the last request's seq, or from another endpoint, is
    dropped and counted in `dropped`); `sent` and `received` count the bytes of every frame
    that crossed the socket. After a timeout the socket is replaced, so a reply
    that comes late can never be taken for the answer to a later request."""

    def __init__(self, ctx: zmq.Context, endpoint: dict, address: str, codec: Codec, key: bytes,
                 timeout: float, name: str, peer: str):
        self._ctx, self.endpoint, self.address, self._key = ctx, endpoint, address, key
        self.codec, self.timeout_ms, self.name, self.peer = codec, int(timeout * 1000), name, peer
        self.dropped: Counter[str] = Counter()
        self.sent = self.received = 0
        self.sock = self._open()

    def _open(self) -> zmq.Socket:
        sock = client_socket(self._ctx, self.endpoint, self._key, zmq.DEALER)
        sock.connect(self.address)
        return sock

    def reopen(self) -> None:
        """A fresh socket (new routing id): whatever the old one would still receive is lost."""
        self.sock.close(0)
        self.sock = self._open()

    def send(self, header: dict, buffers: list | tuple = ()) -> None:
        self.sent += self._send_frames(self.codec.encode(header, buffers, to=self.peer))

    def _send_frames(self, frames: list) -> int:
        return send_frames(self.sock, frames)

    def _receive_frames(self, timeout_ms: int) -> list | None:
        """One message's frames, or None if none came within `timeout_ms`."""
        return self.sock.recv_multipart(copy=False) if self.sock.poll(timeout_ms) else None

    def recv(self, timeout: float | None = None,
             during: Callable[[], None] | None = None) -> Message:
        """The reply to the latest request; anything else that arrives first is dropped. It
        waits the line's timeout, or `timeout` seconds when given and shorter, calling
        `during()` about every second meanwhile (it may raise to give up the wait)."""
        expected = self.codec.last_sent(self.peer)
        wait_ms = self.timeout_ms if timeout is None else min(self.timeout_ms, int(timeout * 1000))
        deadline = time.monotonic() + wait_ms / 1000
        while True:
            left = deadline - time.monotonic()
            step = left if during is None else min(left, DURING_EVERY_S)
            frames = self._receive_frames(max(1, int(step * 1000))) if left > 0 else None
            if frames is None and during is not None and time.monotonic() < deadline:
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
            except ProtocolError as exc:
                self.dropped[str(exc).split(":")[0]] += 1
                continue
            if not msg.header["from"].startswith(self.peer + "/"):
                self.dropped["wrong sender"] += 1
            elif msg.header.get("re") != expected:
                self.dropped["unmatched reply"] += 1
            else:
                break
        if msg.op == "error":
            raise TrainingError(f"{self.name} refused the request: {msg.header.get('message')}")
        return msg

    def request(self, header: dict, buffers: list | tuple = (), timeout: float | None = None,
                during: Callable[[], None] | None = None) -> Message:
        self.send(header, buffers)
        return self.recv(timeout, during)

    def close(self) -> None:
        self.sock.close(0)


class _LocalLine(_Line):
    """A line over a same-host Unix socket (`nbdist.hub.localline`) instead of ZeroMQ: the
    same signed messages, without ZeroMQ's I/O threads in the round trip. With `spin_s` it
    polls for a reply that long before it sleeps (`--spin`, where the hub has a core)."""

    spin_s = 0.0

    def _open(self) -> localline.Conn:
        try:
            return localline.connect(self.address, self.timeout_ms / 1000)
        except OSError as exc:
            raise self._gone(exc) from None

    def reopen(self) -> None:
        self.sock.close()
        self.sock = self._open()

    def _send_frames(self, frames: list) -> int:
        try:
            return self.sock.send(frames)
        except OSError as exc:  # the hub's end is closed (it stopped or died), or it stopped reading
            raise self._gone(exc) from None

    def _gone(self, exc: OSError) -> TrainingError:
        return TrainingError(f"{self.name} cannot be reached on its local line {self.address} "
                             f"({exc.strerror or exc}): its engine may have stopped or died. Check "
                             "`%nbdist status`, then run the cell again.")

    def _receive_frames(self, timeout_ms: int) -> list | None:
        deadline = time.monotonic() + timeout_ms / 1000
        if self.spin_s:
            self._spin(min(deadline, time.monotonic() + self.spin_s))
        while True:
            try:
                frames = self.sock.receive(MAX_FRAMES, max(0.001, deadline - time.monotonic()))
            except TimeoutError:
                return None
            except ProtocolError as exc:
                self.dropped[str(exc).split(":")[0]] += 1
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
               transport: str = "tcp", spin_s: float = 0.0) -> list[_Line]:
    """One line per shard, all signing with one codec named `name` for this run. `transport`
    names the endpoint: "tcp", "ipc" (ZeroMQ) or "local" (`nbdist.hub.localline`, which polls
    for `spin_s` before it sleeps)."""
    codec = Codec(key, name, shards[0].get("run", ""))
    kind = _LocalLine if transport == "local" else _Line
    lines = [kind(ctx, s, s[transport], codec, key, timeout, f"hub shard {i}", f"hub-{i}")
             for i, s in enumerate(shards)]
    for line in lines:
        if isinstance(line, _LocalLine):
            line.spin_s = spin_s
    return lines


def choose_line(same_host: bool, shards: list[dict], non_trainable_size: int) -> str:
    """How a worker's messages travel: "tcp" across hosts; on its shards' host a local line
    ("local", `nbdist.hub.localline`) where every shard offers one and every message fits in a
    packet (the non-trainable state travels in them), else ZeroMQ's "ipc"."""
    if not same_host:
        return "tcp"
    fits = 4 * non_trainable_size + 32 * 1024 <= localline.MAX_PACKET_BYTES
    return "local" if fits and localline.enabled() and all(s.get("local") for s in shards) else "ipc"


class WorkerTransport:
    """A worker's connection to all hub shards.

    `grad` is where the worker writes its flat gradient before `step(push=True)`; after a
    pull, `params` holds the flat parameters and `non_trainable` the merged non-trainable state.
    Shard 0 hears, in each step's header, the bytes that crossed this worker's sockets so far
    (`traffic`), and every few seconds the GPU's load (`nbdist.engine.gpu`).
    """

    def __init__(self, key: bytes, worker: int, shards: list[dict], non_trainable_size: int,
                 transport: str = "auto", timeout: float = 120.0, engine: int | None = None,
                 compression: str = "none", spin_s: float = 0.0):
        self.worker, self.engine = worker, engine
        self.bounds = []
        start = 0
        for s in shards:
            self.bounds.append((start, start + s["size"]))
            start += s["size"]
        self.total = start
        here = shm.host_id()
        self.use_shm = transport != "tcp" and all(s["host"] == here for s in shards)
        if transport == "shm" and not self.use_shm:
            raise TrainingError("transport 'shm' needs every hub shard on this worker's host; use 'auto'.")
        self.compression = "none" if self.use_shm else compression  # shared memory: no bytes to save
        if not self.use_shm:  # across hosts: a host that does not answer fails here, named
            for i, s in enumerate(shards):
                address, port = s["tcp"].rsplit("/", 1)[-1].rsplit(":", 1)
                check_reachable(address, int(port), f"hub shard {i}", s["host"].split(":")[0])
            reuse_large_buffers(4 * max(hi - lo for lo, hi in self.bounds))  # see nbdist.hub.memory
        self._ctx = zmq.Context()
        self.line_kind = choose_line(self.use_shm, shards, non_trainable_size)
        self.lines = open_lines(self._ctx, key, shards, f"worker-{worker}", timeout, self.line_kind, spin_s)
        self._segment = shm.create(8 * self.total) if self.use_shm else None
        if self._segment is not None:
            self.grad = shm.floats(self._segment, 0, self.total)
            self.params = shm.floats(self._segment, self.total, self.total)
        else:
            self.grad = np.zeros(self.total, dtype=np.float32)
            self.params = np.zeros(self.total, dtype=np.float32)
        self._live = [None] * len(shards)  # hogwild: attached hub segments, read without lock
        self._live_names = [s["params_shm"] for s in shards]
        self.non_trainable = np.zeros(non_trainable_size, dtype=np.float32)
        self.nt_delta = np.zeros(non_trainable_size, dtype=np.float32)
        self.link = "shm" if self.use_shm else "tcp"  # shm: only headers cross ZeroMQ
        self.gpu = GpuMonitor()

    def hello(self, host_info: dict | None = None) -> dict:
        """Register with every shard and pull the parameters; returns shard 0's reply header."""
        for i, line in enumerate(self.lines):
            header = {"op": "hello", "worker": self.worker, "engine": self.engine,
                      "host": shm.host_id().split(":")[0], "compression": self.compression,
                      "link": self.link, **self.gpu.info(), **(host_info or {})}
            if self._segment is not None:
                header.update(shm=self._segment.name, offset=self.bounds[i][0], total=self.total)
            line.send(header)
        return self._collect(pull=True)

    def step(self, header: dict, push: bool, pull: bool, shared: dict | None = None) -> dict:
        """Push `grad` (and `nt_delta`) and/or pull; returns shard 0's reply header.

        `header` goes to shard 0 (the coordinator); `shared` fields to every shard."""
        self.send_step(header, push, pull, shared)
        return self.receive_step(push, pull)

    def send_step(self, header: dict, push: bool, pull: bool, shared: dict | None = None) -> None:
        """First half of `step`: send to every shard (used alone to overlap with compute)."""
        if not push and not pull:  # a bare wait: only the coordinator has anything to say
            self.lines[0].send({"op": "step", "worker": self.worker, **(shared or {}), **header})
            return
        for i, line in enumerate(self.lines):
            buffers = []
            if push and self._segment is None:
                lo, hi = self.bounds[i]
                buffers.append(compression.encode(self.grad[lo:hi], self.compression))
            if push and i == 0 and self.nt_delta.size:
                buffers.append(self.nt_delta)
            shard_header = {"op": "step", "worker": self.worker, "push": push, "pull": pull, **(shared or {})}
            if self._segment is not None:  # the segment's generation: a stale one is never read
                shard_header["seg"] = self._segment.name
            if i == 0:
                shard_header.update(header, traffic=self.traffic(), **self.gpu.sample())
            line.send(shard_header, buffers)

    def traffic(self) -> list[int]:
        """[bytes sent, bytes received] so far over TCP, then over the shared-memory link's
        sockets (headers only: the arrays go through the segment). A push carries the totals
        before itself, so the hub's figures lag by one message."""
        sent, received = sum(line.sent for line in self.lines), sum(line.received for line in self.lines)
        return [sent, received, 0, 0] if self.link == "tcp" else [0, 0, sent, received]

    def receive_step(self, push: bool, pull: bool) -> dict:
        """Second half of `step`: the replies; returns shard 0's header."""
        if not push and not pull:
            return self.lines[0].recv().header
        return self._collect(pull=pull)

    def _collect(self, pull: bool) -> dict:
        first = None
        for i, line in enumerate(self.lines):
            msg = line.recv()
            if pull and not msg.header.get("lost"):  # a worker written off gets no parameters
                lo, hi = self.bounds[i]
                where = msg.header.get("params")
                if where == "live":
                    np.copyto(self.params[lo:hi], self._live_view(i))
                elif where == "shm":
                    if msg.header.get("seg") != self._segment.name:
                        raise TrainingError(f"hub shard {i} wrote the parameters into segment "
                                            f"{msg.header.get('seg')!r}, not this worker's "
                                            f"{self._segment.name!r}; it has a stale registration. "
                                            "Run the cell again.")
                else:
                    compression.decode_into(msg.buffers[0], self.compression, self.params[lo:hi])
                if i == 0 and self.non_trainable.size:
                    np.copyto(self.non_trainable, msg.floats(len(msg.buffers) - 1))
            if i == 0:
                first = msg.header
        return first

    def _live_view(self, i: int) -> np.ndarray:
        if self._live[i] is None:
            self._live[i] = shm.attach(self._live_names[i])
        lo, hi = self.bounds[i]
        return shm.floats(self._live[i], 0, hi - lo)

    def bye(self) -> None:
        for line in self.lines:
            with contextlib.suppress(TrainingError):
                line.request({"op": "bye", "worker": self.worker})

    def close(self) -> None:
        for line in self.lines:
            line.close()
        self._ctx.term()
        self.grad = self.params = None
        for seg in self._live:
            shm.release(seg)
        shm.release(self._segment, unlink=True)


PER_SHARD = ("lr", "option", "stop", "lost", "add_worker")


class HubControl:
    """The kernel's line to every shard: statistics, control, final parameters. Thread-safe."""

    def __init__(self, key: bytes, shards: list[dict], timeout: float = 30.0, name: str = "kernel"):
        self._ctx = zmq.Context()
        self.lines = open_lines(self._ctx, key, shards, name, timeout)
        self._lock = threading.Lock()
        self.closed = False
        if len(shards) > 1 and name == "kernel":  # shard 0 tells the others of write-offs
            self.lines[0].request({"op": "peers", "shards": shards[1:]})

    @property
    def dropped(self) -> Counter[str]:
        """Replies dropped on this side (forged, replayed, late, from the wrong endpoint)."""
        return sum((line.dropped for line in self.lines), Counter())

    def stats(self, since: int = 0, timeline: bool = False, timeout: float | None = None,
              during: Callable[[], None] | None = None) -> dict:
        """Statistics with history rows from `since` on (and the whole timeline if asked);
        `timeout`: wait at most this long for them (the lines' own timeout if longer), calling
        `during()` about every second meanwhile (`_Line.recv`)."""
        with self._lock:
            msg = self.lines[0].request({"op": "stats", "since": since, "timeline": timeline},
                                        timeout=timeout, during=during)
        return json.loads(bytes(msg.buffers[0]))

    def cap_timeout(self, seconds: float) -> None:
        """From now on no request waits longer than `seconds` (a run that is ending in failure
        may be talking to a hub that is gone)."""
        for line in self.lines:
            line.timeout_ms = min(line.timeout_ms, int(seconds * 1000))

    def control(self, **changes: object) -> None:
        """What every shard applies (lr, rule options, stop) goes to all; the rest to shard 0."""
        with self._lock:
            if self.closed:  # the run ended between the caller's check and this call
                raise TrainingError("The run has ended; there is nothing to control. Start a new run.")
            for i, line in enumerate(self.lines):
                fields = changes if i == 0 else {k: v for k, v in changes.items() if k in PER_SHARD}
                if fields:
                    line.request({"op": "control", **fields})

    def params(self) -> tuple[np.ndarray, np.ndarray]:
        """The full flat parameter vector and the non-trainable state."""
        with self._lock:
            self._check_open()
            msgs = [line.request({"op": "params"}) for line in self.lines]
        flat = np.concatenate([m.floats(0) for m in msgs])
        return flat, msgs[0].floats(1).copy()

    def state(self) -> list[tuple[dict, list[np.ndarray]]]:
        """Every shard's checkpoint state: (header, arrays named by header['names'])."""
        with self._lock:
            self._check_open()
            msgs = [line.request({"op": "state"}) for line in self.lines]
        return [(m.header, [m.floats(i).copy() for i in range(len(m.buffers))]) for m in msgs]

    def _check_open(self) -> None:
        """Fail at once after `shutdown`: no hub answers any more (instead of after a timeout)."""
        if self.closed:
            raise TrainingError("The run has ended and its hubs are gone; its final weights are in "
                                "the notebook's model.")

    def shutdown(self) -> None:
        with self._lock:
            for line in self.lines:
                with contextlib.suppress(TrainingError):
                    line.request({"op": "shutdown"})
            self.closed = True  # nothing is served any more: a later request fails at once

    def close(self) -> None:
        with self._lock:  # never under a control() from another thread (the notebook's)
            self.closed = True
            for line in self.lines:
                line.close()
        self._ctx.term()
