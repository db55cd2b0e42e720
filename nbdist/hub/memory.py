"""Large received frames without page faults: glibc keeps freed big buffers for reuse.

libzmq allocates each received message with malloc. glibc serves allocations above its mmap
threshold with a fresh mmap and unmaps them on free; the threshold adapts upwards to what is
freed, but only up to 32 MB. A 10M-parameter slice is 40 MB, so every such frame was a new
mapping: about 9,800 page faults and ~30 ms per 40 MB receive on this machine, against ~8 ms
once the buffer is reused (measured with a pyzmq PAIR over loopback TCP). `reuse_large_buffers`
raises the threshold (and the heap trim threshold) above the frames a process receives, so the
freed buffer is taken again for the next message. Only processes that receive such frames
call it (hub shards and TCP workers with slices over 16 MB); `NBDIST_MALLOPT=0` turns it off.
"""

from __future__ import annotations

import ctypes
import ctypes.util

from nbdist.env import switch

LARGE_FRAME_BYTES = 16 << 20  # below this glibc's adaptive threshold already reuses buffers
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
_MAX = (1 << 31) - 1  # mallopt takes an int
_done = 0


def reuse_large_buffers(frame_bytes: int) -> bool:
    """Let malloc reuse freed buffers of `frame_bytes` (glibc only); True if it was set."""
    global _done
    if frame_bytes < LARGE_FRAME_BYTES or frame_bytes <= _done or not switch("NBDIST_MALLOPT"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to tune
        return False
    threshold = min(_MAX, 2 * frame_bytes)
    if not (mallopt(_M_MMAP_THRESHOLD, threshold)
            and mallopt(_M_TRIM_THRESHOLD, min(_MAX, 2 * threshold))):
        return False
    _done = frame_bytes
    return True
