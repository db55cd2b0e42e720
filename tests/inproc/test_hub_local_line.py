"""The same-host line (`nbdist.hub.localline`) under the hub's rules: every packet on it is
authenticated like a ZeroMQ message, a hostile or broken one is dropped and counted, a line
whose worker left is closed, and the hub's listening socket is gone after shutdown."""

import os
import socket
import stat
import threading
import time

import numpy as np
import pytest

from nbdist.errors import TrainingError
from nbdist.hub import localline
from nbdist.hub.client import WorkerTransport
from nbdist.hub.control import HubControl
from nbdist.hub.protocol import Codec, new_key
from nbdist.wire.messages import Step
from tests.helpers import wait_for
from tests.inproc.test_hub_security import (
    PUSH,
    SIZE,
    assert_untouched,
    dropped_after,
    start_hubs,
    stop_hubs,
)

pytestmark = pytest.mark.skipif(not localline.enabled(), reason="no AF_UNIX SOCK_SEQPACKET here")


@pytest.fixture
def hub():
    key = new_key()
    hubs, threads = start_hubs(key)
    yield hubs[0], key
    stop_hubs(key, hubs, threads)
    assert hubs[0].error is None  # nothing sent on the line failed a handler


def raw_line(server) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 * localline.MAX_PACKET_BYTES)
    sock.settimeout(5)
    sock.connect(server.endpoints["local"])
    return sock


def packet(frames) -> bytes:
    return localline.table(frames) + b"".join(bytes(f) for f in frames)


def test_hostile_packets_on_the_local_line_are_dropped_counted_and_change_nothing(hub):
    server, key = hub
    line = raw_line(server)
    grad = np.full(SIZE, 100.0, np.float32)
    line.send(packet([b"\0" * 32 + b'{"op":"step"}']))  # unsigned
    # wrong key
    line.send(packet(Codec(new_key(), "intruder", "sec").encode(PUSH, [grad], to="hub-0")))
    line.send(packet([b"only-one-frame"]))  # truncated
    line.send(b"\x02\x00\x00\x00\x05\x00")  # a table that lies
    line.send(packet([bytes(localline.MAX_PACKET_BYTES)]))  # larger than any packet may be
    legit = Codec(key, "worker-x", "sec")
    frames = legit.encode({"op": "hello", "worker": 0}, to="hub-0")
    line.send(packet(frames))  # a valid message (answered on the line)...
    reply = localline.split(memoryview(line.recv(localline.MAX_PACKET_BYTES)), 6)
    assert legit.decode(reply).header["op"] == "reply"
    line.send(packet(frames))  # ...replayed
    signed, good = legit.encode(PUSH, [np.zeros(SIZE, np.float32)], to="hub-0")
    forged = bytearray(bytes(good))
    forged[403] ^= 0x7F  # one float altered, same length
    line.send(packet([signed, forged]))
    control = HubControl(key, [server.endpoints])
    assert dropped_after(control, 7) == {"bad signature": 3, "truncated message": 1,
                                         "malformed packet": 1, "oversized packet": 1,
                                         "replayed message": 1}
    assert_untouched(control)
    control.close()
    line.close()


def train_three_steps(transport) -> None:
    """hello, then three pushes of ones at lr 0.1: the weights must be 1 - 0.3."""
    reply = transport.hello()
    transport.grad[:] = 1.0
    for step in range(3):
        chunks = [reply.chunks[0].id] if step == 0 else []
        transport.step(Step(0, push=True, pull=True, chunks=chunks, loss=0.5))
    np.testing.assert_allclose(transport.params, np.ones(SIZE, np.float32) - 3 * np.float32(0.1),
                               rtol=1e-6)


def test_a_worker_trains_over_the_line_and_its_line_is_closed_when_it_leaves(hub):
    server, key = hub
    assert stat.S_IMODE(os.stat(server.endpoints["local"]).st_mode) == 0o600  # this user only
    transport = WorkerTransport(key, 0, [server.endpoints], 0, timeout=30)
    try:
        assert transport.line_kind == "local"
        train_three_steps(transport)
        assert server.local_lines == 1  # the worker's, open while it trains
        assert transport.traffic()[2] > 0  # the headers it sent count as shared-memory traffic
        transport.bye()
    finally:
        transport.close()
    control = HubControl(key, [server.endpoints])
    wait_for(lambda: server.local_lines == 0, 10, what="the hub to close the worker's line")
    assert control.stats()["dropped"] == {}
    control.close()


