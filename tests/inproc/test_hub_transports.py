"""The same pushes give the same weights over shared memory (headers over the local line or
ZeroMQ ipc) and over TCP, bit for bit: the hub reads a TCP gradient where its frame lies and
copies the reply out while updating."""

import threading

import numpy as np
import pytest

from nbdist.algorithms.optimizers import CACHE_BLOCKED_MIN, server_optimizer_spec
from nbdist.core.coordinator import Plan
from nbdist.hub.client import WorkerTransport
from nbdist.hub.control import HubControl
from nbdist.hub.protocol import new_key
from nbdist.hub.server import Hub, HubSpec
from nbdist.wire.messages import Step


def _train(transport: str, size: int, optimizer: dict | None,
           monkeypatch) -> tuple[np.ndarray, list[np.ndarray]]:
    monkeypatch.setenv("NBDIST_LOCAL_LINE", "0" if transport == "ipc" else "1")
    line = transport
    transport = "auto" if transport in ("local", "ipc") else transport
    key = new_key()
    plan = Plan(num_workers=1, num_samples=10**6, epochs=1, batch_size=10, lr=0.1,
                has_validation=False)
    start = np.random.default_rng(1).normal(size=size).astype(np.float32)
    hub = Hub(HubSpec("tx", key, 0, 1, plan, start, np.zeros(0, np.float32), optimizer=optimizer))
    thread = threading.Thread(target=hub.serve, daemon=True)
    thread.start()
    tr = WorkerTransport(key, 0, [hub.endpoints], 0, transport, timeout=60)
    rng, pulled = np.random.default_rng(2), []
    try:
        assert tr.use_shm == (transport == "auto") and tr.line_kind == line
        reply = tr.hello()
        for _ in range(4):
            tr.grad[:] = rng.normal(size=size).astype(np.float32)
            reply = tr.step(Step(0, push=True, pull=True, chunks=[reply.chunks[0].id], loss=0.0))
            pulled.append(tr.params.copy())
        tr.bye()
        control = HubControl(key, [hub.endpoints], name="test")
        final = control.params()[0]
        control.shutdown()
        control.close()
    finally:
        tr.close()
        thread.join(10)
    return final, pulled


@pytest.mark.parametrize("size, optimizer", [
    (5000, None),  # plain SGD, one block
    (CACHE_BLOCKED_MIN + 1000, server_optimizer_spec("adam", 0.01, [CACHE_BLOCKED_MIN + 1000])),
], ids=["sgd", "adam-cache-blocked"])
def test_tcp_and_shared_memory_give_identical_weights(size, optimizer, monkeypatch):
    shm_final, shm_pulls = _train("local", size, optimizer, monkeypatch)
    for line in ("ipc", "tcp"):
        final, pulls = _train(line, size, optimizer, monkeypatch)
        np.testing.assert_array_equal(shm_final, final)
        for a, b in zip(shm_pulls, pulls, strict=True):
            np.testing.assert_array_equal(a, b)  # every pull: the reply was the updated weights
    np.testing.assert_array_equal(shm_pulls[-1], shm_final)
