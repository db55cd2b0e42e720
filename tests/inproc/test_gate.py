"""The gate of nbdist's bound sockets (`nbdist.hub.gate`) on real sockets: only holders of a
fresh token for this gate and this run finish the handshake, connections still in it are
capped, and a hub in its own process flooded by 512 peers without the key, a peer that never
ends a multipart message and ZeroMQ peers without credentials stays under 256 MB of growth
while a real worker trains."""

import socket
import time

import numpy as np
import psutil
import pytest
import zmq

from nbdist.hub.gate import CUT, HANDSHAKE_S, REFUSED, YOUNG_MARGIN, credentials
from nbdist.hub.protocol import new_key
from nbdist.hub.wire import client_socket, server_socket
from tests.helpers import wait_for
from tests.hostile import Flood

FLOOD_LIMIT_BYTES = 256 * 2**20


class Server:
    """A PULL socket behind a gate, bound on loopback, as a pipeline stage binds its own."""

    def __init__(self, key: bytes, peers: int = 1):
        self.ctx = zmq.Context()
        self.sock, self.gate = server_socket(self.ctx, key, 1 << 20, False, kind=zmq.PULL,
                                             peers=peers)
        self.endpoint = f"tcp://127.0.0.1:{self.sock.bind_to_random_port('tcp://127.0.0.1')}"
        self.info = {"endpoint": self.endpoint, "gate": self.gate.id}

    def received(self, count: int) -> list:
        """The next `count` messages (up to 10 s for each), and any that follow within 0.3 s."""
        got = []
        while self.sock.poll(10_000 if len(got) < count else 300):
            got.append(self.sock.recv())
        return got

    def close(self) -> None:
        self.sock.close(0)
        self.gate.stop()
        self.ctx.term()


def _push(ctx, info: dict, key: bytes | None, username: bytes | None = None,
          password: bytes | None = None):
    sock = client_socket(ctx, info, key, zmq.PUSH) if key else ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 0)
    if username is not None:
        sock.setsockopt(zmq.PLAIN_USERNAME, username)
        sock.setsockopt(zmq.PLAIN_PASSWORD, password)
    sock.connect(info["endpoint"])
    return sock


def test_only_a_fresh_token_of_this_gate_and_run_finishes_the_handshake():
    key = new_key()
    server, ctx = Server(key), zmq.Context()
    try:
        user, password = credentials(key, server.gate.id)
        first = _push(ctx, server.info, None, user, password)
        first.send(b"first")
        assert server.received(1) == [b"first"]
        intruders = [
            _push(ctx, server.info, None),  # no credentials at all (NULL)
            _push(ctx, server.info, None, user, password),  # the same token again: a replay
            # another run's key
            _push(ctx, server.info, None, *credentials(new_key(), server.gate.id)),
            # another gate's token
            _push(ctx, server.info, None, *credentials(key, "another-gate")),
        ]
        for sock in intruders:
            sock.send(b"intruder")
        legit = _push(ctx, server.info, key)  # a fresh token from client_socket
        legit.send(b"legit")
        assert server.received(1) == [b"legit"]  # no intruder got a byte through
        # the three tokens are refused by the gate's ZAP handler, each counted; the NULL peer is
        # refused by libzmq (counted when the server, not the client, notices the mismatch first)
        wait_for(lambda: server.gate.counts().get(REFUSED, 0) >= 3, 30,
                 what=lambda: f"three refused handshakes (counted: {server.gate.counts()})")
    finally:
        ctx.destroy(linger=0)
        server.close()


@pytest.mark.slow
def test_connections_still_in_the_handshake_are_capped_and_later_ones_get_in():
    key = new_key()
    server = Server(key, peers=0)  # YOUNG_MARGIN young connections at most
    ctx = zmq.Context()
    idle = [socket.create_connection(("127.0.0.1", int(server.endpoint.rsplit(":", 1)[1])))
            for _ in range(20)]
    try:
        wait_for(lambda: server.gate.counts().get(CUT, 0) >= 20 - YOUNG_MARGIN, 30,
                 what="the cut connections")
        assert server.gate.counts()[CUT] == 20 - YOUNG_MARGIN
        # libzmq closes the idle ones that were kept: they never authenticated
        time.sleep(HANDSHAKE_S + 0.5)
        legit = _push(ctx, server.info, key)
        legit.send(b"after")
        assert server.received(1) == [b"after"]
    finally:
        for conn in idle:
            conn.close()
        ctx.destroy(linger=0)
        server.close()


def _hub_process(key: bytes, size: int, monkeypatch) -> tuple[dict, psutil.Process]:
    """A hub shard in a process of its own, as an engine starts it: its endpoints and process."""
    from nbdist.core.coordinator import Plan
    from nbdist.hub.launch import hub_process, start_hub
    from nbdist.hub.server import HubSpec

    monkeypatch.setenv("NBDIST_HUB_PROCESS", "1")
    plan = Plan(num_workers=1, num_samples=10**9, epochs=1, batch_size=10, lr=0.1,
                has_validation=False)
    endpoints = start_hub(HubSpec("flood", key, 0, 1, plan, np.ones(size, np.float32),
                                  np.zeros(0, np.float32), idle_timeout=300))
    return endpoints, psutil.Process(hub_process("flood", 0).pid)


