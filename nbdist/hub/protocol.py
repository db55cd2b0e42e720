"""Framing and authentication of every message on nbdist's sockets.

A message is the multipart ZeroMQ frame list `[signature + header, *buffers]` (the 32-byte
signature and the header share a frame: one frame fewer to send and receive per message):
- `header` is compact JSON: op, run id, sender, recipient, sequence number, the sizes of the
  buffers, `re` (on a reply: the sequence number of the request it answers), op fields;
- `buffers` are raw little-endian float32 arrays, sent and received without copies;
- `signature` is a MAC of the header AND every buffer under the run's random key: keyed BLAKE3
  (a PRF, so a real MAC) over `len(header) | header | buffer 0 | buffer 1 | ...`. The header
  names each buffer's length, so the boundaries are authenticated too. HMAC-SHA256 cost about
  0.6 ms per MB here, five times BLAKE3's 0.12 ms (see benchmarks/hub_throughput.py).

The run id and recipient in the signed header stop a message from being replayed to another
run or another shard; each direction (sender -> recipient) numbers its own messages, and a
receiver refuses a sequence number it has already passed (replay). Nothing is unpickled.
"""

from __future__ import annotations

import hmac
import json
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from blake3 import blake3 as _blake3

from nbdist.env import switch
from nbdist.errors import ProtocolError, RepeatedMessageError
from nbdist.wire.schema import ENVELOPE  # set by encode, checked by decode

_json_out = json.JSONEncoder(separators=(",", ":"))
_json_in = json.JSONDecoder()
_STRINGS = ("run", "from", "to", "op")

ZERO_COPY_MIN_BYTES = 64 * 1024  # below this pyzmq's copying send is faster than zero-copy
# From this many buffer bytes in one message on, the MAC hashes on blake3's own threads
# (benchmarks/mac_threads.py, 2 cores, load ~2.4: no gain up to 40 MB, and 0.71x next to a busy
# process; at 80 MB 1.9x idle, 1.0x busy). NBDIST_MAC_THREADS_MIN_MB overrides (0: always).
MAC_THREADS_MIN_BYTES = int(switch("NBDIST_MAC_THREADS_MIN_MB") * 1e6)
SIGNATURE_BYTES = 32
MAX_HEADER_BYTES = 64 * 1024
KEY_BYTES = 32


def no_mark(phase: str) -> None:
    """The phase clock's mark when nobody profiles."""


def new_key() -> bytes:
    """A fresh random per-run key (it reaches the engines through ipyparallel)."""
    return secrets.token_bytes(KEY_BYTES)


def mac(key: bytes, header_bytes: bytes, buffers: Sequence[object] = ()) -> bytes:
    """The 32-byte keyed BLAKE3 MAC of a header and its buffers (see the module docstring).

    Example:
        >>> mac(bytes(32), b"{}").hex()[:16]
        '1c11cee5c8b647e4'
    """
    views = [_bytes_view(b) for b in buffers]
    threads = 1 if len(views) == 0 or sum(map(len, views)) < MAC_THREADS_MIN_BYTES else _blake3.AUTO
    h = _blake3(len(header_bytes).to_bytes(8, "little"), key=key, max_threads=threads)
    h.update(header_bytes)
    for v in views:
        h.update(v)
    return h.digest()


@dataclass
class Message:
    """A verified message: the header dict and zero-copy views of its buffers."""

    header: dict
    buffers: list[memoryview] = field(default_factory=list)

    @property
    def op(self) -> str:
        return self.header["op"]

    def floats(self, index: int) -> np.ndarray:
        """Buffer `index` as a float32 array that shares memory with the received frame."""
        return np.frombuffer(self.buffers[index], dtype="<f4")


