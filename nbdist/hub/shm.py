"""Shared-memory segments for the same-host fast path.

When a worker and a hub shard share a host, the 1-4 MB parameter and gradient vectors move
through one shared segment per worker, `[gradient | parameters]`, and only small signed
headers cross ZeroMQ. The worker creates and unlinks its segment; hubs only attach, and keep
each worker's view of it in a `WorkerLink`.

A segment's pages are allocated when it is made (`posix_fallocate`), not at its first write: a
sparse segment on a full `/dev/shm` (another user filled it) gets SIGBUS at the first write into
a page that has no room, which kills the process. Made up front, a full `/dev/shm` is an
OSError at `create`, and the caller goes over TCP instead and says so (`unavailable`).
"""

from __future__ import annotations

import contextlib
import os
import secrets
from multiprocessing import resource_tracker, shared_memory

import numpy as np

# Segments this process created: attaching to one of them (hub and worker in one process, as
# in --mode local) must not unregister it from the resource tracker.
_created_here: set[str] = set()


def create(nbytes: int) -> shared_memory.SharedMemory:
    """A new segment with an unguessable name, every page of it allocated now; OSError (ENOSPC:
    `/dev/shm` is full) if there is no room for it, and then nothing is left behind."""
    segment = shared_memory.SharedMemory(name=f"nbdist-{secrets.token_hex(8)}", create=True,
                                         size=max(nbytes, 1))
    try:
        allocate(segment._fd, segment.size)  # noqa: SLF001 - the descriptor it maps
    except OSError:
        segment.close()
        with contextlib.suppress(OSError):
            segment.unlink()
        raise
    _created_here.add(segment.name)
    return segment


def allocate(fd: int, nbytes: int) -> None:
    """Allocate the pages of `nbytes` of the file `fd` (a segment) now; OSError if they do not
    fit. Where the platform has no `posix_fallocate` (macOS), nothing is done."""
    fallocate = getattr(os, "posix_fallocate", None)
    if fallocate is not None and fd >= 0:
        fallocate(fd, 0, nbytes)


def unavailable(exc: OSError, nbytes: int) -> str:
    """What `run.warnings` says when a segment of `nbytes` could not be made (`exc`)."""
    return (f"shared memory unavailable ({nbytes / 2**20:.1f} MiB segment: "
            f"{exc.strerror or exc}); its arrays go over TCP instead, which is slower. Free "
            "room in /dev/shm (df -h /dev/shm; another user's or a killed run's files there) "
            "to use it again")


def attach(name: str) -> shared_memory.SharedMemory:
    """Open a segment another process created, without taking over its clean-up.

    Python < 3.13 registers attached segments with its resource tracker, which would unlink
    them when this process exits; the creator owns the segment, so unregister here.
    """
    segment = shared_memory.SharedMemory(name=name, create=False)
    if name in _created_here:
        return segment
    try:
        resource_tracker.unregister(segment._name, "shared_memory")  # noqa: SLF001
    except Exception:  # noqa: BLE001, S110 - tracker absent or already unregistered
        pass
    return segment


def floats(segment: shared_memory.SharedMemory, offset: int, count: int) -> np.ndarray:
    """A float32 view of `count` floats at float offset `offset` in the segment."""
    return np.ndarray((count,), dtype=np.float32, buffer=segment.buf, offset=offset * 4)


def release(segment: shared_memory.SharedMemory | None, unlink: bool = False) -> None:
    """Close (and for the creator, unlink) a segment; safe to call twice."""
    if segment is None:
        return
    try:
        segment.close()
    except BufferError:  # a view is still alive; the OS frees the mapping at exit
        pass
    if unlink:
        _created_here.discard(segment.name)
        with contextlib.suppress(FileNotFoundError):
            segment.unlink()


class WorkerLink:
    """One worker as a hub shard sees it: its read version, its shared segment (same host) or
    a reused send buffer (TCP), and its wire compression."""

    def __init__(self, segment=None, offset: int = 0, size: int = 0, total: int = 0):
        self.segment = segment
        self.read_version = 0
        self.grad = floats(segment, offset, size) if segment else None
        self.params = floats(segment, total + offset, size) if segment else None
        self.send_buffer: np.ndarray | None = None  # TCP: reused buffer for pull replies
        self.codec = None  # its frames' --compression (nbdist.core.compression.Codec), at hello
        self.decoded: np.ndarray | None = None  # a lossy codec: the last push, decoded
        self.pull = None  # a lossy codec: its PullEncoder, after the first pull
        self.fragment: int | None = None  # streaming-diloco: the fragment its pull asks for
        self.sender: str | None = None  # who said hello: the process that counts (wire.check_link)