@pytest.mark.slow
def test_512_keyless_peers_and_an_endless_multipart_keep_a_hub_under_256_mb_while_a_worker_trains(
        monkeypatch):
    from nbdist.hub.client import WorkerTransport
    from nbdist.hub.control import HubControl
    from nbdist.hub.launch import join_hub
    from nbdist.wire.messages import Step

    key, size = new_key(), 250_000  # a 1 MB slice: frames up to ~3 MB are accepted
    endpoints, proc = _hub_process(key, size, monkeypatch)
    transport = WorkerTransport(key, 0, [endpoints], 0, transport="tcp", timeout=120)
    tcp = endpoints["tcp"]
    try:
        chunk = transport.hello().chunks[0].id
        transport.grad[:] = np.float32(1e-3)
        expected = np.ones(size, np.float32)
        for _ in range(5):  # the hub's buffers for this worker are in place before the baseline
            first = expected[0] == 1
            transport.step(Step(0, push=True, pull=True, chunks=[chunk] if first else [], loss=0.5))
            expected -= np.float32(0.1) * transport.grad
        base = peak = proc.memory_info().rss
        steps = 0
        floods = [Flood("pending", tcp, peers=512, frame_bytes=8 * size),
                  Flood("multipart", tcp, limit=1 << 30),
                  Flood("keyless", tcp, peers=64, messages=8, frames=6, frame_bytes=1 << 20),
                  Flood("garbage", tcp, peers=200)]
        for flood in floods:
            flood.__enter__()
        end = time.monotonic() + 10
        while time.monotonic() < end:
            transport.step(Step(0, push=True, pull=True, loss=0.5))
            expected -= np.float32(0.1) * transport.grad
            steps += 1
            peak = max(peak, proc.memory_info().rss)
        for flood in floods:
            flood.__exit__(None, None, None)
        # every push applied, nothing else
        np.testing.assert_allclose(transport.params, expected, rtol=1e-5)
        transport.bye()
    finally:
        transport.close()
    control = HubControl(key, [endpoints], name="probe")
    dropped = control.stats()["dropped"]
    control.shutdown()
    control.close()
    join_hub("flood", 0, 30)
    sent = {kind: f.stats
            for kind, f in zip(("pending", "multipart", "keyless", "garbage"), floods, strict=True)}
    print(f"flood: hub RSS +{(peak - base) / 2**20:.1f} MB over {base / 2**20:.0f} MB, "
          f"{steps} worker steps, hub counted {dropped}, attackers {sent}")
    assert steps >= 5, steps  # the worker kept training
    assert dropped.get(CUT, 0) > 0 and dropped.get(REFUSED, 0) > 0, dropped
    assert sent["pending"]["connections"] >= 512 and sent["multipart"]["connections"] == 1
    assert peak - base < FLOOD_LIMIT_BYTES, (peak - base) / 2**20


def test_a_flood_from_elsewhere_leaves_the_runs_planned_peers_their_handshake_slots(tmp_path):
    """Another user holds every young-connection slot open to anyone (20 idle connections from
    127.0.0.1; YOUNG_MARGIN are kept, the rest cut). The run's two planned peers, one over ipc
    and one from a planned address (127.0.0.2), still get in at once, well inside the
    HANDSHAKE_S during which the flood holds its slots (before: cut until the flood's slots
    expired). An unplanned newcomer is cut meanwhile."""
    key = new_key()
    ctx, clients = zmq.Context(), zmq.Context()
    sock, gate = server_socket(ctx, key, 1 << 20, False, kind=zmq.PULL, peers=2,
                               planned=["127.0.0.2"])
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    sock.bind(f"ipc://{tmp_path}/ipc")
    flood = [socket.create_connection(("127.0.0.1", port)) for _ in range(20)]
    try:
        wait_for(lambda: gate.counts().get(CUT, 0) >= 20 - YOUNG_MARGIN, 30, what="the flood cut")
        start = time.monotonic()
        newcomer = _push(clients, {"endpoint": f"tcp://127.0.0.1:{port}", "gate": gate.id}, key)
        newcomer.send(b"unplanned")
        peers = [_push(clients, {"endpoint": endpoint, "gate": gate.id}, key)
                 for endpoint in (f"ipc://{tmp_path}/ipc", f"tcp://127.0.0.2:0;127.0.0.1:{port}")]
        for peer in peers:
            peer.send(peer.getsockopt(zmq.LAST_ENDPOINT) or b"?")
        got = []
        while len(got) < 2 and sock.poll(10_000):
            got.append(sock.recv())
        assert time.monotonic() - start < HANDSHAKE_S - 1.0, "a planned peer waited for the flood"
        assert len(got) == 2 and b"unplanned" not in got, got  # the newcomer is not in yet
        assert gate.counts()[CUT] > 20 - YOUNG_MARGIN  # it was cut (it retries)
    finally:
        for conn in flood:
            conn.close()
        clients.destroy(linger=0)
        sock.close(0)
        gate.stop()
        ctx.term()
