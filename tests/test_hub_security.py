"""Nobody else on the hub's sockets: forged, truncated, oversized and replayed messages are
dropped and counted, the hub keeps serving, and the parameters do not change."""

import threading

import numpy as np
import pytest
import zmq

from nbdist.protocol import Codec, new_key
from nbdist.ps.client import HubControl, WorkerTransport
from nbdist.ps.coordinator import Plan
from nbdist.ps.hub import Hub, HubSpec

SIZE = 1000


@pytest.fixture
def hub():
    key = new_key()
    plan = Plan(num_workers=1, num_samples=100, epochs=1, batch_size=10, lr=0.1, has_validation=False)
    server = Hub(HubSpec("sec", key, 0, 1, plan, np.ones(SIZE, np.float32), np.zeros(0, np.float32)))
    assert server.endpoints["tcp"].startswith("tcp://127.0.0.1:")  # loopback, never all interfaces
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    yield server, key
    HubControl(key, [server.endpoints]).shutdown()
    thread.join(10)


def raw_socket(endpoint):
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    return sock


def test_hostile_messages_are_dropped_counted_and_change_nothing(hub):
    server, key = hub
    endpoint = server.endpoints["tcp"]
    push = {"op": "step", "worker": 0, "push": True, "pull": True, "chunks": [0]}
    grad = np.full(SIZE, 100.0, np.float32)
    attacker = raw_socket(endpoint)
    attacker.send_multipart([b"\0" * 32, b'{"op":"step"}'])  # unsigned
    attacker.send_multipart(Codec(new_key(), "intruder").encode(push, [grad]))  # wrong key
    attacker.send_multipart([b"only-one-frame"])  # truncated
    legit = Codec(key, "worker-x")
    frames = legit.encode({"op": "stats"})
    attacker.send_multipart(frames)  # a valid message (answered)...
    assert attacker.poll(5000)
    attacker.recv_multipart()
    attacker.send_multipart(frames)  # ...replayed
    attacker.send_multipart(legit.encode({"op": "nonsense"}))  # signed, unknown op
    oversized = legit.encode(push, [np.zeros(SIZE * 8, np.float32)])
    attacker.send_multipart(oversized)  # signed but far larger than the shard
    control = HubControl(key, [server.endpoints])
    for _ in range(50):  # the hub keeps serving
        stats = control.stats()
        if sum(stats["dropped"].values()) >= 7:
            break
    dropped = stats["dropped"]
    assert dropped.get("bad signature") == 2, dropped
    assert dropped.get("truncated message") == 1, dropped
    assert dropped.get("replayed message") == 1, dropped
    assert dropped.get("unknown op") == 1, dropped
    assert dropped.get("oversized message") == 1, dropped
    params, _ = control.params()
    np.testing.assert_array_equal(params, np.ones(SIZE, np.float32))  # nothing was applied
    assert stats["global_step"] == 0
    control.close()
    attacker.close()


def test_a_real_worker_still_trains_after_an_attack(hub):
    server, key = hub
    attacker = raw_socket(server.endpoints["tcp"])
    attacker.send_multipart(Codec(new_key(), "intruder").encode({"op": "hello", "worker": 0}))
    transport = WorkerTransport(key, 0, [server.endpoints], 0, transport="tcp")
    reply = transport.hello()
    np.testing.assert_array_equal(transport.params, np.ones(SIZE, np.float32))
    transport.grad[:] = 1.0
    reply = transport.step({"chunks": [reply["chunks"][0][0]], "loss": 0.5}, push=True, pull=True)
    np.testing.assert_allclose(transport.params, np.full(SIZE, 0.9, np.float32))  # 1 - 0.1 * 1
    transport.bye()
    transport.close()
    attacker.close()


def test_nothing_on_nbdist_sockets_is_unpickled():
    """The wire code never imports pickle: headers are JSON, buffers raw float32."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "nbdist"
    for path in [root / "protocol.py", *sorted((root / "ps").glob("*.py"))]:
        tree = ast.parse(path.read_text())
        imported = {a.name for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
                    for a in n.names} | {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not {"pickle", "cloudpickle", "dill", "marshal"} & imported, path
