"""The rendezvous of a `--mode sync` run (Horovod's, or torch.distributed's store),
authenticated with the run's key.

Horovod's ranks find each other through an HTTP key-value store (Horovod's own
`RendezvousHTTPServer`) that nbdist runs in the kernel. As shipped it obeys any GET, PUT or
DELETE from anyone who reaches it: a stranger could redirect the ranks' Gloo connections to
an address of theirs, or end a scope early. Here every request and every reply is signed:

- **Kernel**: `signed_rendezvous` is Horovod's server with a signing handler. A request must
  carry `X-Nbdist-Auth: SENDER:COUNTER:DIGEST:MAC`: DIGEST is the keyed BLAKE3
  (`nbdist.hub.protocol.mac`, with a key derived from the run's key) of the body, MAC the keyed
  BLAKE3 over the run id, sender, counter, method, path, the body's length and DIGEST, so the
  header is checked before a byte of the body is read, and the body against DIGEST once read.
  COUNTER must be above the last one from that sender (a replayed DELETE would otherwise count
  as a rank finishing twice). Anything else gets a 403 and is counted in `rejected`. Replies
  are signed over the request's counter, the status and the body.
- **Bounded**: the kernel's server is one selector loop, no thread per connection. It holds at
  most `MAX_CONNECTIONS` connections, each until `REQUEST_S` after its accept (a slow-loris
  peer is cut then), with a request head of at most `MAX_HEAD` bytes; when full, the oldest
  connection still sending its head (and older than `FRESH_S`) makes room for a new one.
  Horovod's handler runs on the complete request, in memory.
- **Rank**: Horovod's C++ client cannot sign, so each rank points it at a `RendezvousRelay` on
  127.0.0.1 in its own engine. The relay admits connections only from processes of its own
  user (the owner of the peer's socket, from /proc/net/tcp: another user of the rank's host
  cannot use it), signs each request, forwards it to the kernel one at a time (so the counter
  arrives in order), checks the signed reply and hands it back.
- **torch.distributed** (`--collective torch`): the kernel runs `signed_store`, the same
  bounded, signed server over a plain key-value handler (no Horovod), and each rank's Gloo
  process group reads and writes it through a `torch.distributed.Store` that signs each
  request itself (`SignedClient`; nbdist.modes.sync.collective.rank_store): no relay.

The rendezvous is authenticated, not encrypted: it carries the ranks' Gloo addresses, no data.
"""

from __future__ import annotations

import collections
import hmac
import http.client
import http.server
import io
import logging
import os
import re
import selectors
import socket
import threading
import time

from nbdist.errors import ProtocolError
from nbdist.hub.protocol import mac

log = logging.getLogger(__name__)
__all__ = ["AUTH_HEADER", "MAX_CONNECTIONS", "MAX_HEAD", "REQUEST_S", "RendezvousRelay",
           "SignedClient", "check_reply", "check_request", "check_request_body",
           "check_request_head", "rendezvous_key", "sign_reply", "sign_request",
           "signed_rendezvous", "signed_store", "socket_owner"]

AUTH_HEADER = "X-Nbdist-Auth"
MAX_BODY = 1 << 20  # a Gloo address list is a few hundred bytes per rank
MAX_HEAD = 8 << 10  # request line and headers: a rank's are under 300 bytes
MAX_CONNECTIONS = 256  # open at once on the kernel's server (a rank's relay opens one per
# request); 256 file descriptors and at most 256 x MAX_HEAD = 2 MiB of heads
REQUEST_S = 5.0  # from a connection's accept to its reply sent: a rank's takes milliseconds
FRESH_S = 1.0  # a connection younger than this is never cut to make room for another
RETRY_S = 10.0  # a relay sends a GET or PUT again this long while the server is crowded
# /scope/key, as Horovod's store uses them
_PATH = re.compile(r"/[A-Za-z0-9_.:\-]+/[A-Za-z0-9_.:\-]+")


def rendezvous_key(key: bytes) -> bytes:
    """The rendezvous's own MAC key, derived from the run's key (never used for anything else)."""
    return mac(key, b"nbdist-rendezvous-key")


def _request_bytes(run_id: str, sender: str, counter: int, method: str, path: str,
                   length: int, digest: str) -> bytes:
    return (f"request\n{run_id}\n{sender}\n{counter}\n{method}\n{path}\n{length}\n"
            f"{digest}").encode()


