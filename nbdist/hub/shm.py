"""Shared-memory segments for the same-host fast path.

When a worker and a hub shard share a host, the 1-4 MB parameter and gradient vectors move
through one shared segment per worker, `[gradient | parameters]`, and only small signed
headers cross ZeroMQ. The worker creates and unlinks its segment; hubs only attach, and keep
each worker's view of it in a `WorkerLink`.
"""

from __future__ import annotations

import contextlib
import secrets
from multiprocessing import resource_tracker, shared_memory

import numpy as np

# Segments this process created: attaching to one of them (hub and worker in one process, as
# in --mode local) must not unregister it from the resource tracker.
_created_here: set[str] = set()


def create(nbytes: int) -> shared_memory.SharedMemory:
    """A new segment with an unguessable name."""
    segment = shared_memory.SharedMemory(name=f"nbdist-{secrets.token_hex(8)}", create=True,
                                         size=max(nbytes, 1))
    _created_here.add(segment.name)
    return segment


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
        self.compression = "none"  # "fp16": this worker's pushes and pulls travel as float16
        self.sender: str | None = None  # who said hello: the process that counts (wire.check_link)
