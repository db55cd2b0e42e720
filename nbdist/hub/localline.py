"""The same-host line between a worker and a hub shard: a Unix SOCK_SEQPACKET socket.

Over shared memory only small signed headers travel, and ZeroMQ hands each of them through an
I/O thread on both sides: a tiny round trip costs about 47 us over ipc here, against about
5 us through a kernel socket (benchmarks/results/hot_path.md). So a worker whose shards are all
on its host talks to them over one of these lines instead, and the hub waits on its ZeroMQ
socket and its lines together (`Inbox`).

A packet is one whole message, `count | size 0 | ... | size n-1 | frame 0 | ... | frame n-1`
(little-endian u32s), where the frames are the codec's, signed exactly as on ZeroMQ
(`nbdist.hub.protocol`): the table only says where a frame ends, and a wrong one fails the MAC.
Linux only (AF_UNIX with SOCK_SEQPACKET); where the hub cannot open one it offers no line and
workers use ZeroMQ's ipc. `NBDIST_LOCAL_LINE=0` turns the lines off.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import struct

from nbdist.env import switch
from nbdist.errors import ProtocolError

MAX_PACKET_BYTES = 160 * 1024  # a worker whose messages may be larger uses ZeroMQ's ipc
_SOCKET_BUFFER = 2 * MAX_PACKET_BYTES  # room for a packet and the one after it
_U32 = struct.Struct("<I")


def enabled() -> bool:
    """Whether this platform has the line and the user has not turned it off."""
    return (switch("NBDIST_LOCAL_LINE") and hasattr(socket, "AF_UNIX")
            and hasattr(socket, "SOCK_SEQPACKET"))


def table(frames) -> bytes:
    """The packet's size table for `frames`.

    Example:
        >>> table([b"ab", b"c"]).hex()
        '020000000200000001000000'
    """
    sizes = [memoryview(f).nbytes for f in frames]
    return struct.pack(f"<{len(sizes) + 1}I", len(sizes), *sizes)


def split(packet: memoryview, max_frames: int) -> list[memoryview]:
    """The frames of a received packet, or ProtocolError("malformed packet: ...") if its table
    does not describe it exactly.

    Example:
        >>> [bytes(f) for f in split(memoryview(table([b"ab", b"c"]) + b"abc"), 7)]
        [b'ab', b'c']
    """
    if len(packet) < 4:
        raise ProtocolError("malformed packet",
                            f"{len(packet)} bytes, too short for its frame count")
    count = _U32.unpack_from(packet)[0]
    if not 1 <= count <= max_frames or len(packet) < 4 + 4 * count:
        raise ProtocolError("malformed packet",
                            f"{count} frames in {len(packet)} bytes (1..{max_frames})")
    sizes = struct.unpack_from(f"<{count}I", packet, 4)
    start = 4 + 4 * count
    if start + sum(sizes) != len(packet):
        raise ProtocolError("malformed packet", f"its table names {sum(sizes)} bytes of frames, "
                            f"it carries {len(packet) - start}")
    frames = []
    for size in sizes:
        frames.append(packet[start:start + size])
        start += size
    return frames


class Conn:
    """One connected line (either end): whole packets out, whole packets in. `timeout`: how
    long `receive` waits, in seconds (0: not at all, as the hub, which polls first)."""

    def __init__(self, sock: socket.socket, timeout: float, buffer: bytearray | None = None):
        self.sock = sock
        sock.settimeout(timeout)
        # one byte more than a packet: a larger one shows as truncated. The hub's lines share one
        # (it reads one line at a time and copies each packet out).
        self._buffer = buffer if buffer is not None else bytearray(MAX_PACKET_BYTES + 1)

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, frames, block: bool = True) -> int:
        """Send one message; returns its frames' bytes. The hub never blocks (`block=False`):
        a peer that does not read loses the reply (BlockingIOError) instead of stalling the hub."""
        head = table(frames)
        size = len(head) + sum(memoryview(f).nbytes for f in frames)
        if size > MAX_PACKET_BYTES:
            raise ProtocolError("oversized packet",
                                f"{size} bytes, at most {MAX_PACKET_BYTES} on a local line")
        self.sock.sendmsg([head, *frames], [], 0 if block else socket.MSG_DONTWAIT)
        return size - len(head)

    def receive(self, max_frames: int, timeout: float | None = None) -> list[memoryview] | None:
        """The next message's frames (copied out of the receive buffer), None when the peer has
        closed the line, or TimeoutError when nothing came within the timeout (`timeout`, in
        seconds, replaces the line's from now on)."""
        if timeout is not None:
            self.sock.settimeout(timeout)
        try:
            size, _, flags, _ = self.sock.recvmsg_into([self._buffer])
        except BlockingIOError:
            raise TimeoutError("nothing to read") from None
        except ConnectionResetError:
            return None
        if size == 0:
            return None
        if size > MAX_PACKET_BYTES or flags & socket.MSG_TRUNC:
            raise ProtocolError("oversized packet",
                                f"more than {MAX_PACKET_BYTES} bytes on a local line")
        return split(memoryview(bytes(memoryview(self._buffer)[:size])), max_frames)  # one copy

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


def connect(path: str, timeout: float) -> Conn:
    """A worker's end of a line to the hub shard listening at `path`."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SOCKET_BUFFER)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _SOCKET_BUFFER)
    sock.settimeout(timeout)
    sock.connect(path)
    return Conn(sock, timeout)


class Listener:
    """The hub shard's end: a listening socket at `path`, readable by this user only, which
    admits at most `max_conns` lines at a time (a line from a process without the run's key
    gets no further than the MAC, but must not make the hub keep sockets without bound)."""

    def __init__(self, path: str, max_conns: int):
        self.path, self.max_conns = path, max_conns
        self.conns: set[Conn] = set()
        self._buffer = bytearray(MAX_PACKET_BYTES + 1)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        old_mask = os.umask(0o177)  # created 0600, never briefly open to others
        try:
            self.sock.bind(path)
        finally:
            os.umask(old_mask)
        self.sock.listen(64)
        self.sock.setblocking(False)

    def fileno(self) -> int:
        return self.sock.fileno()

    def accept(self) -> list[Conn]:
        """Every connection waiting; those past `max_conns` are closed at once."""
        new = []
        while True:
            try:
                sock, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return new
            except OSError as exc:  # e.g. EMFILE: refuse this one, keep serving
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ECONNABORTED):
                    return new
                raise
            if len(self.conns) >= self.max_conns:
                sock.close()
                continue
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SOCKET_BUFFER)
            conn = Conn(sock, timeout=0, buffer=self._buffer)
            self.conns.add(conn)
            new.append(conn)

    def drop(self, conn: Conn) -> None:
        self.conns.discard(conn)
        conn.close()

    def close(self) -> None:
        for conn in list(self.conns):
            self.drop(conn)
        with contextlib.suppress(OSError):
            self.sock.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)


def listen(path: str, max_conns: int) -> Listener | None:
    """A listener at `path`, or None where this platform or the user's setting has no line."""
    if not enabled():
        return None
    try:
        return Listener(path, max_conns)
    except OSError:  # e.g. SOCK_SEQPACKET unsupported for AF_UNIX (macOS), or a path too long
        return None
