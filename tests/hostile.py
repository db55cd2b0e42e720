"""Peers without the run's key, for the hostile-peer tests and `benchmarks/flood.py`.

Raw peers speak ZeroMQ's wire protocol (ZMTP 3) by hand over plain TCP sockets, so they can do
what libzmq itself never does: stop in the middle of a frame, or send a multipart message that
never ends. They read the server's greeting and answer with its security mechanism, as an
attacker who knows nbdist would. Each flood runs in a process of its own (`Flood`), so the
server's memory is measured apart from the attacker's:

- `pending`: `peers` connections, each announcing one handshake command of `frame_bytes` and
  sending all of it but the last KB, then waiting; reconnects when the server closes it;
- `multipart`: one connection that finishes the handshake if the server lets it (NULL) and
  then sends frames flagged "more" without end, up to `limit` bytes;
- `garbage`: `peers` connections sending random bytes instead of a greeting;
- `keyless`: `peers` ZeroMQ sockets without credentials, each queuing `messages` messages of
  `frames` frames of `frame_bytes` (libzmq's own client, as a careless or curious user).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import selectors
import socket
import struct
import time

SIGNATURE = b"\xff" + b"\0" * 8 + b"\x7f"
GREETING_BYTES = 64
CHUNK = 256 * 1024


def frame_header(size: int, more: bool = False, command: bool = False) -> bytes:
    """A ZMTP 3 frame header: flags (more, long, command) and the size."""
    flags = (0x01 if more else 0) | (0x04 if command else 0)
    if size < 256:
        return bytes([flags, size])
    return bytes([flags | 0x02]) + struct.pack(">Q", size)


def command(name: bytes, body: bytes = b"") -> bytes:
    payload = bytes([len(name)]) + name + body
    return frame_header(len(payload), command=True) + payload


def ready(socket_type: bytes) -> bytes:
    """The NULL mechanism's READY command."""
    key, value = b"Socket-Type", socket_type
    return command(b"READY", bytes([len(key)]) + key + struct.pack(">I", len(value)) + value)


def hello_plain(username: bytes = b"intruder", password: bytes = b"guess") -> bytes:
    """The PLAIN mechanism's HELLO command, with credentials that are not the run's."""
    return command(b"HELLO", bytes([len(username)]) + username + bytes([len(password)]) + password)


class _Conn:
    """One raw connection's state: what is left to send once the greetings are exchanged."""

    def __init__(self, sock: socket.socket):
        self.sock, self.inbox, self.greeted = sock, b"", False
        self.out: list = [memoryview(SIGNATURE + b"\x03")]  # up to the major version, then wait
        self.body_left = 0  # zero bytes still to stream (a frame's body)


