"""--compression over a real hub's TCP line: the hub applies exactly what the worker's frames
say (its error feedback included), the worker's copy of the weights is exactly the hub's pulls
added up, and the frames are as small as their format says (the formats themselves:
tests/unit/test_compression_format.py)."""

import threading

import numpy as np
import pytest

from nbdist.core.compression import PullEncoder, PushEncoder, decode_add, parse
from nbdist.hub.client import WorkerTransport
from nbdist.hub.control import HubControl
from nbdist.hub.protocol import new_key
from nbdist.hub.server import Hub, HubSpec
from nbdist.wire.messages import Step
from tests.inproc.test_worker_loss import plan, start_hub, stop

LR = np.float32(0.1)


@pytest.mark.parametrize("codec", ["int8", "topk:0.05", "randomk:0.05", "qsgd:8", "fp16"])
def test_the_hub_applies_the_frames_the_worker_sends_and_the_worker_holds_the_pulls_sum(codec):
    hub, key, thread = start_hub(plan(num_workers=1, num_samples=200))
    control = HubControl(key, [hub.endpoints], timeout=10)
    worker = WorkerTransport(key, 0, [hub.endpoints], 0, "tcp", timeout=10, compression=codec,
                             seed=3)
    size = worker.total
    # the oracle: the same encoders, on the same gradients, from the same streams
    pushes = PushEncoder(codec, size, np.random.default_rng([3, 0, 0]))
    pulls = (PullEncoder(codec, size, np.random.default_rng([0, 0])) if parse(codec).lossy
             else None)
    applied = np.zeros(size, np.float32)  # what the hub's weights should be
    gradients = np.random.default_rng(11)
    try:
        reply = worker.hello()
        pushed = 0
        while not reply.done:
            if not reply.chunks:
                reply = worker.step(Step(0))
                continue
            worker.grad[:] = gradients.normal(size=size).astype(np.float32)
            sent_before = worker.lines[0].sent
            reply = worker.step(Step(0, push=True, pull=True, chunks=[reply.chunks[0].id],
                                     loss=0.0))
            pushed += 1
            frame_bytes = worker.lines[0].sent - sent_before
            assert frame_bytes - parse(codec).wire_bytes(size) < 1024  # the rest is the header
            decoded = np.zeros(size, np.float32)
            decode_add(pushes.encode(worker.grad), codec, decoded)
            applied -= LR * decoded
            if pulls is not None:  # the worker's weights: the pulls' copy, not the hub's own
                pulls.encode(applied)
                np.testing.assert_array_equal(worker.params, pulls.held)
        assert pushed == 50
        frames_sent, frames_received, float32_sent, float32_received = worker.traffic()[4:]
        assert float32_sent == 50 * 4 * size and float32_received == 51 * 4 * size  # hello's too
        assert frames_sent == 50 * parse(codec).wire_bytes(size)
        full = 4 * size if parse(codec).lossy else parse(codec).wire_bytes(size)  # hello's pull
        pull = parse(codec.replace("qsgd:8", "int8"))  # qsgd pulls as int8
        assert frames_received == full + 50 * pull.wire_bytes(size)
        np.testing.assert_allclose(control.params()[0], applied, rtol=1e-5, atol=1e-6)
        if pulls is None:  # fp16 pulls: the weights themselves, rounded
            np.testing.assert_allclose(worker.params, applied, rtol=2 ** -10, atol=1e-6)
    finally:
        stop(control, thread, [worker])


def test_a_codec_on_a_worker_that_shares_memory_with_its_hub_is_said_to_do_nothing():
    hub, key, thread = start_hub(plan(num_workers=1, num_samples=40))
    control = HubControl(key, [hub.endpoints], timeout=10)
    worker = WorkerTransport(key, 0, [hub.endpoints], 0, "auto", timeout=10, compression="int8")
    try:
        worker.hello()
        assert worker.link == "shm"
        (said,) = control.stats()["warnings"]
        assert said.startswith("--compression int8 applies only to workers that reach their "
                               "hub shards over TCP") and "--transport tcp" in said
    finally:
        stop(control, thread, [worker])


SHAPES = [(4, 8), (8,), (2, 12)]  # 64 floats: a kernel on each shard (powersgd), a bias


@pytest.mark.parametrize("codec", ["topk:0.1", "powersgd:1"])
def test_two_shards_each_keep_their_slices_error_feedback_and_copies(codec):
    """topk keeps k of each shard's slice, powersgd factors the matrices of each shard's slice:
    each shard's weights are its slice's oracle, and the worker's copy of each slice is that
    shard's pulls."""
    key, size = new_key(), 64
    p = plan(num_workers=1, num_samples=80, batch_size=4)
    hubs = [Hub(HubSpec("two", key, i, 2, p, np.zeros(size // 2, np.float32),
                        np.zeros(0, np.float32), offset=i * size // 2, shapes=SHAPES))
            for i in range(2)]
    threads = [threading.Thread(target=h.serve, daemon=True) for h in hubs]
    for t in threads:
        t.start()
    shards = [h.endpoints for h in hubs]
    control = HubControl(key, shards, timeout=10)
    worker = WorkerTransport(key, 0, shards, 0, "tcp", timeout=10, compression=codec, seed=5,
                             shapes=SHAPES)
    halves = [slice(0, size // 2), slice(size // 2, size)]
    codecs = [parse(codec).bind(SHAPES, h.start, h.stop) for h in halves]
    if codec.startswith("powersgd"):  # each shard factors its own kernel
        assert [c.matrices for c in codecs] == [((0, 4, 8),), ((8, 2, 12),)]
    pushes = [PushEncoder(c, size // 2, np.random.default_rng([5, 0, i]))
              for i, c in enumerate(codecs)]
    pulls = [PullEncoder(codec, size // 2, np.random.default_rng([i, 0])) for i in (0, 1)]
    applied = np.zeros(size, np.float32)
    gradients = np.random.default_rng(2)
    try:
        reply = worker.hello()
        while not reply.done:
            if not reply.chunks:
                reply = worker.step(Step(0))
                continue
            worker.grad[:] = gradients.normal(size=size).astype(np.float32)
            sent_before = worker.traffic()[4]
            reply = worker.step(Step(0, push=True, pull=True, chunks=[reply.chunks[0].id],
                                     loss=0.0))
            assert worker.traffic()[4] - sent_before == sum(c.wire_bytes(size // 2)
                                                            for c in codecs)
            for i, half in enumerate(halves):
                decoded = np.zeros(size // 2, np.float32)
                decode_add(pushes[i].encode(worker.grad[half]), codecs[i], decoded)
                applied[half] -= LR * decoded
                pulls[i].encode(applied[half])
                np.testing.assert_array_equal(worker.params[half], pulls[i].held)
        np.testing.assert_allclose(control.params()[0], applied, rtol=1e-5, atol=1e-6)
    finally:
        control.shutdown()
        for t in threads:
            t.join(10)
        worker.close()
        control.close()
