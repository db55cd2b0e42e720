"""The Horovod rendezvous of a `--mode sync` run, authenticated with the run's key.

Horovod's ranks find each other through an HTTP key-value store (Horovod's own
`RendezvousHTTPServer`) that nbdist runs in the kernel. As shipped it obeys any GET, PUT or
DELETE from anyone who reaches it: a stranger could redirect the ranks' Gloo connections to
an address of theirs, or end a scope early. Here every request and every reply is signed:

- **Kernel**: `signed_rendezvous` is Horovod's server with a signing handler. A request must
  carry `X-Nbdist-Auth: SENDER:COUNTER:MAC`, the keyed BLAKE3 (`nbdist.hub.protocol.mac`, with
  a key derived from the run's key) over the run id, sender, counter, method, path and body,
  and a COUNTER above the last one from that sender (a replayed DELETE would otherwise count
  as a rank finishing twice). Anything else gets a 403 and is counted in `rejected`. Replies
  are signed the same way over the request's counter, the status and the body.
- **Rank**: Horovod's C++ client cannot sign, so each rank points it at a `RendezvousRelay` on
  127.0.0.1 in its own engine. The relay admits connections only from processes of its own
  user (the owner of the peer's socket, from /proc/net/tcp: another user of the rank's host
  cannot use it), signs each request, forwards it to the kernel one at a time (so the counter
  arrives in order), checks the signed reply and hands it back.

The rendezvous is authenticated, not encrypted: it carries the ranks' Gloo addresses, no data.
"""

from __future__ import annotations

import collections
import hmac
import http.client
import http.server
import logging
import os
import re
import socket
import threading

from nbdist.errors import ProtocolError
from nbdist.hub.protocol import mac

log = logging.getLogger(__name__)
__all__ = ["AUTH_HEADER", "RendezvousRelay", "check_reply", "check_request", "rendezvous_key",
           "sign_reply", "sign_request", "signed_rendezvous", "socket_owner"]

AUTH_HEADER = "X-Nbdist-Auth"
MAX_BODY = 1 << 20  # a Gloo address list is a few hundred bytes per rank
# /scope/key, as Horovod's store uses them
_PATH = re.compile(r"/[A-Za-z0-9_.:\-]+/[A-Za-z0-9_.:\-]+")


def rendezvous_key(key: bytes) -> bytes:
    """The rendezvous's own MAC key, derived from the run's key (never used for anything else)."""
    return mac(key, b"nbdist-rendezvous-key")


def _request_bytes(run_id: str, sender: str, counter: int, method: str, path: str) -> bytes:
    return f"request\n{run_id}\n{sender}\n{counter}\n{method}\n{path}".encode()


def sign_request(key: bytes, run_id: str, sender: str, counter: int, method: str, path: str,
                 body: bytes = b"") -> str:
    """The `X-Nbdist-Auth` value of one request (`key`: `rendezvous_key`).

    Example:
        >>> sign_request(bytes(32), "r", "0", 1, "GET", "/global/0")[:6]
        '0:1:93'
    """
    signature = mac(key, _request_bytes(run_id, sender, counter, method, path), [body])
    return f"{sender}:{counter}:{signature.hex()}"


def check_request(key: bytes, run_id: str, value: str, method: str, path: str, body: bytes,
                  last: dict[str, int]) -> tuple[str, int]:
    """(sender, counter) of a request whose `X-Nbdist-Auth` is `value`, after checking its MAC
    and that its counter is above `last[sender]` (then recorded there); else ProtocolError."""
    parts = (value or "").split(":")
    if len(parts) != 3 or not parts[1].isdigit() or not re.fullmatch(r"[0-9a-f]{64}", parts[2]):
        raise ProtocolError("unsigned", f"rendezvous request without a valid {AUTH_HEADER} "
                            f"(Received: {value[:80]!r})")
    sender, counter = parts[0], int(parts[1])
    expected = mac(key, _request_bytes(run_id, sender, counter, method, path), [body])
    if not hmac.compare_digest(expected, bytes.fromhex(parts[2])):
        raise ProtocolError("bad signature",
                            f"rendezvous {method} {path[:80]} from {sender[:20]!r}")
    if counter <= last.get(sender, 0):
        raise ProtocolError("replayed", f"rendezvous request {counter} from {sender[:20]!r}, "
                            f"which already sent {last[sender]}")
    last[sender] = counter
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
    `serve_forever()` on it as on Horovod's; `rejected` counts what it refused, by reason."""
    from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer

    class SignedHandler(SignedHandlerMixin, RendezvousHandler):
        pass

    server = RendezvousHTTPServer(address, SignedHandler, 0)
    # a client that hangs mid-request does not hold up the kernel's exit
    server.daemon_threads = True
    server.mac_key, server.run_id = rendezvous_key(key), run_id
    server.last, server.last_lock = {}, threading.Lock()  # sender -> its last counter
    server.rejected = collections.Counter()
    return server


class SignedHandlerMixin:
    """Before Horovod's RendezvousHandler: check each request's signature, sign each reply."""

    _auth: tuple[str, int] | None = None

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
        """The request's body when it is signed, fresh and well formed; else None (answered)."""
        server = self.server
        try:
            length = int(self.headers.get("Content-Length") or 0)
            if not 0 <= length <= MAX_BODY:
                raise ProtocolError("oversized",
                                    f"rendezvous body of {length} bytes (at most {MAX_BODY})")
            body = self.rfile.read(length) if length else b""
            with server.last_lock:
                self._auth = check_request(server.mac_key, server.run_id,
                                           self.headers.get(AUTH_HEADER, ""), method, self.path,
                                           body, server.last)
        except (ProtocolError, ValueError, OSError) as exc:
            server.rejected[exc.reason if isinstance(exc, ProtocolError)
                            else "malformed request"] += 1
            log.warning("rendezvous: refused a request from %s: %s", self.client_address[0], exc)
            self._auth = None
            self._reply(403, b"")
            return None
        if not _PATH.fullmatch(self.path):
            self._reply(400, b"")
            return None
        return body

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


class RendezvousRelay:
    """A rank's signing relay to the kernel's rendezvous (a context manager). `env` holds the
    kernel's HOROVOD_GLOO_RENDEZVOUS_ADDR/PORT; `horovod_env()` points Horovod at the relay."""

    def __init__(self, key: bytes, run_id: str, sender: str, env: dict, timeout: float = 30.0):
        self.mac_key, self.run_id, self.sender, self.timeout = (rendezvous_key(key), run_id,
                                                                str(sender), timeout)
        self.upstream = (env["HOROVOD_GLOO_RENDEZVOUS_ADDR"],
                         int(env["HOROVOD_GLOO_RENDEZVOUS_PORT"]))
        self._counter = 0
        self._lock = threading.Lock()
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

    def forward(self, method: str, path: str, body: bytes) -> tuple[int, bytes]:
        """Sign one request, send it to the kernel, check the reply; (status, body)."""
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

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def __enter__(self) -> RendezvousRelay:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
