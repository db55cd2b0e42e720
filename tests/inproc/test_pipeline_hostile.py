"""A pipeline stage's and the kernel's sockets receive as strictly as the hub (real sockets, no
cluster): what fails the size limits, the MAC, the envelope (run, replay) or the frame table
is dropped and counted by reason, never raised, and the stage keeps taking its neighbour's
messages. (The same attacks against a real run on a cluster: tests/cluster/.)"""

from __future__ import annotations

import json

import numpy as np
import pytest
import zmq

from nbdist.hub.protocol import Codec, mac, new_key, send_frames
from nbdist.hub.wire import client_socket
from nbdist.modes.pipeline.kernel_link import KernelLink
from nbdist.modes.pipeline.link import StageLink
from nbdist.modes.pipeline.messages import Forward, Ops
from tests.helpers import wait_for

LIMITS = (3, 64 * 1024 + 4096)  # at most 2 arrays, 4 KB of them beside the header


@pytest.fixture
def stages():
    key = new_key()
    kernel = KernelLink(key, "r", "127.0.0.1", 2)
    a, b = (StageLink(key, "r", s, "127.0.0.1", 10, LIMITS, transport="tcp") for s in (0, 1))
    a.connect({"stage-1": b.info}, kernel.report_endpoint, kernel.control_endpoint)
    b.connect({"stage-0": a.info}, kernel.report_endpoint, kernel.control_endpoint)
    ctx = zmq.Context()
    yield key, kernel, a, b, ctx
    ctx.destroy(linger=0)
    a.close()
    b.close()
    kernel.close()


def _past_the_gate(ctx, key: bytes, info: dict):
    """A peer that passed the gate (as if it held a token): what it sends meets the limits and
    the MAC."""
    sock = client_socket(ctx, info, key, zmq.PUSH)
    sock.connect(info["endpoint"])
    return sock


def _signed(key: bytes, header: dict) -> bytes:
    """A header signed with the run key but written by hand (envelope included)."""
    raw = json.dumps({"run": "r", "from": "stage-0/forged", "to": "stage-1", "seq": 1, "nbytes": [],
                      **header}).encode()
    return mac(key, raw) + raw


def test_a_stage_drops_and_counts_what_fails_the_limits_the_mac_or_the_checks(stages):
    key, _, a, b, ctx = stages
    attacker = _past_the_gate(ctx, key, b.info)
    x = np.arange(8, dtype=np.float32)
    forward = {"op": "F", "step": 1, "mb": 0, "src": "stage-0", "shapes": [[8]], "dtypes": ["<f4"]}
    attacker.send_multipart([b"\0" * 32 + b'{"op":"F"}'])  # unsigned
    attacker.send_multipart([b"short"])  # truncated
    # oversized: more bytes than any message
    attacker.send_multipart([b"\0" * 32 + b"{}", bytes(LIMITS[1])])
    attacker.send_multipart([b"\0" * 32 + b"{}", b"", b"", b""])  # oversized: more frames
    frames = a.codec.encode(forward, [x], to="stage-1")
    send_frames(attacker, frames)  # a stage-0 message...
    send_frames(attacker, frames)  # ...and its replay
    # table
    send_frames(attacker, a.codec.encode({**forward, "step": 2, "shapes": [[9]]}, [x],
                                         to="stage-1"))
    send_frames(attacker, a.codec.encode({**forward, "step": 3, "dtypes": ["O"]}, [x],
                                         to="stage-1"))
    # not an op a stage sends
    send_frames(attacker, a.codec.encode({**forward, "op": "X"}, [x], to="stage-1"))
    send_frames(attacker, a.codec.encode({**forward, "step": "4"}, [x], to="stage-1"))
    send_frames(attacker, Codec(key, "stage-0", "another-run").encode(forward, [x], to="stage-1"))
    no_slot = {"op": "ack", "src": "stage-0", "seg": "nbdist-x", "gen": 1, "slot": 0}
    attacker.send(_signed(key, no_slot))  # an ack of no slot
    expected = {"bad signature": 1, "truncated message": 1, "oversized message": 2,
                "replayed message": 1, "malformed header": 4, "wrong run": 1, "stale ack": 1}
    wait_for(lambda: (b.drain(), sum(b.dropped.values()) >= sum(expected.values()))[1], 30,
             what=lambda: f"the drops (counted: {dict(b.dropped)})")
    assert dict(b.dropped) == expected
    np.testing.assert_array_equal(b.buffer.pop(("F", 1, 0))[1][0], x)  # the one genuine message
    assert b.buffer == {}
    a.send("stage-1", Forward(5), [x + 1])  # the neighbour's traffic still flows
    np.testing.assert_array_equal(b.wait(("F", 5, 0))[2][0], x + 1)
    assert b.drops() == expected  # nobody was refused or cut at the gate


def test_the_kernel_drops_and_counts_bad_reports_and_the_stages_keep_reporting(stages):
    from nbdist.modes.pipeline.runtime import PipelineControl

    key, kernel, a, _, ctx = stages
    control = PipelineControl(kernel, 2, [0, 1], epochs=1, steps_per_epoch=10, micro_batches=2)
    try:
        attacker = _past_the_gate(ctx, key, kernel.report_endpoint)
        attacker.send_multipart([b"\0" * 32 + b'{"op":"step"}'])  # unsigned
        attacker.send_multipart([b"\0" * 32 + b"{}", b"an array"])  # a report carries no arrays
        codec = Codec(key, "stage-1", "r")
        send_frames(attacker, codec.encode({"op": "ops", "stage": "one", "step": 1}, to="kernel"))
        no_stage = {"op": "ops", "stage": 7, "step": 1}
        send_frames(attacker, codec.encode(no_stage, to="kernel"))
        a.report(Ops(0, 10, {"shm": 0, "tcp": 1}, {"bad signature": 2}, step=1,
                     ops=[("F", 0, 0.0, 1.0)]))
        wait_for(lambda: control.pipeline()["dropped"][0], 30, what="stage 0's report")
        info = wait_for(lambda: (i := control.pipeline())
                        and sum(i["kernel_dropped"].values()) >= 4 and i, 30,
                        what=lambda: "the kernel's drops "
                                     f"({control.pipeline()['kernel_dropped']})")
        assert info["kernel_dropped"] == {"bad signature": 1, "oversized message": 1,
                                          "malformed header": 2}
        assert (info["dropped"] == [{"bad signature": 2}, {}]
                and info["messages"][0] == {"shm": 0, "tcp": 1})
    finally:
        control.close()  # (its link, the kernel's, is the fixture's: closed twice, harmlessly)
