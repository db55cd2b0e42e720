"""The courier's hand-off: one exchange at a time, on its own thread, errors back on the
caller's."""

from __future__ import annotations

import threading
import time

import pytest

from nbdist.errors import TrainingError
from nbdist.modes.common.courier import Courier
from nbdist.wire.messages import Reply, Step


def courier_threads() -> list[threading.Thread]:
    """The courier threads alive in this process (it names its thread)."""
    return [t for t in threading.enumerate() if t.name == "nbdist-courier"]


class RecordingTransport:
    """Stands in for WorkerTransport: records which thread made each call, in order."""

    def __init__(self, fail: BaseException | None = None, delay_s: float = 0.0):
        self.calls: list[tuple[str, str]] = []
        self.fail, self.delay_s = fail, delay_s

    def send_step(self, step):
        assert step.push and step.pull
        self.calls.append(("send", threading.current_thread().name))
        self.step = step

    def receive_step(self, step):
        assert step is self.step
        time.sleep(self.delay_s)
        self.calls.append(("receive", threading.current_thread().name))
        if self.fail is not None:
            raise self.fail
        return Reply(version=step.chunks[0])


def push(n, **fields):
    return Step(0, push=True, pull=True, chunks=[n], **fields)


def test_the_exchange_runs_on_the_courier_s_thread_and_its_reply_comes_back():
    transport = RecordingTransport()
    courier = Courier(transport)
    try:
        for n in range(3):
            sent_at = time.perf_counter()
            courier.send(push(n, group=[1]))
            reply, replied_at = courier.receive()
            assert reply == Reply(version=n) and replied_at >= sent_at
            assert transport.step.group == [1]
    finally:
        courier.close()
    assert transport.calls == [("send", "nbdist-courier"), ("receive", "nbdist-courier")] * 3
    assert not courier_threads()


def test_an_error_in_the_exchange_is_raised_by_receive_and_the_courier_goes_on():
    transport = RecordingTransport(fail=TrainingError("hub shard 0 did not answer within 1s"))
    courier = Courier(transport)
    try:
        courier.send(push(1))
        with pytest.raises(TrainingError, match="did not answer"):
            courier.receive()
        transport.fail = None
        courier.send(push(2))
        assert courier.receive()[0] == Reply(version=2)
    finally:
        courier.close()


def test_close_waits_for_an_exchange_in_flight_before_the_transport_can_close():
    transport = RecordingTransport(delay_s=0.2)
    courier = Courier(transport)
    courier.send(push(1))
    courier.close()  # the worker failed mid-step: its sockets must be idle before they close
    assert transport.calls[-1] == ("receive", "nbdist-courier")
    assert not courier_threads()


def test_a_second_send_before_the_reply_is_refused():
    courier = Courier(RecordingTransport(delay_s=0.05))
    try:
        courier.send(push(1))
        with pytest.raises(RuntimeError, match="one exchange at a time"):
            courier.send(push(2))
        courier.receive()
    finally:
        courier.close()
