"""The hub's side of the wire: socket set-up, bounded receiving, typed requests, CurveZMQ.

- `server_socket` sets up the shard's ROUTER (or a pipeline socket) with a low receive
  high-water mark and a per-frame size limit, behind its context's gate (`nbdist.hub.gate`):
  only clients holding the run key finish the handshake (a one-time token, or CurveZMQ with
  `--encrypt`), and connections still in the handshake are capped, so peers without the key
  can make it hold only a bounded amount (docs/security.md). `client_socket` is the other end.
- `recv_bounded` reads one message a frame at a time and refuses it as soon as it has too
  many frames or bytes, dropping the rest without holding it. (libzmq assembles a multipart
  message before delivering it, so `ZMQ_MAXMSGSIZE` bounds each frame and the high-water mark
  the number of queued messages per authenticated peer.)
- `receive` decodes each request as its typed message (`nbdist.wire.messages`), so a signed
  but malformed header is dropped and counted like any other bad message instead of failing
  a handler.
- `Return`: where a reply goes (routing id, the requester's name, the request's `seq`).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Callable, Mapping
from typing import NamedTuple

import zmq

from nbdist.cluster.netaddr import host_id
from nbdist.errors import ProtocolError
from nbdist.hub.gate import YOUNG_MARGIN, Gate, credentials, curve_keys
from nbdist.hub.protocol import Message, no_mark
from nbdist.wire.messages import HUB_REQUESTS, WORKER_REQUESTS, Hello, Step
from nbdist.wire.schema import Wire

RCVHWM = 8  # messages queued per peer: a worker has at most 2 in flight, the kernel 1
MAX_FRAMES = 7  # routing id, signature + header, at most 5 buffers (a sync report has 3)


class Return(NamedTuple):
    """The address of a reply: ROUTER routing id (or the local line it came on), requester's
    sender name, request seq (a tuple: built once per message, a frozen dataclass cost several
    times more)."""

    ident: object
    to: str
    re: int


def recv_bounded(sock, max_frames: int, max_bytes: int) -> list:
    """One whole message from `sock` (zmq.Frame objects), or ProtocolError("oversized ...")
    once it passes `max_frames` frames or `max_bytes` bytes; the rest of it is then read and
    dropped frame by frame, so nothing of it is kept."""
    frame = sock.recv(copy=False)
    frames, total = [frame], len(frame)
    while frame.more:
        frame = sock.recv(copy=False)
        total += len(frame)
        if len(frames) >= max_frames or total > max_bytes:
            frames.clear()
            count = 1
            while frame.more:
                frame = sock.recv(copy=False)
                count += 1
            raise ProtocolError("oversized message",
                                f"more than {max_frames} frames or {max_bytes} bytes ({count} "
                                "more frame(s) dropped unread)")
        frames.append(frame)
    return frames


class Inbox:
    """Where a hub's next message comes from: its ZeroMQ socket, or a same-host line
    (`nbdist.hub.localline`, accepted from `listener`). One poll can serve several messages:
    each `next` takes one from a source the last poll found ready. With `spin_s`, it polls
    without waiting for up to that long before it sleeps (`--spin`: a sleeping hub must be woken,
    which on a busy small machine costs a worker's round trip more than the hub's work)."""

    def __init__(self, sock, listener, max_bytes: int, spin_s: float = 0.0):
        self.sock, self.listener, self.max_bytes, self.spin_s = sock, listener, max_bytes, spin_s
        self._poller = zmq.Poller()
        self._poller.register(sock, zmq.POLLIN)
        if listener is not None:
            self._poller.register(listener.fileno(), zmq.POLLIN)
        self._lines: dict[int, object] = {}  # file descriptor -> localline.Conn
        self._ready: list = []

    def next(self, timeout_ms: int) -> tuple[list, object]:
        """(frames, reply address): the frames after ZeroMQ's routing id and that id, or a
        line's frames and the line. zmq.Again if nothing came within `timeout_ms`;
        ProtocolError for a message refused before its signature is read."""
        while True:
            if not self._ready and self.spin_s:
                self._ready = self._spin()
            if not self._ready:
                self._ready = [source for source, _ in self._poller.poll(timeout_ms)]
                if not self._ready:
                    raise zmq.Again()
            source = self._ready.pop()
            if source is self.sock:
                frames = recv_bounded(self.sock, MAX_FRAMES, self.max_bytes)
                return frames[1:], frames[0]
            if self.listener is not None and source == self.listener.fileno():
                for line in self.listener.accept():
                    self._lines[line.fileno()] = line
                    self._poller.register(line.fileno(), zmq.POLLIN)
                continue
            line = self._lines.get(source)
            if line is None:  # closed since the poll
                continue
            try:
                frames = line.receive(MAX_FRAMES - 1)
            except TimeoutError:  # readable, then nothing: try the next source
                continue
            if frames is None:  # the peer closed it (a worker that left or died)
                self._forget(line)
                continue
            return frames, line

    def _spin(self) -> list:
        """The sources ready within `spin_s`, polled without sleeping; [] if none."""
        end = time.monotonic() + self.spin_s
        while True:
            ready = [source for source, _ in self._poller.poll(0)]
            if ready or time.monotonic() >= end:
                return ready

    def _forget(self, line) -> None:
        self._poller.unregister(line.fileno())
        del self._lines[line.fileno()]
        self.listener.drop(line)


def receive(inbox: Inbox, timeout_ms: int, codec, num_workers: int, links: Mapping,
            mark: Callable[[str], None] = no_mark) -> tuple[Wire, Message, Return]:
    """The next request in a hub's inbox, typed, with its frames and where its reply goes; or
    ProtocolError: the limits first, then the MAC, run, recipient and sequence number
    (`codec.decode`), then the op and every field (`nbdist.wire.messages`), then the worker's
    id, incarnation and shared-memory segment (`check_link`)."""
    frames, address = inbox.next(timeout_ms)
    mark("recv")  # the phase clock (nbdist.hub.profile)
    msg = codec.decode(frames, mark)
    kind = HUB_REQUESTS.get(msg.op)
    if kind is None:
        raise ProtocolError("unknown op", f"{msg.op!r}")
    request = kind.decode(msg.header)
    if isinstance(request, WORKER_REQUESTS):
        check_link(links, request, msg.header["from"], num_workers)
    return request, msg, Return(address, msg.header["from"], msg.header["seq"])


def check_link(links: Mapping, request, sender: str, num_workers: int) -> None:
    """A worker's message names a worker of the run, and after its hello comes from the
    incarnation that said it: each process signs as its own sender (`Codec.sender`, a random
    suffix), so a late message of an earlier process with the same worker id (one that
    restarted and said hello again) is dropped, over TCP as over shared memory. A step over
    shared memory also names its segment's generation (its unique name): one that names
    another segment than the one its worker registered is dropped."""
    worker = request.worker
    if not 0 <= worker < num_workers:
        raise ProtocolError("malformed header",
                            f"wrong type or value of worker={worker} (0..{num_workers - 1})")
    if type(request) is Hello:
        return
    link = links.get(worker)
    known = getattr(link, "sender", None)
    if known is not None and sender != known:
        raise ProtocolError("stale incarnation", f"worker {worker}'s message comes from "
                            f"{sender!r}, it said hello as {known!r}")
    segment = getattr(link, "segment", None)
    exchange = type(request) is Step and (request.push or request.pull)
    if exchange and segment is not None and request.seg != segment.name:
        raise ProtocolError("stale segment", f"the step names {request.seg!r}, the worker "
                            f"registered {segment.name!r}")


# -- sockets -----------------------------------------------------------------------------------


def server_socket(ctx, key: bytes, max_frame_bytes: int, encrypt: bool, kind: int | None = None,
                  peers: int = 1, gate=None, planned: list[str] | None = None):
    """A socket to bind (a shard's ROUTER by default), set up before it binds: the receive
    high-water mark, frames of at most `max_frame_bytes`, and behind this context's gate
    (`nbdist.hub.gate`: one-time tokens, or with `encrypt` CurveZMQ admitting only the run's
    client key; young connections capped from the `peers` expected, and with `planned` (the
    TCP addresses of those peers' hosts) their share reserved for them: connections from
    elsewhere get YOUNG_MARGIN slots). Returns (socket, gate);
    pass `gate` to put a second socket of the same context behind it."""
    sock = ctx.socket(zmq.ROUTER if kind is None else kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVHWM, RCVHWM)
    if sock.type == zmq.ROUTER:  # a reply it cannot queue raises, never vanishes
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        # a client that comes back after a reset keeps its routing id (nbdist.hub.dial): its new
        # connection takes the id over, even before this side has seen the old one end
        sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
    gate = gate or Gate(ctx, key, limit=peers + YOUNG_MARGIN, encrypt=encrypt,
                        reserved=0 if planned is None else peers,
                        planned=frozenset(planned or ()))
    gate.guard(sock, max_frame_bytes)
    return sock, gate


def socket_folder(spec) -> str:
    """A new folder for the shard's socket files (its ipc socket and same-host line): created
    0700 under a random name, so no other user can connect to them, guess where they are, or
    stop the hub by leaving something at its path."""
    return tempfile.mkdtemp(prefix=f"nbdist-{spec.run_id}-{spec.shard}-")


def local_path(folder: str) -> str:
    """Where the shard's same-host line listens (`nbdist.hub.localline`), in its `socket_folder`."""
    return os.path.join(folder, "line")


def bind(sock, spec, folder: str, listener=None, **extra) -> dict:
    """Bind the shard's socket on TCP (spec.bind_host) and ipc (in its `socket_folder`); returns
    its endpoints, which name the run, the same-host line's path if it has a `listener`, and
    (with --encrypt) the server's public key."""
    port = sock.bind_to_random_port(f"tcp://{spec.bind_host}")
    ipc = os.path.join(folder, "ipc")
    sock.bind(f"ipc://{ipc}")
    endpoints = {"tcp": f"tcp://{spec.bind_host}:{port}", "ipc": f"ipc://{ipc}",
                 "host": host_id(), "run": spec.run_id, **extra}
    if listener is not None:
        endpoints["local"] = listener.path
    if spec.encrypt:
        endpoints["curve"] = curve_keys(spec.key)["server_public"].decode()
    return endpoints


def remove_socket_files(endpoints: Mapping, folder: str | None = None) -> None:
    """Unlink the files a hub's `endpoints` name (its ipc socket and same-host line) and their
    `socket_folder` (or `folder`, when the hub failed before it had endpoints), where they are
    left: by the hub when it closes, by its supervisor when it was killed."""
    for key, scheme in (("ipc", "ipc://"), ("local", "")):
        path = endpoints.get(key, "").removeprefix(scheme)
        if path:
            with contextlib.suppress(OSError):
                os.unlink(path)
            folder = folder or os.path.dirname(path)
    if folder and os.path.basename(folder).startswith("nbdist-"):
        with contextlib.suppress(OSError):
            os.rmdir(folder)  # only once empty


def client_socket(ctx, endpoint: dict | str, key: bytes, kind: int):
    """A client socket for a bound socket's `endpoint` dict: CurveZMQ when it names a server
    key, else a one-time token for its gate (`nbdist.hub.gate.credentials`)."""
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    if isinstance(endpoint, dict) and endpoint.get("curve"):
        keys = curve_keys(key)
        sock.setsockopt(zmq.CURVE_SERVERKEY, endpoint["curve"].encode())
        sock.setsockopt(zmq.CURVE_SECRETKEY, keys["client_secret"])
        sock.setsockopt(zmq.CURVE_PUBLICKEY, keys["client_public"])
    elif isinstance(endpoint, dict) and endpoint.get("gate"):
        username, password = credentials(key, endpoint["gate"])
        sock.setsockopt(zmq.PLAIN_USERNAME, username)
        sock.setsockopt(zmq.PLAIN_PASSWORD, password)
    return sock
