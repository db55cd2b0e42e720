"""Links that come back: a real hub, a worker's and the kernel's lines to it through TCP relays
(tests/relay.py) that reset every connection again and again. Each line opens a new socket with
new credentials and sends its latest request again; the hub answers a request it already had
from its cache, so every chunk is still applied exactly once (before: ZeroMQ reconnected with
the spent one-time token, the gate refused it forever, and the line timed out)."""

import time

import numpy as np
import pytest

from nbdist.hub.client import WorkerTransport
from nbdist.hub.control import HubControl
from nbdist.wire.messages import Step
from tests.inproc.test_worker_loss import (
    assert_each_chunk_applied_once,
    grad_for,
    plan,
    push,
    start_hub,
    stop,
)
from tests.relay import Relay

TIMEOUT_S = 5.0  # each line's reply timeout: a line that never comes back fails within it


def through(relay: Relay, endpoints: dict) -> dict:
    return {**endpoints, "tcp": relay.endpoint(endpoints["tcp"])}


def test_a_worker_and_the_kernel_train_on_through_links_reset_again_and_again():
    hub, key, thread = start_hub(plan(num_workers=1, num_samples=200))
    with Relay(hub.endpoints["tcp"]) as to_worker, Relay(hub.endpoints["tcp"]) as to_kernel:
        control = HubControl(key, [through(to_kernel, hub.endpoints)], timeout=TIMEOUT_S)
        worker = WorkerTransport(key, 0, [through(to_worker, hub.endpoints)], 0, "tcp",
                                 timeout=TIMEOUT_S)
        try:
            reply, applied = worker.hello(), []
            end = time.monotonic() + 60
            while not reply.done:
                assert time.monotonic() < end, "the run did not finish"
                reply = next_reply(worker, reply, applied)
                if len(applied) % 5 == 1:  # mid-run: the worker's line and the kernel's
                    to_worker.reset()
                    to_kernel.reset()
                    assert control.stats()["lost"] == []
            assert to_worker.resets >= 8 and to_kernel.resets >= 8
            assert worker.lines[0].redials >= 8 and control.lines[0].redials >= 8
            assert_each_chunk_applied_once(control, applied, 50)  # none twice, none lost
        finally:
            stop(control, thread, [worker])


def next_reply(worker, reply, applied: list):
    """The worker's next exchange: a push for the chunk `reply` gave it (counted in
    `applied`), or a wait for work."""
    if not reply.chunks:
        return worker.step(Step(worker.worker))
    cid = reply.chunks[0].id
    worker.grad[:] = grad_for(cid)
    applied.append(cid)
    return push(worker, cid)


@pytest.mark.slow
def test_a_reset_while_a_request_is_on_its_way_is_answered_once():
    """Resets at random moments (a thread, every 20 ms), so some fall between a request and
    its reply: the request is lost, or its reply is; either way it is answered, and applied
    once."""
    hub, key, thread = start_hub(plan(num_workers=1, num_samples=400))
    with Relay(hub.endpoints["tcp"]) as relay:
        control = HubControl(key, [hub.endpoints], timeout=TIMEOUT_S)
        worker = WorkerTransport(key, 0, [through(relay, hub.endpoints)], 0, "tcp",
                                 timeout=TIMEOUT_S)
        try:
            reply, applied = worker.hello(), []
            relay.reset_every(0.02, 100)
            while not reply.done:
                time.sleep(0.005)  # its compute: the run lasts a second or two
                reply = next_reply(worker, reply, applied)
            assert relay.resets >= 20 and worker.lines[0].redials >= 20, relay.resets
            assert_each_chunk_applied_once(control, applied, 100)
            assert np.isfinite(control.params()[0]).all()
        finally:
            stop(control, thread, [worker])


def test_a_reply_queued_before_the_hub_closes_is_read_not_lost_to_a_redial():
    """The hub answers Shutdown, then closes its socket: the kernel's line holds the reply and,
    at once, a lost connection. The reply is read first (before: the line redialled, which
    dropped the queued reply, asked the closed hub again and waited its whole timeout, at the
    end of about one run in eight)."""
    from nbdist.wire.messages import Ok, Shutdown

    hub, key, thread = start_hub(plan(num_workers=1))
    control = HubControl(key, [hub.endpoints], timeout=TIMEOUT_S)
    try:
        (line,) = control.lines
        line.send(Shutdown())
        thread.join(10)  # the hub has answered and closed its socket
        time.sleep(0.5)  # and the connection's end has reached the line's monitor
        reply, _ = line.recv(Ok, timeout=TIMEOUT_S)
        assert isinstance(reply, Ok) and line.redials == 0
    finally:
        control.close()