def _body_digest(key: bytes, body: bytes) -> str:
    return mac(key, b"rendezvous-body", [body]).hex()


def sign_request(key: bytes, run_id: str, sender: str, counter: int, method: str, path: str,
                 body: bytes = b"") -> str:
    """The `X-Nbdist-Auth` value of one request (`key`: `rendezvous_key`): SENDER:COUNTER:
    DIGEST:MAC, where MAC signs the head (with the body's length and DIGEST) on its own.

    Example:
        >>> sign_request(bytes(32), "r", "0", 1, "GET", "/global/0")[:4]
        '0:1:'
    """
    digest = _body_digest(key, body)
    signature = mac(key, _request_bytes(run_id, sender, counter, method, path, len(body), digest))
    return f"{sender}:{counter}:{digest}:{signature.hex()}"


def check_request_head(key: bytes, run_id: str, value: str, method: str, path: str, length: int,
                       last: dict[str, int]) -> tuple[str, int, str]:
    """(sender, counter, body digest) of a request whose `X-Nbdist-Auth` is `value` and whose
    body has `length` bytes, after checking the head's MAC and that its counter is above
    `last[sender]` (not recorded yet: `check_request_body` does); else ProtocolError. Nothing
    of the body is needed."""
    parts = (value or "").split(":")
    if (len(parts) != 4 or not parts[1].isdigit()
            or not all(re.fullmatch(r"[0-9a-f]{64}", p) for p in parts[2:])):
        raise ProtocolError("unsigned", f"rendezvous request without a valid {AUTH_HEADER} "
                            f"(Received: {value[:80]!r})")
    sender, counter, digest = parts[0], int(parts[1]), parts[2]
    expected = mac(key, _request_bytes(run_id, sender, counter, method, path, length, digest))
    if not hmac.compare_digest(expected, bytes.fromhex(parts[3])):
        raise ProtocolError("bad signature",
                            f"rendezvous {method} {path[:80]} from {sender[:20]!r}")
    _check_fresh(sender, counter, last)
    return sender, counter, digest


def check_request_body(key: bytes, sender: str, counter: int, digest: str, body: bytes,
                       last: dict[str, int]) -> None:
    """Check a body against the digest its checked head signed, and the counter once more
    (another request of the sender may have come in between); then record the counter."""
    if not hmac.compare_digest(_body_digest(key, body), digest):
        raise ProtocolError("bad signature", f"rendezvous request {counter} from "
                            f"{sender[:20]!r}: its body is not the one its head signed")
    _check_fresh(sender, counter, last)
    last[sender] = counter


def _check_fresh(sender: str, counter: int, last: dict[str, int]) -> None:
    if counter <= last.get(sender, 0):
        raise ProtocolError("replayed", f"rendezvous request {counter} from {sender[:20]!r}, "
                            f"which already sent {last[sender]}")


def check_request(key: bytes, run_id: str, value: str, method: str, path: str, body: bytes,
                  last: dict[str, int]) -> tuple[str, int]:
    """(sender, counter) of a whole request: `check_request_head`, then `check_request_body`."""
    sender, counter, digest = check_request_head(key, run_id, value, method, path, len(body),
                                                 last)
    check_request_body(key, sender, counter, digest, body, last)
    return sender, counter


def sign_reply(key: bytes, run_id: str, sender: str, counter: int, status: int,
               body: bytes = b"") -> str:
    """The `X-Nbdist-Auth` value of the reply to request (sender, counter)."""
    return mac(key, f"reply\n{run_id}\n{sender}\n{counter}\n{status}".encode(), [body]).hex()


def check_reply(key: bytes, run_id: str, sender: str, counter: int, status: int, body: bytes,
                value: str | None) -> None:
    """Raise ProtocolError unless `value` signs this reply to request (sender, counter)."""
    if not value or not hmac.compare_digest(
            sign_reply(key, run_id, sender, counter, status, body).encode(), value.encode()):
        raise ProtocolError("unsigned", f"the rendezvous's reply to request {counter} is not "
                            f"signed with the run's key (Received: status {status}, "
                            f"{AUTH_HEADER} {value!r:.80})")


# -- the kernel's server ---------------------------------------------------------------------------


