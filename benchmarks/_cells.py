"""hub_throughput.py's cells: worker processes released into one common measurement window,
and the raw pyzmq ROUTER/DEALER echo that nbdist's hub is measured against.

A cell starts its processes (forked: they start in milliseconds), lets every worker register
and warm up at a barrier, then counts the round trips each completes inside a shared window.
The raw echo does what the hub's wire does with nothing else: one server per shard replies to
each slice with a slice of the same size, zero-copy.
"""

from __future__ import annotations

import multiprocessing as mp
import time
import traceback
from types import SimpleNamespace

import numpy as np
import zmq

from nbdist.core.sharding import shard_bounds
from nbdist.hub.memory import reuse_large_buffers

MP = mp.get_context("fork")  # children start in milliseconds; the parent holds no zmq context
                             # while it forks (its only context, for shutdown, is closed first)


def timed_loop(step, state, start: float, seconds: float) -> int:
    """Step until start + seconds; count the steps that completed inside the window."""
    end, count = start + seconds, 0
    while True:
        state = step(state)
        now = time.monotonic()
        if now >= end:
            return count
        if now >= start:
            count += 1


def raw_server(slice_bytes: int, stop, conn) -> None:
    reuse_large_buffers(slice_bytes)  # the same malloc setting as nbdist's processes: like for like
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        port = sock.bind_to_random_port("tcp://127.0.0.1")
        reply = np.zeros(slice_bytes // 4, dtype=np.float32)
        conn.send(("ok", port))
        while not stop.is_set():
            if sock.poll(100):
                frames = sock.recv_multipart(copy=False)
                sock.send_multipart([frames[0], reply], copy=False)
    except BaseException:  # noqa: BLE001
        conn.send(("error", traceback.format_exc()))
    finally:
        sock.close(0)
        ctx.term()


def raw_client(index, ports, slice_bytes, win, conn) -> None:
    reuse_large_buffers(slice_bytes)
    ctx = zmq.Context()
    socks = []
    try:
        for port in ports:
            s = ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            s.connect(f"tcp://127.0.0.1:{port}")
            socks.append(s)
        payload = np.ones(slice_bytes // 4, dtype=np.float32)

        def step(_):
            for s in socks:
                s.send(payload, copy=False)
            for s in socks:
                s.recv(copy=False)

        t0 = time.monotonic()
        for _ in range(3):
            step(None)
        win.warm[index] = (time.monotonic() - t0) / 3
        win.barrier.wait(120)
        conn.send(("ok", timed_loop(step, None, win.start_at.value, win.seconds.value)))
    except BaseException:  # noqa: BLE001
        conn.send(("error", traceback.format_exc()))
    finally:
        for s in socks:
            s.close(0)
        ctx.term()


class Procs:
    """Processes of one cell; `stop()` ends every one that is still alive."""

    def __init__(self):
        self.items: list[mp.Process] = []

    def start(self, target, *args):
        parent, child = MP.Pipe()
        p = MP.Process(target=target, args=(*args, child), daemon=True)
        p.start()
        child.close()
        self.items.append(p)
        return parent

    def stop(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        for p in self.items:
            p.join(max(0.0, deadline - time.monotonic()))
        for p in self.items:
            if p.is_alive():
                p.terminate()
                p.join(5)
            if p.is_alive():
                p.kill()
                p.join()


def recv_answer(conn, what: str, timeout: float = 90.0):
    if not conn.poll(timeout):
        raise RuntimeError(f"{what}: no answer within {timeout:.0f}s")
    status, value = conn.recv()
    if status == "error":
        raise RuntimeError(f"{what} failed:\n{value}")
    return value


def shared_window(workers: int, seconds: float) -> SimpleNamespace:
    """What the parent and the workers of one cell share: a barrier, the window's start and
    length, and each worker's warm-up step time."""
    return SimpleNamespace(barrier=MP.Barrier(workers + 1), start_at=MP.Value("d", 0.0),
                           seconds=MP.Value("d", seconds), warm=MP.Array("d", workers))


def run_window(conns, win) -> tuple[int, float]:
    """Release the workers into a common measurement window; (round trips in it, its length).
    The window is --seconds, or 4 of the slowest worker's warm-up steps if longer, so that
    every worker completes several steps in it (32 workers at 10M: a step is ~1 s)."""
    barrier = win.barrier
    deadline = time.monotonic() + 90
    while barrier.n_waiting < len(conns):  # every worker registered and warmed up
        for c in conns:
            if c.poll():  # a worker that answers before the barrier has failed
                barrier.abort()
                recv_answer(c, "worker")
                raise RuntimeError("a worker left before the measurement window")
        if time.monotonic() > deadline:
            barrier.abort()
            raise RuntimeError("workers did not get ready within 90s")
        time.sleep(0.01)
    win.seconds.value = seconds = max(win.seconds.value, 4 * max(win.warm[:]))
    win.start_at.value = time.monotonic() + 0.25 + 0.02 * len(conns)  # all released by then
    barrier.wait(30)
    return sum(recv_answer(c, "worker", seconds + 60) for c in conns), seconds


def raw_cell(size: int, shards: int, workers: int, seconds: float) -> dict:
    slices = [4 * (hi - lo) for lo, hi in shard_bounds(size, shards)]
    procs, stop = Procs(), MP.Event()
    try:
        server_conns = [procs.start(raw_server, b, stop) for b in slices]
        ports = [recv_answer(c, "raw server") for c in server_conns]
        win = shared_window(workers, seconds)
        # every client sends the same slice sizes as an nbdist worker does to the shards
        conns = [procs.start(raw_client, i, ports, slices[0], win) for i in range(workers)]
        count, seconds = run_window(conns, win)
        return {"rate": count / seconds}
    finally:
        stop.set()
        procs.stop()
