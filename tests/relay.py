"""A TCP relay that can reset its connections: what a flaky switch, a NAT that forgets its
table or a restarted firewall does to a link.

`Relay(address)` listens on a free port of the target's interface and forwards every connection
to `address` (`host:port`, or a `tcp://` endpoint); `endpoint(tcp)` rewrites a `tcp://` endpoint
to go through it. `reset()` ends every connection open now with a TCP RST on both sides
(SO_LINGER 0, then close), so both peers see `ECONNRESET`; new connections are relayed again.
`reset_every(period, times)` does that on a thread of its own, `resets` counts the resets that
ended at least one connection and `accepted` the connections relayed. One thread, one selector;
a context manager.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import struct
import threading
import time

CHUNK = 1 << 16
# The relay's one thread waits this long at most (to connect to the target, or for a side to
# read what it forwards), then cuts the connection. Well under the loss deadline of the runs
# relayed (--timeout 10: 5 s), because the wait stalls every connection of the relay: a 5 s
# wait made a worker silent for 5.3 s, written off by the hub (CI, once).
STALL_S = 1.0


class Relay:
    def __init__(self, address: str):
        host, port = address.rsplit("/", 1)[-1].rsplit(":", 1)
        self.target = (host, int(port))
        self.listener = socket.create_server((host, 0))
        self.listener.setblocking(False)
        self.port = self.listener.getsockname()[1]
        self.accepted = self.resets = 0
        self._pairs: dict[socket.socket, socket.socket] = {}
        self._selector = selectors.DefaultSelector()
        self._selector.register(self.listener, selectors.EVENT_READ)
        self._lock = threading.Lock()
        self._reset_now = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="test-relay")
        self._thread.start()

    def endpoint(self, tcp: str) -> str:
        """`tcp` (the relayed target's `tcp://host:port`) through this relay."""
        return f"{tcp.rsplit(':', 1)[0]}:{self.port}"

    def reset(self, timeout: float = 5.0) -> int:
        """RST every connection open now, both sides; returns how many pairs were cut."""
        with self._lock:
            before = len(self._pairs) // 2
        self._reset_now.set()
        end = time.monotonic() + timeout
        while self._reset_now.is_set() and time.monotonic() < end:
            time.sleep(0.005)
        return before

    def reset_every(self, period: float, times: int, after: float = 0.0) -> threading.Thread:
        """Reset every `period` seconds, `times` times, starting `after` seconds from now."""

        def resets():
            time.sleep(after)
            for _ in range(times):
                if self._stop.is_set():
                    return
                self.reset()
                time.sleep(period)

        thread = threading.Thread(target=resets, daemon=True, name="test-relay-resets")
        thread.start()
        return thread

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def __enter__(self) -> Relay:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- the relay's thread -------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                if self._reset_now.is_set():
                    self._reset_all()
                    self._reset_now.clear()
                for key, _ in self._selector.select(0.01):
                    if key.fileobj is self.listener:
                        self._accept()
                    else:
                        self._forward(key.fileobj)
        finally:
            self._reset_all()
            self._selector.close()
            self.listener.close()

    def _accept(self) -> None:
        try:
            client, _ = self.listener.accept()
        except BlockingIOError:
            return
        try:
            server = socket.create_connection(self.target, timeout=STALL_S)
        except OSError:
            _rst(client)
            return
        for sock in (client, server):
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._selector.register(sock, selectors.EVENT_READ)
        with self._lock:
            self._pairs[client], self._pairs[server] = server, client
            self.accepted += 1

    def _forward(self, sock: socket.socket) -> None:
        other = self._pairs.get(sock)
        if other is None:
            return
        try:
            data = sock.recv(CHUNK)
            if data:
                other.settimeout(STALL_S)
                other.sendall(data)  # a peer that stops reading is cut (a timeout is an OSError)
                other.setblocking(False)
                return
        except OSError:
            pass
        self._drop(sock)  # one side ended: end the other too (as a plain close)

    def _drop(self, sock: socket.socket, rst: bool = False) -> None:
        with self._lock:
            other = self._pairs.pop(sock, None)
            if other is not None:
                self._pairs.pop(other, None)
        for s in (sock, other):
            if s is None:
                continue
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(s)
            _rst(s) if rst else s.close()

    def _reset_all(self) -> None:
        with self._lock:
            clients = list(self._pairs)
        if clients:
            self.resets += 1
        for sock in clients:
            if sock in self._pairs:
                self._drop(sock, rst=True)


def _rst(sock: socket.socket) -> None:
    """Close `sock` with a TCP RST instead of a FIN."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


# -- relays on a link of a run ------------------------------------------------------------------

_RELAYED: list = []  # (relays, lines) that `relay_lines_once` made in this process
_UNDO: list = []  # how to take back a patch not used yet


def relay_lines_once(module_name: str, period: float, times: int, after: float = 0.5) -> None:
    """In this process (an engine, or the kernel's): the next lines to the hub shards that
    `module_name` opens (`nbdist.hub.client`: a worker's or a sync rank's transport;
    `nbdist.hub.control`: the kernel's) go through a relay per shard, which resets every
    connection every `period` seconds, `times` times, from `after` seconds on. Once; `relayed`
    reports and takes the patch back if it was not used. Private access by necessity: nbdist
    has no fault hook, and grows none for tests."""
    import importlib

    module = importlib.import_module(module_name)
    original = module.open_lines

    def through_relays(ctx, key, shards, name, timeout, transport="tcp", spin_s=0.0):
        module.open_lines = original
        relays = [Relay(s["tcp"]) for s in shards]
        shards = [{**s, "tcp": r.endpoint(s["tcp"])} for s, r in zip(shards, relays, strict=True)]
        # over TCP, through the relays: the kernel's "auto" would take ipc to a same-host hub
        lines = original(ctx, key, shards, name, timeout,
                         "tcp" if transport == "auto" else transport, spin_s)
        for relay in relays:
            relay.reset_every(period, times, after)
        _RELAYED.append((relays, [lambda line=line: line.redials for line in lines]))
        return lines

    module.open_lines = through_relays
    _UNDO.append(lambda: setattr(module, "open_lines", original)
                 if module.open_lines is through_relays else None)


def relayed() -> list[dict]:
    """What the relays of `relay_lines_once` did, one dict per set of lines (resets that cut a
    connection, connections relayed, the lines' redials); closes them and takes back a patch
    that was not used."""
    while _UNDO:
        _UNDO.pop()()
    seen = []
    while _RELAYED:
        relays, lines = _RELAYED.pop()
        for relay in relays:
            relay.close()
        seen.append({"resets": [r.resets for r in relays], "accepted": [r.accepted for r in relays],
                     "redials": [redials() for redials in lines]})
    return seen


def relay_stage_links_once(period: float, times: int, after: float = 0.5) -> None:
    """On an engine: the next pipeline stage's sockets towards its neighbours and the kernel
    (`StageLink.connect`) go through relays that reset every connection every `period`
    seconds, `times` times, from `after` seconds on. Once; `relayed` reports (a stage's
    redials by peer) and takes the patch back if it was not used."""
    from nbdist.modes.pipeline import link as module

    original = module.StageLink.connect

    def connect(self, neighbours, report, control):
        module.StageLink.connect = original
        peers = {**neighbours, "kernel": report}
        relays = {name: Relay(info["endpoint"]) for name, info in peers.items()}
        through = {name: {**info, "endpoint": relays[name].endpoint(info["endpoint"])}
                   for name, info in peers.items()}
        kernel = through.pop("kernel")
        original(self, through, kernel, control)
        for relay in relays.values():
            relay.reset_every(period, times, after)
        _RELAYED.append((list(relays.values()),
                         [lambda: {k: v for k, v in self.redials.items() if k != "control"}]))

    module.StageLink.connect = connect
    _UNDO.append(lambda: setattr(module.StageLink, "connect", original)
                 if module.StageLink.connect is connect else None)