class Codec:
    """Signs outgoing and verifies incoming messages for one endpoint of one run.

    `name` is what peers address this endpoint by (a hub shard: "hub-0"); `sender` adds a
    random suffix, so a restarted process is a new sender, and replies are addressed to it.
    Each recipient gets its own sequence numbers; `decode` refuses a message for another run
    or another recipient, and one whose sequence number is not larger than the last one seen
    from that sender (a replay).

    Example:
        >>> key = new_key()
        >>> a, b = Codec(key, "worker-0", "run1"), Codec(key, "hub-0", "run1")
        >>> frames = a.encode({"op": "ping"}, to="hub-0")
        >>> b.decode(frames).op
        'ping'
    """

    def __init__(self, key: bytes, name: str, run_id: str = "", max_buffer_bytes: int = 1 << 31):
        if len(key) != KEY_BYTES:
            raise ValueError(f"The signing key must have {KEY_BYTES} bytes (Received: {len(key)}). "
                             "Make one with nbdist.hub.protocol.new_key().")
        self._key = key
        self.name, self.run_id = name, run_id
        self.sender = f"{name}/{secrets.token_hex(4)}"
        self.max_buffer_bytes = max_buffer_bytes
        self._seq: dict[str, int] = {}
        self._last_seen: dict[str, int] = {}

    def encode(self, header: dict, buffers: Sequence[object] = (), *, to: str,
               re: int | None = None, mark: Callable[[str], None] = no_mark) -> list:
        """Frames for `header` and `buffers` (objects exposing the buffer protocol) to the
        endpoint `to`; a reply names the request's sequence number in `re`. `mark`: the
        hub's phase clock (`nbdist.hub.profile`)."""
        seq = self._seq.get(to, 0) + 1
        sizes = [memoryview(b).nbytes for b in buffers]
        full = {**header, "run": self.run_id, "from": self.sender, "to": to, "seq": seq,
                "nbytes": sizes}
        if re is not None:
            full["re"] = re
        header_bytes = _json_out.encode(full).encode()
        if len(header_bytes) > MAX_HEADER_BYTES:  # the receiver would drop it unanswered
            raise ProtocolError("oversized header",
                                f"the {header.get('op')!r} message's header has "
                                f"{len(header_bytes)} bytes, at most {MAX_HEADER_BYTES}: "
                                "arrays travel as buffers, not in the header")
        self._seq[to] = seq
        mark("encode")
        signature = mac(self._key, header_bytes, buffers)
        mark("mac_out")
        return [signature + header_bytes, *buffers]

    def last_sent(self, to: str) -> int:
        """The sequence number of the latest message sent to `to` (0: none yet)."""
        return self._seq.get(to, 0)

    def decode(self, frames: Sequence[object], mark: Callable[[str], None] = no_mark) -> Message:
        """Verify and parse `frames` (bytes or zmq.Frame); raise ProtocolError if not valid.
        Its `reason` is what the drop is counted under."""
        first = _bytes(frames[0]) if frames else b""
        if len(first) <= SIGNATURE_BYTES:
            raise ProtocolError("truncated message", f"its first frame has {len(first)} bytes, "
                                f"expected a {SIGNATURE_BYTES}-byte signature and a header")
        signature, header_bytes = first[:SIGNATURE_BYTES], first[SIGNATURE_BYTES:]
        if len(header_bytes) > MAX_HEADER_BYTES:
            raise ProtocolError("oversized header",
                                f"{len(header_bytes)} bytes, at most {MAX_HEADER_BYTES}")
        buffers = [_view(f) for f in frames[1:]]
        total = sum(b.nbytes for b in buffers)
        if total > self.max_buffer_bytes:
            raise ProtocolError("oversized message",
                                f"{total} buffer bytes, at most {self.max_buffer_bytes}")
        if not _equal(signature, mac(self._key, header_bytes, buffers)):
            raise ProtocolError("bad signature", "not signed with this run's key, or altered")
        mark("mac_in")
        header = parse_header(header_bytes)
        if header["nbytes"] != [b.nbytes for b in buffers]:
            raise ProtocolError("malformed header", f"buffer sizes {[b.nbytes for b in buffers]} "
                                f"differ from the signed {header['nbytes']}")
        if header["run"] != self.run_id:
            raise ProtocolError("wrong run", f"for run {header['run']!r}, this is {self.run_id!r}")
        if header["to"] not in (self.name, self.sender):
            raise ProtocolError("wrong recipient", f"for {header['to']!r}, this is {self.sender!r}")
        sender, seq = header["from"], header["seq"]
        last = self._last_seen.get(sender, 0)
        if seq == last:  # the latest message again: a peer whose connection came back
            raise RepeatedMessageError(sender, seq)
        if seq < last:
            raise ProtocolError("replayed message", f"seq {seq} from {sender!r} already seen")
        self._last_seen[sender] = seq
        return Message(header, buffers)