def test_the_listening_socket_is_removed_with_the_hub():
    key = new_key()
    hubs, threads = start_hubs(key)
    path = hubs[0].endpoints["local"]
    assert os.path.exists(path)
    stop_hubs(key, hubs, threads)
    assert not os.path.exists(path)


def test_a_worker_whose_hub_has_gone_gets_a_training_error_not_an_os_error():
    key = new_key()
    hubs, threads = start_hubs(key)
    transport = WorkerTransport(key, 0, [hubs[0].endpoints], 0, timeout=30)
    try:
        reply = transport.hello()
        stop_hubs(key, hubs, threads)
        with pytest.raises(TrainingError, match="hub shard 0 (closed its line|cannot be reached)"):
            transport.step(Step(0, push=True, pull=True, chunks=[reply.chunks[0].id], loss=0.5))
        with pytest.raises(TrainingError, match="hub shard 0 cannot be reached on its local line"):
            transport.lines[0].reopen()  # nobody listens there any more
    finally:
        transport.close()


class TickingClock:
    """A `time` whose clock moves 1/64 s each time this thread reads it: a spin loop sees its
    budget run out after a fixed number of polls, however fast or loaded the machine is.
    Other threads (other tests' hubs, still leaving) read the real clock."""

    def __init__(self):
        self.now, self.thread = 0.0, threading.get_ident()

    def monotonic(self) -> float:
        if threading.get_ident() != self.thread:
            return time.monotonic()
        self.now += 1 / 64
        return self.now


def test_a_spinning_inbox_polls_only_for_its_budget_and_then_sleeps(monkeypatch):
    import zmq

    from nbdist.hub import wire

    polls, here = [], threading.get_ident()  # this thread's polls: other tests' threads poll too
    poll = zmq.Poller.poll
    monkeypatch.setattr(zmq.Poller, "poll", lambda self, timeout=None: (
        threading.get_ident() == here and polls.append(timeout), poll(self, timeout))[1])
    monkeypatch.setattr(wire, "time", TickingClock())
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.bind("inproc://spin-test")
    try:
        for spin_s, spins in ((0.0, 0), (4 / 64, 4)):
            polls.clear()
            inbox = wire.Inbox(sock, None, 1 << 20, spin_s=spin_s)
            with pytest.raises(zmq.Again):
                inbox.next(timeout_ms=400)
            # polled without sleeping for the budget, then slept
            assert polls == [0] * spins + [400]
    finally:
        sock.close(0)
        ctx.term()


def test_a_spinning_worker_line_gives_up_after_its_budget_and_a_spinning_hub_trains_the_same(
        monkeypatch):
    import select
    from types import SimpleNamespace

    from nbdist.hub import lines
    from nbdist.wire.messages import Reply

    polls, here = [], threading.get_ident()

    class CountingPoll:  # select.poll's object on the line's socket (only the lines module's)
        def register(self, fd, events):
            pass

        def poll(self, timeout):
            polls.append(timeout)
            return []

    key = new_key()
    hubs, threads = start_hubs(key, spin_s=0.05)
    assert hubs[0].endpoints["spin_s"] == 0.05
    transport = WorkerTransport(key, 0, [hubs[0].endpoints], 0, timeout=30, spin_s=0.05)
    try:
        train_three_steps(transport)
        monkeypatch.setattr(lines, "time", TickingClock())
        monkeypatch.setattr(lines, "select", SimpleNamespace(  # other threads: the real one
            poll=lambda: CountingPoll() if threading.get_ident() == here else select.poll(),
            POLLIN=select.POLLIN))
        with pytest.raises(TrainingError, match="did not answer"):  # nothing was asked: no reply
            transport.lines[0].recv(Reply, timeout=0.3)
        assert polls == [0] * 4  # 0.05 s of the line's clock (4 readings), then it slept
    finally:
        transport.close()
        stop_hubs(key, hubs, threads)