def signed_rendezvous(address: tuple[str, int], key: bytes, run_id: str):
    """Horovod's rendezvous server bound on `address` (port 0: any free one), answering only
    requests of run `run_id` signed with `key`'s rendezvous key. Call `init(plan)` and
    `serve_forever()` on it as on Horovod's; `rejected` counts what it refused, by reason
    (`too slow`: cut at its deadline; `crowded`: cut to make room, see the module docstring)."""
    # Horovod: only for --mode sync
    from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer

    class SignedHandler(SignedHandlerMixin, RendezvousHandler):
        pass

    class Server(BoundedServerMixin, RendezvousHTTPServer):
        pass

    server = Server(address, SignedHandler, 0)
    server.mac_key, server.run_id = rendezvous_key(key), run_id
    server.last, server.last_lock = {}, threading.Lock()  # sender -> its last counter
    server.rejected = collections.Counter()
    return server


def signed_store(address: tuple[str, int], key: bytes, run_id: str):
    """A key-value store for torch.distributed's Gloo rendezvous (`--collective torch`), bound on
    `address` and signed as `signed_rendezvous` is: GET /torch/KEY answers the value or 404,
    PUT sets it, DELETE removes it (each rank's store polls GET for what Gloo waits on:
    nbdist.modes.sync.collective.rank_store). No Horovod: a machine without it trains sync
    this way."""

    class Server(BoundedServerMixin, http.server.HTTPServer):
        pass

    server = Server(address, KeyValueHandler)
    server.mac_key, server.run_id = rendezvous_key(key), run_id
    server.last, server.last_lock = {}, threading.Lock()
    server.rejected = collections.Counter()
    server.values, server.values_lock = {}, threading.Lock()
    return server


class _Connection:
    """One accepted connection on its way through head, body and reply."""

    def __init__(self, sock: socket.socket, address, now: float):
        self.sock, self.address, self.born = sock, address, now
        self.data = bytearray()  # the head, then the head and the body
        self.head_size = 0  # the head's bytes in `data` once it is complete (0: still reading)
        self.length = 0  # the body's declared length
        self.auth: tuple[str, int, str] | None = None  # (sender, counter, digest), head checked
        self.out = b""  # the reply, while it is sent

    @property
    def in_head(self) -> bool:
        return not self.head_size


class _Request:
    """A complete request, handed to the handler in memory with its checked signature."""

    def __init__(self, data: bytes, auth: tuple[str, int]):
        self.data, self.auth = data, auth


def _refusal(status: int) -> bytes:
    return (f"HTTP/1.0 {status} {http.HTTPStatus(status).phrase}\r\nContent-Length: 0\r\n"
            "Connection: close\r\n\r\n").encode()


