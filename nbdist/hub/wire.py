"""The hub's side of the wire: socket set-up, bounded receiving, op field checks, CurveZMQ.

- `server_socket` binds the shard's ROUTER with a low receive high-water mark and a per-frame
  size limit, and (with `--encrypt`) as a CurveZMQ server that admits only this run's clients.
- `recv_bounded` reads one message a frame at a time and refuses it as soon as it has too
  many frames or bytes, dropping the rest without holding it. (libzmq assembles a multipart
  message before delivering it, so `ZMQ_MAXMSGSIZE` bounds each frame and the high-water mark
  the number of queued messages per peer; only CurveZMQ keeps a peer without the key from
  queuing anything at all, see README "Untrusted networks".)
- `check_fields` type-checks the op fields a hub reads, so a signed but malformed header is
  dropped and counted like any other bad message instead of failing a handler.
- `Return`: where a reply goes (routing id, the requester's name, the request's `seq`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from typing import NamedTuple

from nbdist.errors import ProtocolError
from nbdist.hub.protocol import no_mark

RCVHWM = 8  # messages queued per peer: a worker has at most 2 in flight, the kernel 1
MAX_FRAMES = 7  # routing id, signature + header, at most 5 buffers (a sync report has 3)
NUMBER = (int, float)


class Return(NamedTuple):
    """The address of a reply: ROUTER routing id, requester's sender name, request seq (a
    tuple: built once per message, a frozen dataclass cost several times more)."""

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
            raise ProtocolError(f"oversized message: more than {max_frames} frames or {max_bytes} "
                                f"bytes ({count} more frame(s) dropped unread)")
        frames.append(frame)
    return frames


def receive(sock, codec, handlers: Mapping, max_bytes: int, num_workers: int, links: Mapping,
            mark: Callable[[str], None] = no_mark):
    """The next message on a hub's socket and where its reply goes, or ProtocolError: the
    limits first, then the MAC, run, recipient and sequence number (`codec.decode`), then
    the op and every field a handler reads, then the shared-memory segment's generation."""
    frames = recv_bounded(sock, MAX_FRAMES, max_bytes)
    mark("recv")  # the phase clock (nbdist.hub.profile)
    msg = codec.decode(frames[1:], mark)
    if msg.op not in handlers:
        raise ProtocolError(f"unknown op: {msg.op!r}")
    check_fields(msg.header, num_workers)
    check_segment(links, msg)
    return msg, Return(frames[0], msg.header["from"], msg.header["seq"])


# -- op fields -------------------------------------------------------------------------------

_TYPES: dict[str, tuple] = {
    "engine": (int, type(None)), "push": (bool,), "pull": (bool,), "batch": (int,),
    "chunks": (list,), "group": (list,), "loss": NUMBER, "compute_s": NUMBER, "comm_s": NUMBER,
    "wait_s": NUMBER, "since": (int,), "timeline": (bool,), "lr": NUMBER, "lost": (int,),
    "reason": (str,), "stop": (bool,), "paused": (bool,), "offset": (int,), "total": (int,),
    "shm": (str,), "seg": (str,), "host": (str,), "eval": (dict,), "samples": (int,),
    "epoch": NUMBER, "option": (list,), "slowdown": (list,), "batch_policy": (str,),
    "regroup": (bool,), "shards": (list,), "add_worker": (int,), "lag": (int,),
}
_INT_LISTS = ("chunks", "group")
WORKER_OPS = ("hello", "step", "report", "bye")


def check_fields(header: Mapping, num_workers: int) -> None:
    """Raise ProtocolError("malformed header: ...") if an op field a hub reads has the wrong
    type, or a worker op names a worker outside 0..num_workers-1."""
    wrong = [k for k, v in header.items() if k in _TYPES and not _is(v, _TYPES[k])]
    wrong += [k for k in _INT_LISTS if type(header.get(k)) is list
              and not all(type(v) is int for v in header[k])]
    if header["op"] in WORKER_OPS and not (_is(header.get("worker"), (int,))
                                           and 0 <= header["worker"] < num_workers):
        wrong.append(f"worker={header.get('worker')!r} (0..{num_workers - 1})")
    if wrong:
        raise ProtocolError(f"malformed header: wrong type or value of {', '.join(map(str, wrong))}")


