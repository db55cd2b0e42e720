"""Bytes counted on a real ZeroMQ socket pair: what `send_frames` says it sent is what the
other end receives (the per-worker totals built on it are in tests/unit/test_traffic.py)."""

import numpy as np
import zmq

from nbdist.hub.protocol import send_frames


def test_send_frames_returns_the_bytes_the_other_end_receives():
    ctx = zmq.Context()
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    try:
        a.bind("inproc://traffic"), b.connect("inproc://traffic")
        big = np.zeros(100_000, dtype=np.float32)  # sent without a copy
        sent = send_frames(a, [b'{"op":"step"}', memoryview(b"x" * 32), big])
        received = sum(len(f) for f in b.recv_multipart(copy=False))
        assert sent == received == 13 + 32 + 400_000
    finally:
        a.close(0), b.close(0), ctx.term()