class BoundedServerMixin:
    """A selector loop in place of socketserver's thread per connection (see the module
    docstring): bounded connections, a deadline each, the head's MAC before the body."""

    request_queue_size = 128  # the listen backlog: a burst of strangers does not delay a rank

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        self._stop, self._stopped = False, threading.Event()
        self._connections: dict[int, _Connection] = {}
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        selector = self._selector = selectors.DefaultSelector()
        self.socket.setblocking(False)
        selector.register(self.socket, selectors.EVENT_READ)
        selector.register(self._wake_r, selectors.EVENT_READ)
        try:
            while not self._stop:
                now = time.monotonic()
                soonest = min((c.born for c in self._connections.values()), default=now)
                timeout = max(0.0, min(poll_interval, soonest + REQUEST_S - now))
                for key, _ in selector.select(timeout):
                    if key.fileobj is self.socket:
                        self._accept()
                    elif key.fileobj is self._wake_r:
                        self._wake_r.recv(64)
                    else:
                        conn = self._connections.get(key.fileobj.fileno())
                        if conn is not None:
                            self._turn(conn)
                now = time.monotonic()
                for conn in [c for c in self._connections.values() if now - c.born > REQUEST_S]:
                    self._count("too slow", conn, f"no complete request in {REQUEST_S:g} s")
                    self._close(conn)
        finally:
            for conn in list(self._connections.values()):
                self._close(conn)
            selector.close()
            self._wake_r.close()
            self._wake_w.close()
            self._stopped.set()

    def shutdown(self) -> None:
        """Stop serve_forever and wait for it to return (as socketserver's)."""
        while not hasattr(self, "_stopped"):  # serve_forever has not begun: wait for it
            time.sleep(0.01)
        self._stop = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass  # the loop has ended already
        self._stopped.wait()

    def _accept(self) -> None:
        for _ in range(16):  # a few per turn: the connections already open get their turn too
            try:
                sock, address = self.socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # e.g. out of file descriptors: try again next turn
                log.warning("rendezvous: accept failed: %s", exc)
                return
            now = time.monotonic()
            if len(self._connections) >= MAX_CONNECTIONS:
                # room for the new one: the oldest still sending its head, if not itself young
                heads = [c for c in self._connections.values()
                         if c.in_head and now - c.born >= FRESH_S]
                if not heads:
                    self.rejected["crowded"] += 1
                    sock.close()
                    continue
                oldest = min(heads, key=lambda c: c.born)
                self._count("crowded", oldest, f"{MAX_CONNECTIONS} connections are open")
                self._close(oldest)
            sock.setblocking(False)
            conn = _Connection(sock, address, now)
            self._connections[sock.fileno()] = conn
            self._selector.register(sock, selectors.EVENT_READ)

    def _turn(self, conn: _Connection) -> None:
        try:
            if conn.out:
                sent = conn.sock.send(conn.out)
                conn.out = conn.out[sent:]
                if not conn.out:
                    self._close(conn)
                return
            if conn.in_head:
                self._read_head(conn)
            if not conn.in_head and conn.auth is not None:
                want = conn.head_size + conn.length - len(conn.data)
                if want > 0:
                    chunk = conn.sock.recv(min(want, 1 << 16))
                    if not chunk:
                        raise ConnectionError("closed mid-body")
                    conn.data += chunk
                if len(conn.data) == conn.head_size + conn.length:
                    self._answer(conn)
        except (BlockingIOError, InterruptedError):
            pass
        except (OSError, ConnectionError):
            self._close(conn)

    def _read_head(self, conn: _Connection) -> None:
        """Read up to the head's end and not a byte further (peeked first), then check it."""
        room = MAX_HEAD - len(conn.data)
        peeked = conn.sock.recv(room, socket.MSG_PEEK)
        if not peeked:
            raise ConnectionError("closed mid-head")
        end = (bytes(conn.data[-3:]) + peeked).find(b"\r\n\r\n")
        take = len(peeked) if end < 0 else end + 4 - min(3, len(conn.data))
        conn.data += conn.sock.recv(take)
        if end < 0:
            if len(conn.data) >= MAX_HEAD:
                self._refuse(conn, "oversized", f"a request head over {MAX_HEAD} bytes")
            return
        conn.head_size = len(conn.data)
        try:
            line, _, rest = bytes(conn.data).partition(b"\r\n")
            method, path, _version = line.decode("latin-1").split(" ")
            headers = http.client.parse_headers(io.BytesIO(rest))
            conn.length = int(headers.get("Content-Length") or 0)
            if not 0 <= conn.length <= MAX_BODY:
                raise ProtocolError("oversized",
                                    f"rendezvous body of {conn.length} bytes (at most {MAX_BODY})")
            with self.last_lock:
                conn.auth = check_request_head(self.mac_key, self.run_id,
                                               headers.get(AUTH_HEADER, ""), method, path,
                                               conn.length, self.last)
        except (ProtocolError, ValueError, http.client.HTTPException) as exc:
            self._refuse(conn, exc.reason if isinstance(exc, ProtocolError)
                         else "malformed request", exc)

    def _answer(self, conn: _Connection) -> None:
        sender, counter, digest = conn.auth
        body = bytes(conn.data[conn.head_size:])
        try:
            with self.last_lock:
                check_request_body(self.mac_key, sender, counter, digest, body, self.last)
        except ProtocolError as exc:
            self._refuse(conn, exc.reason, exc)
            return
        request = _Request(bytes(conn.data), (sender, counter))
        handler = self.RequestHandlerClass(request, conn.address, self)
        conn.out = handler.wfile.getvalue()
        conn.auth = None
        self._selector.modify(conn.sock, selectors.EVENT_WRITE)

    def _refuse(self, conn: _Connection, reason: str, why) -> None:
        self._count(reason, conn, why)
        conn.auth, conn.head_size = None, max(conn.head_size, 1)
        conn.out = _refusal(403)
        self._selector.modify(conn.sock, selectors.EVENT_WRITE)

    def _count(self, reason: str, conn: _Connection, why) -> None:
        self.rejected[reason] += 1
        log.warning("rendezvous: refused a request from %s: %s", conn.address[0], why)

    def _close(self, conn: _Connection) -> None:
        self._connections.pop(conn.sock.fileno(), None)
        try:
            self._selector.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()