def check_segment(links: Mapping, msg) -> None:
    """A step over shared memory names its segment's generation (its unique name): a step that
    names another segment than the one its worker registered (a stale one) is dropped."""
    h = msg.header
    if h["op"] == "step" and (h.get("push") or h.get("pull")):
        link = links.get(h["worker"])
        segment = getattr(link, "segment", None)
        if segment is not None and h.get("seg") != segment.name:
            raise ProtocolError(f"stale segment: the step names {h.get('seg')!r}, the worker "
                                f"registered {segment.name!r}")


def _is(value: object, types: tuple) -> bool:
    """Type check where a JSON bool is not a number (a NaN loss is a number: the worker and
    coordinator report it, it is not a framing error)."""
    if isinstance(value, bool):
        return bool in types
    return isinstance(value, types)


# -- sockets and CurveZMQ ----------------------------------------------------------------------


def curve_keys(key: bytes) -> dict[str, bytes]:
    """The run's CurveZMQ key pairs, derived from its secret key (so no more secrets travel):
    one for the hubs (server) and one for their clients (workers, kernel)."""
    import zmq
    from zmq.utils import z85

    keys = {}
    for role in ("server", "client"):
        secret = z85.encode(hashlib.blake2b(key, person=f"nbdist-{role}".encode()[:16],
                                                      digest_size=32).digest())
        keys[f"{role}_secret"], keys[f"{role}_public"] = secret, zmq.curve_public(secret)
    return keys


def server_socket(ctx, key: bytes, max_frame_bytes: int, encrypt: bool):
    """The shard's ROUTER socket, set up before it binds; with `encrypt`, a CurveZMQ server
    whose authenticator admits only clients holding the run's client key."""
    import zmq

    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVHWM, RCVHWM)
    sock.setsockopt(zmq.MAXMSGSIZE, max_frame_bytes)
    authenticator = None
    if encrypt:
        from zmq.auth.thread import ThreadAuthenticator

        keys = curve_keys(key)
        authenticator = ThreadAuthenticator(ctx)
        authenticator.start()
        authenticator.configure_curve_callback("*", _OnlyKey(keys["client_public"]))
        sock.setsockopt(zmq.CURVE_SERVER, 1)
        sock.setsockopt(zmq.CURVE_SECRETKEY, keys["server_secret"])
    return sock, authenticator


def bind(sock, spec, **extra) -> dict:
    """Bind the shard's socket on TCP (spec.bind_host) and ipc; returns its endpoints, which
    name the run and (with --encrypt) the server's public key."""
    import os
    import tempfile

    from nbdist.hub import shm

    port = sock.bind_to_random_port(f"tcp://{spec.bind_host}")
    ipc = os.path.join(tempfile.gettempdir(), f"nbdist-{spec.run_id}-{spec.shard}.ipc")
    sock.bind(f"ipc://{ipc}")
    endpoints = {"tcp": f"tcp://{spec.bind_host}:{port}", "ipc": f"ipc://{ipc}", "host": shm.host_id(),
                 "run": spec.run_id, **extra}
    if spec.encrypt:
        endpoints["curve"] = curve_keys(spec.key)["server_public"].decode()
    return endpoints


class _OnlyKey:
    """ZAP credentials provider: admit exactly one client public key."""

    def __init__(self, public: bytes):
        self.public = public

    def callback(self, domain: str, key: bytes) -> bool:  # pyzmq passes the z85 form
        return key == self.public


def client_socket(ctx, endpoint: dict | str, key: bytes, kind: int):
    """A client socket for a hub `endpoint` dict (CurveZMQ when it names a server key)."""
    import zmq

    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    if isinstance(endpoint, dict) and endpoint.get("curve"):
        keys = curve_keys(key)
        sock.setsockopt(zmq.CURVE_SERVERKEY, endpoint["curve"].encode())
        sock.setsockopt(zmq.CURVE_SECRETKEY, keys["client_secret"])
        sock.setsockopt(zmq.CURVE_PUBLICKEY, keys["client_public"])
    return sock
