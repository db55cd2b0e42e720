"""A client socket that comes back (`Dial`): every socket nbdist connects to a gated socket
(a worker's, the kernel's and a shard's relay lines to the hubs, a pipeline stage's sockets
to its neighbours and to the kernel) is made here.

Why: the gate (`nbdist.hub.gate`) admits each PLAIN token once. After its TCP connection ends
(a reset by a switch, a NAT or a firewall that forgot it, a peer's host that dropped it),
ZeroMQ reconnects a socket by itself, but with the credentials it was made with, which the gate
has spent: it is refused at the handshake, and again at each retry, forever. So each socket's
connection is watched (a ZeroMQ monitor), and when it ends or is refused at the gate, its owner
opens a new socket (`redial`) with new credentials, to the same address. A request/reply socket
keeps its routing id across redials, so the replies a hub sends later still reach it.

What a lost connection loses in flight is the owner's to restore: a line sends its latest
request again (`nbdist.hub.lines`; the hub answers a request it already had from its cache,
`nbdist.hub.server`).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable

import zmq

from nbdist.hub.wire import client_socket

# what ends a connection for good unless the socket is made again: its TCP connection ended
# (reset or closed), or the gate refused its (spent) token
LOST_EVENTS = (zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_FAILED_AUTH
               | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
# at least this long between two redials (ZeroMQ's own reconnect interval): a peer that accepts
# and at once ends every connection (a proxy in front of a stopped process) costs no busy loop
REDIAL_GAP_S = 0.1


def routing_id() -> bytes:
    """A fresh ZeroMQ routing id (one that does not start with a zero byte, which libzmq
    keeps for the ids it makes itself)."""
    return b"n" + secrets.token_bytes(15)


class Dial:
    """One client socket of `kind` to `address` (the bound socket's `endpoint` dict names its
    gate or its CurveZMQ key), made by `open` and made again by `redial`, with new credentials
    each time. `setup(sock)` sets a socket's options before it connects; `keep_id`: the same
    routing id on every socket (a DEALER whose replies must find it after a redial).
    `redials` counts the sockets made again after a loss.

    Example:
        >>> ctx = zmq.Context.instance()
        >>> dial = Dial(ctx, {"gate": "g"}, bytes(32), zmq.DEALER, "tcp://127.0.0.1:9")
        >>> sock = dial.open()
        >>> dial.lost(), dial.redials
        (False, 0)
        >>> dial.close()
    """

    def __init__(self, ctx: zmq.Context, endpoint: dict | str, key: bytes, kind: int,
                 address: str, setup: Callable[[zmq.Socket], None] | None = None,
                 keep_id: bool = False):
        self._ctx, self._endpoint, self._key, self.kind = ctx, endpoint, key, kind
        self.address, self._setup = address, setup
        self.routing_id = routing_id() if keep_id else None
        self.sock: zmq.Socket | None = None
        self._monitor: zmq.Socket | None = None
        self._poller: zmq.Poller | None = None
        self.redials = 0
        self._opened = -REDIAL_GAP_S  # when the last socket was made (monotonic seconds)

    def open(self) -> zmq.Socket:
        """A new socket (fresh credentials), connected and watched; closes the last one."""
        self._close()
        time.sleep(max(0.0, self._opened + REDIAL_GAP_S - time.monotonic()))
        self._opened = time.monotonic()
        sock = client_socket(self._ctx, self._endpoint, self._key, self.kind)
        if self.routing_id is not None:
            sock.setsockopt(zmq.ROUTING_ID, self.routing_id)
        if self._setup is not None:
            self._setup(sock)
        self._monitor = sock.get_monitor_socket(LOST_EVENTS)
        sock.connect(self.address)
        self.sock = sock
        self._poller = zmq.Poller()
        self._poller.register(sock, zmq.POLLIN)
        self._poller.register(self._monitor, zmq.POLLIN)
        return sock

    def redial(self) -> zmq.Socket:
        """`open` again after a loss (counted): whatever the old socket held is gone."""
        self.redials += 1
        return self.open()

    def lost(self) -> bool:
        """Whether the connection ended or the gate refused it since the last look (reads the
        monitor without waiting)."""
        monitor, lost = self._monitor, False
        if monitor is None:
            return False
        while monitor.get(zmq.EVENTS) & zmq.POLLIN:
            try:
                monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            lost = True  # the monitor reports nothing but LOST_EVENTS
        return lost

    def writable(self, timeout_ms: int) -> bool:
        """Whether the socket can queue a message now or within `timeout_ms`. False also
        when its connection ended or was refused meanwhile (then `lost()` says so): a full
        queue is a slow reader, not a lost connection, and waits."""
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLOUT)
        poller.register(self._monitor, zmq.POLLIN)
        return bool(dict(poller.poll(timeout_ms)).get(self.sock, 0) & zmq.POLLOUT)

    def poll(self, timeout_ms: int) -> str | None:
        """"ready" once the socket has a message, "lost" once its connection ended or was
        refused (then `redial`), None after `timeout_ms` of neither. A message that came
        before the loss is read first: a peer that replies, then closes (a hub's answer to
        Shutdown), ends the connection with the reply already queued here, and a redial
        would drop it."""
        ready = dict(self._poller.poll(timeout_ms))
        if self.sock in ready:
            return "ready"
        return "lost" if self._monitor in ready and self.lost() else None

    def _close(self) -> None:
        if self.sock is not None:
            self.sock.disable_monitor()
            self.sock.close(0)
        if self._monitor is not None:
            self._monitor.close(0)
        self.sock = self._monitor = self._poller = None

    def close(self, linger: int = 0) -> None:
        if self.sock is not None and linger:
            self.sock.setsockopt(zmq.LINGER, linger)
            self.sock.disable_monitor()
            self.sock.close(linger)
            self.sock = None
        self._close()
