"""Framing and signing of every message on nbdist's sockets.

A message is the multipart ZeroMQ frame list `[signature, header, *buffers]`:
- `header` is compact JSON (op, sender, sequence number, the sizes of the buffers, op fields);
- `signature` is HMAC-SHA256 of the header bytes under the run's random key;
- `buffers` are raw little-endian float32 arrays, sent and received without copies.

The header names every buffer's byte length, so a truncated or padded buffer is refused, and
carries a per-sender sequence number, so a replayed message is refused. Buffers are not
hashed (hashing 4 MB per step would cost more than sending it); they are bound to a signed
header by their lengths. Nothing here unpickles anything.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from nbdist.errors import ProtocolError

ZERO_COPY_MIN_BYTES = 64 * 1024  # below this pyzmq's copying send is faster than zero-copy
SIGNATURE_BYTES = 32
MAX_HEADER_BYTES = 64 * 1024
KEY_BYTES = 32


def new_key() -> bytes:
    """A fresh random per-run key (it reaches the engines through ipyparallel)."""
    return secrets.token_bytes(KEY_BYTES)


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
    """Signs outgoing and verifies incoming messages for one endpoint.

    `sender` names this endpoint in every header it sends (with a random suffix, so a
    restarted process is a new sender); the sequence number it stamps grows by one per
    message, and `decode` refuses any message whose sequence number is not larger than the
    last one seen from that sender (replay protection).

    Example:
        >>> key = new_key()
        >>> a, b = Codec(key, "worker-0"), Codec(key, "hub-0")
        >>> frames = a.encode({"op": "ping"})
        >>> b.decode(frames).op
        'ping'
    """

    def __init__(self, key: bytes, sender: str, max_buffer_bytes: int = 1 << 31):
        if len(key) < 16:
            raise ValueError(f"The signing key must have >= 16 bytes (Received: {len(key)}).")
        self._key = key
        self.sender = f"{sender}/{secrets.token_hex(4)}"
        self.max_buffer_bytes = max_buffer_bytes
        self._seq = 0
        self._last_seen: dict[str, int] = {}

    def sign(self, header_bytes: bytes) -> bytes:
        return hmac.new(self._key, header_bytes, hashlib.sha256).digest()

    def encode(self, header: dict, buffers: Sequence[object] = ()) -> list:
        """Frames for `header` and `buffers` (objects exposing the buffer protocol)."""
        self._seq += 1
        sizes = [memoryview(b).nbytes for b in buffers]
        full = {**header, "from": self.sender, "seq": self._seq, "nbytes": sizes}
        header_bytes = json.dumps(full, separators=(",", ":")).encode()
        return [self.sign(header_bytes), header_bytes, *buffers]

    def decode(self, frames: Sequence[object]) -> Message:
        """Verify and parse `frames` (bytes or zmq.Frame); raise ProtocolError if not valid."""
        if len(frames) < 2:
            raise ProtocolError(f"truncated message: {len(frames)} frame(s), expected >= 2")
        signature, header_bytes = _bytes(frames[0]), _bytes(frames[1])
        if len(header_bytes) > MAX_HEADER_BYTES:
            raise ProtocolError(f"oversized header: {len(header_bytes)} bytes")
        if len(signature) != SIGNATURE_BYTES or not hmac.compare_digest(
            signature, self.sign(header_bytes)
        ):
            raise ProtocolError("bad signature: not signed with this run's key")
        try:
            header = json.loads(header_bytes)
            sender, seq, sizes = header["from"], header["seq"], header["nbytes"]
            header["op"]  # noqa: B018 - presence check
        except (ValueError, KeyError, TypeError) as exc:
            raise ProtocolError(f"malformed header: {exc}") from None
        buffers = [_view(f) for f in frames[2:]]
        if [b.nbytes for b in buffers] != sizes:
            raise ProtocolError(
                f"buffer sizes {[b.nbytes for b in buffers]} differ from the signed {sizes}"
            )
        if sum(sizes) > self.max_buffer_bytes:
            raise ProtocolError(f"oversized message: {sum(sizes)} buffer bytes")
        if seq <= self._last_seen.get(sender, 0):
            raise ProtocolError(f"replayed message: seq {seq} from {sender!r} already seen")
        self._last_seen[sender] = seq
        return Message(header, buffers)


def send_frames(sock, frames: Sequence[object]) -> None:
    """Send a multipart message: big buffers without a copy, small frames copied (cheaper)."""
    last = len(frames) - 1
    for i, frame in enumerate(frames):
        size = frame.nbytes if hasattr(frame, "nbytes") else len(frame)
        sock.send(frame, 2 if i < last else 0, copy=size < ZERO_COPY_MIN_BYTES)  # 2: zmq.SNDMORE


def _bytes(frame: object) -> bytes:
    return frame.bytes if hasattr(frame, "bytes") else bytes(frame)


def _view(frame: object) -> memoryview:
    return frame.buffer if hasattr(frame, "buffer") else memoryview(frame)


def shard_bounds(size: int, num_shards: int, align: int = 16) -> list[tuple[int, int]]:
    """Split a flat vector of `size` floats into `num_shards` contiguous nearly equal slices.

    Slice starts are multiples of `align` floats (64 bytes: one cache line) so no two shards
    share a line.

    Example:
        >>> shard_bounds(100, 2)
        [(0, 48), (48, 100)]
    """
    if num_shards < 1:
        raise ValueError(f"num_shards must be >= 1 (Received: {num_shards}).")
    if size < num_shards * align:
        align = 1
    cuts = [min(size, round(size * i / num_shards / align) * align) for i in range(num_shards)]
    return list(zip(cuts, [*cuts[1:], size], strict=False))
