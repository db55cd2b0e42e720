"""The gate of every ZeroMQ socket nbdist binds (hub shards, pipeline stages, the kernel's
pipeline sockets): who may finish ZeroMQ's handshake, and how many connections may still be
in it, so that peers without the run's key can make a process hold only a bounded amount.

Why it is needed: libzmq reads a peer's bytes before nbdist sees any of them. Its receive
high-water mark counts whole messages per connection, so a message that never ends (frames
flagged "more", without end) is held whole, however large, and a handshake command may be as
large as a frame (`ZMQ_MAXMSGSIZE`). Neither the MAC nor the number of connections bounded it.

- **Authenticated handshake.** A client finishes the handshake only with a one-time token:
  ZeroMQ's PLAIN mechanism with username `<gate id>:<random nonce>` and password the keyed
  BLAKE3 of the username under the run key (`credentials`). This gate's ZAP handler admits
  each token once, on this gate only, so a token read off the network cannot be used again.
  With `--encrypt`: CurveZMQ, admitting only the run's client key. Until a connection has
  finished its handshake, libzmq hands nothing of it on and holds at most one handshake
  command (up to the socket's frame limit) and its buffers (`CONNECTION_BYTES`).
- **Young connections capped.** libzmq closes a connection that has not finished its
  handshake within `HANDSHAKE_S` (`ZMQ_HANDSHAKE_IVL`), so every older connection holds the
  key. The gate watches accepts, finished handshakes and closes (a socket monitor) and cuts a
  new connection at once when `limit` connections still in their handshake (younger than
  `HANDSHAKE_S`) are already open.
- **A share reserved for the run's planned peers.** Of the `limit` slots, `reserved` are for
  connections from the run's own peers: those that come over an ipc endpoint (its folder is
  0700: only this user reaches it) or from a TCP address in `planned` (the hosts of the run's
  workers and kernel, `Young`). The others, whoever they are, share `limit - reserved` slots,
  so another user holding the young-connection quota (a flood from the same server, or from a
  host outside the run) does not shut the run's own peers out.

So the connections that never authenticate hold at most `limit x (frame limit +
CONNECTION_BYTES)` at any time (docs/security.md gives the figures). The caller sizes
`limit` from the peers it expects (its workers or neighbours) plus `YOUNG_MARGIN`, and
reserves the peers' share where it knows their addresses. Under a flood from a planned
address (another user on a worker's host) a peer connecting for the first time may still be
cut (it then waits for its own timeout): the cap protects memory first.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import queue
import secrets
import socket
import struct
import threading
import time
from collections import Counter

import zmq
from zmq.utils import z85

from nbdist.hub.protocol import mac

HANDSHAKE_S = 3.0  # ZMQ_HANDSHAKE_IVL: a connection that has not authenticated by then is closed
YOUNG_MARGIN = 8  # young connections allowed beyond the expected peers (reopened lines, the kernel)
# what libzmq holds per connection beside a handshake command (measured ~15 KB)
CONNECTION_BYTES = 16 * 1024
POLL_MS = 100
ZAP_ENDPOINT = "inproc://zeromq.zap.01"  # where libzmq asks (RFC 27), one handler per context
CUT = "cut: too many new connections"
REFUSED = "refused at the handshake"


def credentials(key: bytes, gate: str) -> tuple[bytes, bytes]:
    """A fresh one-time (username, password) for the gate named `gate` of this run.

    Example:
        >>> user, password = credentials(bytes(32), "g1")
        >>> user.startswith(b"g1:"), len(password)
        (True, 64)
    """
    username = f"{gate}:{secrets.token_hex(16)}".encode()
    return username, _token(key, username)


def curve_keys(key: bytes) -> dict[str, bytes]:
    """The run's CurveZMQ key pairs, derived from its secret key (so no more secrets travel):
    one for the hubs (server) and one for their clients (workers, kernel). With --encrypt the
    gate admits only the client key."""
    keys = {}
    for role in ("server", "client"):
        secret = z85.encode(hashlib.blake2b(key, person=f"nbdist-{role}".encode()[:16],
                                                      digest_size=32).digest())
        keys[f"{role}_secret"], keys[f"{role}_public"] = secret, zmq.curve_public(secret)
    return keys


def _token(key: bytes, username: bytes) -> bytes:
    return mac(key, b"gate " + username).hex().encode()  # never a JSON header: those start with {


class Young:
    """The open connections still in their handshake (accepted less than `window_s` ago), at
    most `limit` of them, of which connections not `planned` (not from the run's own peers) may
    hold `limit - reserved`. Pure bookkeeping by file descriptor; the clock is the caller's.

    Example:
        >>> young = Young(limit=1, window_s=3.0)
        >>> young.admit(7, now=0.0), young.admit(8, now=1.0), young.admit(9, now=3.5)
        (True, False, True)
        >>> young = Young(limit=3, reserved=2)
        >>> [young.admit(fd, now=0.0) for fd in (1, 2)], young.admit(3, 0.0, planned=True)
        ([True, False], True)
    """

    def __init__(self, limit: int, window_s: float = HANDSHAKE_S, reserved: int = 0):
        self.limit, self.window_s = limit, window_s
        self.reserved = max(0, min(reserved, limit))
        self.open: dict[int, tuple[float, bool]] = {}  # descriptor -> (accepted when, planned)

    def admit(self, fd: int, now: float, planned: bool = False) -> bool:
        """Whether a connection accepted now may stay (if so it is counted until it finishes
        its handshake or is `gone`); `planned`: it comes from one of the run's own peers."""
        if self.count(now) >= self.limit:
            return False
        if not planned and self.count(now, planned=False) >= self.limit - self.reserved:
            return False
        self.open[fd] = (now, planned)
        return True

    def count(self, now: float, planned: bool | None = None) -> int:
        """Connections in their handshake now (`planned`: only those that are, or are not)."""
        return sum(1 for t, p in self.open.values()
                   if now - t < self.window_s and planned in (None, p))

    def gone(self, fd: int) -> None:
        """The connection closed, or finished its handshake (it holds the key)."""
        self.open.pop(fd, None)


class Gate:
    """The ZAP handler and connection monitor of one ZeroMQ context, on a thread of its own.
    `guard(sock, frame_bytes)` before binding a socket; `counts()`: connections refused at the
    handshake and cut; `stop()` before the context is terminated. `id` goes into the
    endpoints that clients are given, for their tokens."""

    def __init__(self, ctx, key: bytes, limit: int, encrypt: bool = False, reserved: int = 0,
                 planned: frozenset[str] = frozenset()):
        self.ctx, self.encrypt, self.id = ctx, encrypt, secrets.token_hex(8)
        self._key, self._spent = key, set()
        self.young = Young(limit, reserved=reserved)
        self.planned = frozenset(planned)  # the TCP addresses of the run's own peers' hosts
        self._counts: Counter[str] = Counter()
        self._client_key = b""
        if encrypt:
            keys = curve_keys(key)
            self._secret, self._client_key = (keys["server_secret"],
                                              z85.decode(keys["client_public"]))
        self._zap = ctx.socket(zmq.REP)
        self._zap.setsockopt(zmq.LINGER, 0)
        self._zap.bind(ZAP_ENDPOINT)
        self._new: queue.Queue = queue.Queue()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"nbdist-gate-{self.id}")
        self._thread.start()

    def __repr__(self) -> str:
        # never the key
        return (f"Gate(id={self.id!r}, limit={self.young.limit}, reserved={self.young.reserved}, "
                f"encrypt={self.encrypt})")

    def guard(self, sock, frame_bytes: int) -> None:
        """Set up `sock` (not yet bound): frames of at most `frame_bytes`, the handshake deadline,
        PLAIN tokens or CurveZMQ checked here, and its accepts and closes watched."""
        sock.setsockopt(zmq.MAXMSGSIZE, int(frame_bytes))
        sock.setsockopt(zmq.HANDSHAKE_IVL, int(HANDSHAKE_S * 1000))
        sock.setsockopt(zmq.ZAP_DOMAIN, b"nbdist")
        if self.encrypt:
            sock.setsockopt(zmq.CURVE_SERVER, 1)
            sock.setsockopt(zmq.CURVE_SECRETKEY, self._secret)
        else:
            sock.setsockopt(zmq.PLAIN_SERVER, 1)
        events = (zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED
                  | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
        self._new.put(sock.get_monitor_socket(events))  # the gate's thread takes it over

    def counts(self) -> dict[str, int]:
        return dict(self._counts)

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(10)

    # -- the gate's thread ------------------------------------------------------------------

    def _run(self) -> None:
        poller, monitors = zmq.Poller(), []
        poller.register(self._zap, zmq.POLLIN)
        try:
            while not self._stopping.is_set():
                while not self._new.empty():
                    monitors.append(self._new.get())
                    poller.register(monitors[-1], zmq.POLLIN)
                ready = dict(poller.poll(POLL_MS))
                for monitor in monitors:  # accepts before the requests they lead to
                    if monitor in ready:
                        self._events(monitor)
                if self._zap in ready:
                    self._requests()
        finally:
            while not self._new.empty():
                monitors.append(self._new.get())
            for sock in [*monitors, self._zap]:
                sock.close(0)

    def _events(self, monitor) -> None:
        while True:
            try:
                head, endpoint = monitor.recv_multipart(zmq.NOBLOCK)[:2]
            except zmq.Again:
                return
            event, value = struct.unpack("=Hi", head)
            if event == zmq.EVENT_ACCEPTED:
                where = endpoint.decode()
                if not self.young.admit(value, time.monotonic(), self._planned(value, where)):
                    _cut(value, where)
                    self._counts[CUT] += 1
            elif event in (zmq.EVENT_DISCONNECTED, zmq.EVENT_HANDSHAKE_SUCCEEDED):
                self.young.gone(value)
            elif event in (zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, zmq.EVENT_HANDSHAKE_FAILED_AUTH):
                # a wrong token or mechanism (not a probe that just left)
                self._counts[REFUSED] += 1

    def _planned(self, fd: int, endpoint: str) -> bool:
        """Whether the connection accepted as `fd` on `endpoint` comes from the run's own peers:
        over ipc (only this user reaches its folder), or from an address in `planned`."""
        if endpoint.startswith("ipc://"):
            return True
        return bool(self.planned) and peer_address(fd) in self.planned

    def _requests(self) -> None:
        while True:
            try:
                request = self._zap.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            ok = len(request) >= 6 and self._admits(request[5], request[6:])
            self._zap.send_multipart([b"1.0", request[1] if len(request) > 1 else b"",
                                      b"200" if ok else b"400", b"OK" if ok else b"refused",
                                      b"nbdist" if ok else b"", b""])

    def _admits(self, mechanism: bytes, credentials: list) -> bool:
        if mechanism == b"CURVE" and self.encrypt:
            return len(credentials) == 1 and hmac.compare_digest(credentials[0], self._client_key)
        if mechanism != b"PLAIN" or self.encrypt or len(credentials) != 2:
            return False
        username, password = credentials
        if not username.startswith(self.id.encode() + b":") or username in self._spent:
            return False
        if not hmac.compare_digest(password, _token(self._key, username)):
            return False
        self._spent.add(username)
        return True


def peer_address(fd: int) -> str | None:
    """The remote IP address of the TCP connection `fd` (None if it is not one any more)."""
    try:
        dup = os.dup(fd)
    except OSError:
        return None
    try:
        conn = socket.socket(fileno=dup)
    except OSError:  # reused for something else than a socket
        os.close(dup)
        return None
    with conn:
        try:
            inet = conn.family in (socket.AF_INET, socket.AF_INET6)
            return str(conn.getpeername()[0]) if inet else None
        except OSError:
            return None


def _cut(fd: int, endpoint: str) -> None:
    """Close the connection libzmq accepted as `fd` on `endpoint`: shut it down through a
    duplicate of the descriptor (libzmq then sees it end and closes it itself), after checking
    that the descriptor still is a connection on that endpoint."""
    try:
        dup = os.dup(fd)
    except OSError:  # already closed by libzmq
        return
    try:
        conn = socket.socket(fileno=dup)
    except OSError:  # reused for something else than a socket
        os.close(dup)
        return
    with conn:
        try:
            local = conn.getsockname()
            ours = (endpoint == f"ipc://{local}" if conn.family == socket.AF_UNIX
                    else endpoint.rsplit(":", 1)[-1] == str(local[1]))
            if ours:
                conn.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