class _Raw:
    """A selector loop over raw connections to (host, port) of one `kind` (see the module)."""

    def __init__(self, kind: str, host: str, port: int, peers: int, frame_bytes: int, limit: int,
                 socket_type: bytes):
        self.kind, self.address, self.peers = kind, (host, port), peers
        self.frame_bytes, self.limit, self.socket_type = frame_bytes, limit, socket_type
        self.selector = selectors.DefaultSelector()
        self.zeros = memoryview(bytes(CHUNK))
        self.stats = {"connections": 0, "closed by the server": 0, "bytes sent": 0}

    def open(self) -> None:
        sock = socket.socket()
        sock.setblocking(False)
        sock.connect_ex(self.address)
        conn = _Conn(sock)
        if self.kind == "garbage":
            conn.out, conn.greeted = [memoryview(os.urandom(4096))], True
        self.selector.register(sock, selectors.EVENT_READ | selectors.EVENT_WRITE, conn)
        self.stats["connections"] += 1

    def run(self, stop) -> dict:
        for _ in range(self.peers):
            self.open()
        while not stop.is_set() and self.stats["bytes sent"] < self.limit:
            for key, events in self.selector.select(0.05):
                conn = key.data
                try:
                    if events & selectors.EVENT_READ:
                        self._read(conn)
                    if events & selectors.EVENT_WRITE:
                        self._write(conn)
                except OSError:
                    self._lost(conn)
        return self.stats

    def _read(self, conn: _Conn) -> None:
        data = conn.sock.recv(65536)
        if not data:
            raise ConnectionResetError
        if conn.greeted:
            return  # whatever the server says after the greeting (READY, ERROR) is ignored
        conn.inbox += data
        if len(conn.inbox) >= GREETING_BYTES:
            mechanism = conn.inbox[12:32]
            conn.greeted = True
            conn.out.append(memoryview(b"\x00" + mechanism + b"\x00" + b"\0" * 31))
            self._payload(conn, mechanism.rstrip(b"\0"))
            self.selector.modify(conn.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, conn)

    def _payload(self, conn: _Conn, mechanism: bytes) -> None:
        if self.kind == "pending":  # one handshake command that never ends
            conn.out.append(memoryview(frame_header(self.frame_bytes, command=True)))
            conn.body_left = max(0, self.frame_bytes - 1024)
        elif self.kind == "multipart":
            first = ready(self.socket_type) if mechanism == b"NULL" else hello_plain()
            conn.out.append(memoryview(first))
            conn.body_left = -1  # frames flagged "more", without end

    def _write(self, conn: _Conn) -> None:
        if not conn.out and conn.body_left == -1:
            conn.out.append(memoryview(frame_header(CHUNK, more=True)))
            conn.out.append(self.zeros)
        elif not conn.out and conn.body_left > 0:
            conn.out.append(self.zeros[:min(CHUNK, conn.body_left)])
            conn.body_left -= len(conn.out[-1])
        if not conn.out:
            self.selector.modify(conn.sock, selectors.EVENT_READ, conn)  # idle: hold what was sent
            return
        sent = conn.sock.send(conn.out[0])
        self.stats["bytes sent"] += sent
        conn.out[0] = conn.out[0][sent:]
        if not len(conn.out[0]):
            conn.out.pop(0)

    def _lost(self, conn: _Conn) -> None:
        self.selector.unregister(conn.sock)
        conn.sock.close()
        self.stats["closed by the server"] += 1
        if self.kind != "multipart":
            self.open()  # a persistent attacker comes back at once

    def close(self) -> None:
        for key in list(self.selector.get_map().values()):
            key.fileobj.close()
        self.selector.close()


def _keyless(endpoint: str, peers: int, messages: int, frames: int, frame_bytes: int, kind: int,
             stop) -> dict:
    import zmq

    ctx = zmq.Context()
    blob = bytes(frame_bytes)
    socks = []
    for _ in range(peers):
        sock = ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
        for _ in range(messages):
            for i in range(frames):
                sock.send(blob, zmq.SNDMORE if i < frames - 1 else 0, copy=False)
        socks.append(sock)
    stop.wait()
    for sock in socks:
        sock.close(0)
    ctx.term()
    return {"connections": peers}


def _attack(kind: str, endpoint: str, options: dict, stop, results) -> None:
    host, port = endpoint.rsplit("/", 1)[-1].rsplit(":", 1)
    if kind == "keyless":
        import zmq

        results.put(_keyless(endpoint, options.get("peers", 128), options.get("messages", 8),
                             options.get("frames", 6), options.get("frame_bytes", 1 << 20),
                             options.get("socket_type", zmq.DEALER), stop))
        return
    socket_type = b"PUSH" if options.get("socket_type") == "PUSH" else b"DEALER"
    raw = _Raw(kind, host, int(port), options.get("peers", 1), options.get("frame_bytes", 1 << 20),
               options.get("limit", 1 << 62), socket_type)
    try:
        results.put(raw.run(stop))
        stop.wait()  # hold what was sent until told to stop
    finally:
        raw.close()


class Flood:
    """An attack of one `kind` (see the module) on a TCP `endpoint`, from a process of its own,
    while the `with` block runs; `stats` after it: connections made, closed by the server,
    bytes sent."""

    def __init__(self, kind: str, endpoint: str, **options):
        context = mp.get_context("fork")
        self.stop, self.results = context.Event(), context.Queue()
        self.process = context.Process(target=_attack,
                                       args=(kind, endpoint, options, self.stop, self.results),
                                       daemon=True)
        self.stats: dict = {}

    def __enter__(self) -> Flood:
        self.process.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        deadline = time.monotonic() + 30
        while (not self.stats and time.monotonic() < deadline
               and (self.process.is_alive() or not self.results.empty())):
            try:
                self.stats = self.results.get(timeout=0.5)
            except Exception:  # noqa: BLE001, S110 - queue.Empty: keep waiting for the process
                pass
        self.process.join(10)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