def parse_header(header_bytes: bytes) -> dict:
    """The JSON header with its envelope fields type-checked (a signed header with, say, a
    string `seq` is refused like any other bad message, never trusted)."""
    try:  # the bytes were signed by this run's own encoder: UTF-8 JSON
        header = _json_in.decode(str(header_bytes, "utf-8"))
    except ValueError as exc:  # UnicodeDecodeError is one too
        raise ProtocolError("malformed header", f"not JSON ({exc})") from None
    if type(header) is not dict:
        raise ProtocolError("malformed header",
                            f"a JSON {type(header).__name__}, expected an object")
    try:  # the common case in one pass; any doubt goes to the itemised check below
        ok = (all(type(header[k]) is str for k in _STRINGS) and type(header["seq"]) is int
              and header["seq"] >= 1 and type(header["nbytes"]) is list
              and all(type(n) is int and n >= 0 for n in header["nbytes"])
              and ("re" not in header or (type(header["re"]) is int and header["re"] >= 1)))
    except KeyError:
        ok = False
    if not ok:
        _refuse_envelope(header)
    return header


def _refuse_envelope(header: dict) -> None:
    """Raise the ProtocolError that says which envelope field is missing or wrong."""
    missing = [k for k in ENVELOPE if k not in header]
    if missing:
        raise ProtocolError("malformed header", f"lacks {', '.join(missing)}")
    wrong = [k for k in _STRINGS if not isinstance(header[k], str)]
    wrong += [k for k in ("seq", *(("re",) if "re" in header else ()))
              if not _is_int(header[k]) or header[k] < 1]
    if not (isinstance(header["nbytes"], list)
            and all(_is_int(n) and n >= 0 for n in header["nbytes"])):
        wrong.append("nbytes")
    raise ProtocolError("malformed header",
                        f"wrong type or value of {', '.join(wrong) or 'the envelope'}")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _equal(a: bytes, b: bytes) -> bool:
    return hmac.compare_digest(a, b)


def send_frames(sock, frames: Sequence[object], flags: int = 0) -> int:
    """Send a multipart message: big buffers without a copy, small frames copied (cheaper).
    Returns the bytes sent (the frames' lengths). `flags`: zmq.DONTWAIT (1) raises zmq.Again
    instead of waiting when the peer's queue is full (checked on the first frame only: the
    rest of a message always follows it)."""
    last, total = len(frames) - 1, 0
    for i, frame in enumerate(frames):
        size = frame.nbytes if hasattr(frame, "nbytes") else len(frame)
        total += size
        more = flags | 2 if i < last else flags  # 2: zmq.SNDMORE
        sock.send(frame, more, copy=size < ZERO_COPY_MIN_BYTES)
    return total


def _bytes(frame: object) -> bytes:
    return frame.bytes if hasattr(frame, "bytes") else bytes(frame)


def _view(frame: object) -> memoryview:
    return frame.buffer if hasattr(frame, "buffer") else memoryview(frame)


def _bytes_view(obj: object) -> object:
    """A flat byte view of any buffer (blake3 wants bytes, not float32 items)."""
    if type(obj) is bytes:
        return obj
    view = obj.buffer if hasattr(obj, "buffer") else memoryview(obj)
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view
