"""A pipeline stage's links, bounded and coming back (real sockets, no cluster): a neighbour
that stops reading makes a send fail within the timeout, naming it, instead of queueing
without bound; a link reset by a relay (tests/relay.py) is made again and its latest messages
reach the neighbour once each."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager

import numpy as np
import pytest

from nbdist.errors import TrainingError
from nbdist.hub.protocol import new_key
from nbdist.modes.pipeline.kernel_link import KernelLink
from nbdist.modes.pipeline.link import SEND_QUEUE, StageLink
from nbdist.modes.pipeline.messages import Alive, Forward
from tests.relay import Relay

LIMITS = (3, 64 * 1024 + 4096)


def two_stages(timeout: float, relayed: bool = False):
    """A kernel's sockets and stages 0 and 1, connected over TCP; with `relayed`, stage 0's
    socket to stage 1 goes through a relay (the last item)."""
    key = new_key()
    kernel = KernelLink(key, "r", "127.0.0.1", 2)
    a, b = (StageLink(key, "r", s, "127.0.0.1", timeout, LIMITS, transport="tcp") for s in (0, 1))
    relay = Relay(b.info["endpoint"]) if relayed else None
    to_b = b.info if relay is None else {**b.info, "endpoint": relay.endpoint(b.info["endpoint"])}
    a.connect({"stage-1": to_b}, kernel.report_endpoint, kernel.control_endpoint)
    b.connect({"stage-0": a.info}, kernel.report_endpoint, kernel.control_endpoint)
    return kernel, a, b, relay


@contextmanager
def alive(kernel: KernelLink):
    """The kernel's `Alive` broadcast every 0.1 s, as its monitor's polls send it: a stage
    that hears none for its lease (here half of a 1 s timeout) takes the kernel for dead and
    stops waiting for room."""
    stop = threading.Event()

    def speak():
        while not stop.wait(0.1):
            kernel.broadcast(Alive())

    thread = threading.Thread(target=speak)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def close(*links) -> None:
    for link in links:
        link.close()


def test_a_neighbour_that_stops_reading_fails_a_send_within_the_timeout_not_a_growing_queue():
    """Stage 1 reads nothing: stage 0's queue towards it holds SEND_QUEUE messages (beside
    what the socket buffers hold), then a send fails after the timeout (before: SNDHWM 0, the
    queue grew with every message until the stage timed out waiting). The kernel is alive:
    the waiting send reads its `Alive`s (before, a wait longer than the lease took the kernel
    for dead and dropped the message silently)."""
    kernel, a, b, _ = two_stages(timeout=1.0)
    x = np.ones(4096, np.float32)  # 16 KB
    sent = 0
    try:
        with alive(kernel), pytest.raises(TrainingError,
                                          match="could not send to stage-1 for 1s"):
            while sent < 20 * SEND_QUEUE:
                a.send("stage-1", Forward(sent + 1, 0), [x])
                sent += 1
        assert SEND_QUEUE <= sent < 10 * SEND_QUEUE, sent
    finally:
        close(a, b, kernel)


@pytest.mark.timeout(120)
def test_a_reset_link_between_stages_comes_back_and_delivers_each_message_once():
    """Stage 0 sends 300 forwards while the relay resets the link every 30 ms: its socket is
    made again each time and its latest messages sent again; stage 1 takes each once, in
    order, and drops the copies it had as replays (before: the gate refused the reconnect with
    its spent token, and every later message was lost)."""
    kernel, a, b, relay = two_stages(timeout=5.0, relayed=True)
    x = np.arange(256, dtype=np.float32)
    try:
        relay.reset_every(0.03, 30)
        for step in range(1, 301):
            a.send("stage-1", Forward(step, 0), [x + step])
            b.drain()
            time.sleep(0.002)
        got = []
        for step in range(1, 301):
            end = time.monotonic() + 10
            while ("F", step, 0) not in b.buffer:  # stage 0 waits meanwhile, as in its schedule
                assert time.monotonic() < end, f"forward {step} never came ({a.redials})"
                a.check_links()
                b.drain()
                time.sleep(0.01)
            message, arrays = b.buffer.pop(("F", step, 0))
            np.testing.assert_array_equal(arrays[0], x + step)
            got.append(message.step)
        assert got == list(range(1, 301)) and b.buffer == {}
        assert relay.resets >= 5 and a.redials["stage-1"] >= 5, (relay.resets, a.redials)
    finally:
        relay.close()
        close(a, b, kernel)


def test_a_fit_calls_epoch_gate_weights_to_the_kernel_release_and_rate_to_the_stages():
    """A cell's fit call: each stage sends its weights to the kernel at an epoch's end (arrays
    in frames, within the kernel's `weights_limits`) and waits until the kernel releases the
    epoch; a new rate reaches every stage. A report with frames it should not have, or a
    Weights whose counts do not match its arrays, is dropped and counted."""
    import threading

    from nbdist.modes.pipeline.checks import weights_limits
    from nbdist.modes.pipeline.messages import NewRate, Release, StepDone, Weights

    key = new_key()
    kernel = KernelLink(key, "r", "127.0.0.1", 2, limits=weights_limits([64, 16, 4096]))
    a, b = (StageLink(key, "r", s, "127.0.0.1", 5.0, LIMITS, transport="tcp") for s in (0, 1))
    a.connect({"stage-1": b.info}, kernel.report_endpoint, kernel.control_endpoint)
    b.connect({"stage-0": a.info}, kernel.report_endpoint, kernel.control_endpoint)
    try:
        w = [np.arange(16, dtype=np.float32), np.ones(4, np.float32),
             np.full(16, 0.5, np.float32)]  # the first variable's optimizer slot
        a.report(Weights(0, 3, [0, 2], [1, 1], slot_of=[0], slot_names=["momentum"],
                         iterations=4), w)
        step = a.codec.encode(StepDone(1, 0, 0.5, 8, 0.0).encode(), [np.ones(2, np.float32)],
                              to="kernel")  # signed, but a step report has no frames
        a._push("kernel", step)  # noqa: SLF001 - what link.report never sends
        b.report(Weights(1, 3, [5], [2]), [np.ones(2, np.float32)])  # 2 counted, 1 sent
        b.report(Weights(1, 3, [5], [1], slot_of=[1], slot_names=["momentum"]),
                 [np.ones(2, np.float32)] * 2)  # a slot of a variable it did not send
        got = []
        end = time.monotonic() + 5
        while len(got) < 1 and time.monotonic() < end:
            received = kernel.receive(100)
            if received is not None:
                got.append(received)
        (report, arrays), = got
        assert isinstance(report, Weights) and (report.stage, report.epoch) == (0, 3)
        assert (report.slot_of, report.slot_names, report.iterations) == ([0], ["momentum"], 4)
        assert [x.tolist() for x in arrays] == [x.tolist() for x in w]
        end = time.monotonic() + 5
        while kernel.drops().get("malformed header", 0) < 3 and time.monotonic() < end:
            assert kernel.receive(100) is None  # each one dropped (None), never handed on
        assert kernel.drops() == {"malformed header": 3}, kernel.drops()

        released = []
        waiting = [threading.Thread(target=lambda link=link: released.append(
            link.wait_release(3) or link.stage)) for link in (a, b)]
        for t in waiting:
            t.start()
        time.sleep(0.3)
        assert not released  # the epoch gate holds both stages
        kernel.broadcast(NewRate(0.25))
        kernel.broadcast(Release(3))
        for t in waiting:
            t.join(5)
        assert sorted(released) == [0, 1]
        assert a.new_rate == b.new_rate == 0.25
    finally:
        close(a, b, kernel)


def test_the_kernel_hands_the_callbacks_the_weights_of_the_epoch_that_ended_not_the_one_before():
    """At a fit call's epoch gate the last stage's EvalDone (the epoch ended) can come before
    another stage's weights of that epoch: the kernel waits for them, and never hands out the
    previous epoch's, which it still holds."""
    import threading

    from nbdist.errors import TrainingError
    from nbdist.modes.pipeline.messages import EvalDone, Weights
    from nbdist.modes.pipeline.runtime import PipelineControl

    class QuietLink:
        def receive(self, timeout_ms):
            time.sleep(timeout_ms / 1000)

        def broadcast(self, control):
            pass

        def drops(self):
            return {}

        def close(self):
            pass

    control = PipelineControl(QuietLink(), 2, [0, 1], 3, 10, 2)
    try:
        for stage in (0, 1):
            control._absorb_weights(Weights(stage, 0, [stage], [1]),  # noqa: SLF001
                                    [np.full(2, 10.0 + stage, np.float32)])
        control._absorb(EvalDone(10, 0, 0.0))  # noqa: SLF001 - epoch 0 ended
        assert control.epoch_weights(1.0)[1][0].tolist() == [11.0, 11.0]
        control._absorb(EvalDone(20, 1, 0.0))  # noqa: SLF001 - epoch 1 ended ...
        control._absorb_weights(Weights(1, 1, [1], [1]),  # noqa: SLF001 - ... stage 1's in
                                [np.full(2, 21.0, np.float32)])
        with pytest.raises(TrainingError, match=r"end of epoch 2 within 0s \(Received: stages "
                           r"\[1\]\)"):
            control.epoch_weights(0.3)  # not epoch 0's weights
        late = threading.Timer(0.2, lambda: control._absorb_weights(  # noqa: SLF001
            Weights(0, 1, [0], [1]), [np.full(2, 20.0, np.float32)]))
        late.start()
        got = control.epoch_weights(5.0)
        assert got[0][0].tolist() == [20.0, 20.0] and got[1][0].tolist() == [21.0, 21.0]
        # after the last epoch there is no gate: asked then (the run's monitor keeps each
        # epoch's weights), it says so at once instead of waiting out its timeout
        control._absorb(EvalDone(30, 2, 0.0))  # noqa: SLF001
        started = time.monotonic()
        with pytest.raises(TrainingError, match="epoch 3 is the run's last"):
            control.epoch_weights(60.0)
        assert time.monotonic() - started < 1
    finally:
        control.close()