class SignedHandlerMixin:
    """Before Horovod's RendezvousHandler: answer a complete request whose signature the
    server has checked (`_Request`, in memory), and sign each reply."""

    _auth: tuple[str, int] | None = None

    def setup(self):  # the request is in memory: nothing of it is read from a socket here
        self._auth = self.request.auth
        self.rfile, self.wfile = io.BytesIO(self.request.data), io.BytesIO()

    def finish(self):
        pass  # the server sends wfile's bytes

    def do_GET(self):  # noqa: N802 - http.server's names
        if self._verified("GET") is not None:
            _, scope, key = self.path.split("/")
            value = self._get_value(scope, key)
            self._reply(404, b"") if value is None else self._reply(200, value)

    def do_PUT(self):  # noqa: N802
        body = self._verified("PUT")
        if body is not None:
            _, scope, key = self.path.split("/")
            self._put_value(scope, key, body)
            self._reply(200, b"")

    def do_DELETE(self):  # noqa: N802
        if self._verified("DELETE") is not None:
            super().do_DELETE()  # Horovod's scope bookkeeping; it answers through send_status_code

    def _verified(self, method: str) -> bytes | None:
        """The request's body when its path is well formed; else None (answered). Its signature
        (over this method and path) was checked by the server before it got here."""
        if not _PATH.fullmatch(self.path):
            self._reply(400, b"")
            return None
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def send_status_code(self, status_code):  # Horovod's handlers answer through this
        self._reply(status_code, b"")

    def _reply(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        if self._auth is not None:
            self.send_header(AUTH_HEADER, sign_reply(self.server.mac_key, self.server.run_id,
                                                     *self._auth, status, body))
        self.end_headers()
        if body:
            self.wfile.write(body)

    def log_message(self, format, *args):  # noqa: A002 - quiet, as Horovod's handler
        pass


class KeyValueHandler(SignedHandlerMixin, http.server.BaseHTTPRequestHandler):
    """`signed_store`'s answers, from the server's `values` (scope, key) -> bytes."""

    def _get_value(self, scope: str, key: str) -> bytes | None:
        with self.server.values_lock:
            return self.server.values.get((scope, key))

    def _put_value(self, scope: str, key: str, value: bytes) -> None:
        with self.server.values_lock:
            self.server.values[(scope, key)] = value

    def do_DELETE(self):
        if self._verified("DELETE") is not None:
            _, scope, key = self.path.split("/")
            with self.server.values_lock:
                found = self.server.values.pop((scope, key), None) is not None
            self._reply(200 if found else 404, b"")


# -- the rank's relay -----------------------------------------------------------------------------


def _hex_endpoint(host: str, port: int) -> str:
    """An IPv4 endpoint as /proc/net/tcp writes it (address bytes in host order, port hex)."""
    return f"{int.from_bytes(socket.inet_aton(host), 'little'):08X}:{port:04X}"


def socket_owner(table: str, local: tuple[str, int], remote: tuple[str, int]) -> int | None:
    """The uid owning the TCP socket from `local` to `remote`, read from the text of
    /proc/net/tcp (`table`); None when no such socket is listed.

    Example:
        >>> row = ("   3: 0100007F:C26A 0100007F:CFC3 01 00000000:00000000 00:00000000 00000000  "
        ...        "1000  0 51638")
        >>> socket_owner("header\\n" + row, ("127.0.0.1", 0xC26A), ("127.0.0.1", 0xCFC3))
        1000
    """
    want = (_hex_endpoint(*local), _hex_endpoint(*remote))
    for line in table.splitlines()[1:]:
        fields = line.split()
        if len(fields) > 7 and (fields[1], fields[2]) == want:
            return int(fields[7])
    return None


def _own_user(client: tuple[str, int], server: tuple[str, int]) -> bool:
    """Whether the process at the other end of a loopback connection runs as this process's user."""
    try:
        with open("/proc/net/tcp") as f:
            owner = socket_owner(f.read(), client, server)
    except OSError as exc:
        log.warning("rendezvous relay: cannot read /proc/net/tcp (%s); refusing %s", exc, client)
        return False
    return owner is not None and owner == os.getuid()


class SignedClient:
    """A rank's signed requests to the kernel's rendezvous or store: `env` holds the kernel's
    HOROVOD_GLOO_RENDEZVOUS_ADDR/PORT. One request at a time, so the kernel sees this sender's
    counters in order."""

    def __init__(self, key: bytes, run_id: str, sender: str, env: dict, timeout: float = 30.0):
        self.mac_key, self.run_id, self.sender, self.timeout = (rendezvous_key(key), run_id,
                                                                str(sender), timeout)
        self.upstream = (env["HOROVOD_GLOO_RENDEZVOUS_ADDR"],
                         int(env["HOROVOD_GLOO_RENDEZVOUS_PORT"]))
        self._counter = 0
        self._lock = threading.Lock()

    def forward(self, method: str, path: str, body: bytes) -> tuple[int, bytes]:
        """Sign one request, send it to the kernel, check the reply; (status, body). A GET or
        PUT (the same value again changes nothing) whose connection the kernel's server cut
        before answering (crowded by strangers) is sent again, signed anew, for up to
        `RETRY_S`; a DELETE never is (Horovod counts each one)."""
        deadline = time.monotonic() + RETRY_S
        pause = 0.05
        while True:
            try:
                return self._forward_once(method, path, body)
            except (ConnectionError, http.client.RemoteDisconnected):
                if method == "DELETE" or time.monotonic() + pause > deadline:
                    raise
            time.sleep(pause)
            pause = min(2 * pause, 0.5)

    def _forward_once(self, method: str, path: str, body: bytes) -> tuple[int, bytes]:
        with self._lock:  # one at a time: the kernel sees this sender's counters in order
            self._counter += 1
            counter = self._counter
            auth = sign_request(self.mac_key, self.run_id, self.sender, counter, method, path, body)
            conn = http.client.HTTPConnection(*self.upstream, timeout=self.timeout)
            try:
                conn.request(method, path, body=body or None,
                             headers={AUTH_HEADER: auth, "Content-Length": str(len(body))})
                response = conn.getresponse()
                data = response.read(MAX_BODY + 1)
            finally:
                conn.close()
        if len(data) > MAX_BODY:
            raise ProtocolError("oversized",
                                f"the rendezvous's reply has more than {MAX_BODY} bytes")
        check_reply(self.mac_key, self.run_id, self.sender, counter, response.status, data,
                    response.getheader(AUTH_HEADER))
        return response.status, data


class RendezvousRelay(SignedClient):
    """A rank's signing relay to the kernel's rendezvous for Horovod's C++ client, which cannot
    sign (a context manager): `horovod_env()` points Horovod at the relay."""

    def __init__(self, key: bytes, run_id: str, sender: str, env: dict, timeout: float = 30.0):
        super().__init__(key, run_id, sender, env, timeout)
        relay = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _forward(self):
                length = int(self.headers.get("Content-Length") or 0)
                status, data = 413, b""
                if 0 <= length <= MAX_BODY:
                    try:
                        status, data = relay.forward(self.command, self.path,
                                                     self.rfile.read(length))
                    except (OSError, ProtocolError, http.client.HTTPException) as exc:
                        log.warning("rendezvous relay: %s %s failed: %s", self.command, self.path,
                                    exc)
                        status, data = 502, b""
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_PUT = do_DELETE = _forward  # noqa: N815

            def log_message(self, format, *args):  # noqa: A002
                pass

        class Server(http.server.ThreadingHTTPServer):
            daemon_threads = True

            def verify_request(self, request, client_address):
                return _own_user(client_address, self.server_address[:2])

        self._server = Server(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True,
                                        name="nbdist-rendezvous-relay")
        self._thread.start()

    def horovod_env(self) -> dict[str, str]:
        """HOROVOD_GLOO_RENDEZVOUS_ADDR/PORT of the relay, for Horovod's C++ client."""
        return {"HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1",
                "HOROVOD_GLOO_RENDEZVOUS_PORT": str(self._server.server_address[1])}

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def __enter__(self) -> RendezvousRelay:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
