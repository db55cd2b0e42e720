"""The courier's hand-off: one exchange at a time, on its own thread, errors back on the caller's."""

from __future__ import annotations

import threading
import time

import pytest

from nbdist.errors import TrainingError
from nbdist.hub.messages import Reply, Step
from nbdist.modes.common.courier import Courier, WayChooser, wanted


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
    assert not courier._thread.is_alive()  # noqa: SLF001


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
    assert not courier._thread.is_alive()  # noqa: SLF001


def test_a_second_send_before_the_reply_is_refused():
    courier = Courier(RecordingTransport(delay_s=0.05))
    try:
        courier.send(push(1))
        with pytest.raises(AssertionError, match="one exchange at a time"):
            courier.send(push(2))
        courier.receive()
    finally:
        courier.close()


def test_the_courier_is_for_tcp_only_and_can_be_turned_off(monkeypatch):
    monkeypatch.delenv("NBDIST_COURIER", raising=False)
    assert wanted("tcp") and not wanted("shm")
    monkeypatch.setenv("NBDIST_COURIER", "0")
    assert not wanted("tcp")


def test_the_chooser_measures_both_ways_in_alternating_blocks_then_keeps_the_faster():
    """Blocks of 2 steps: courier, own, courier, own. Courier steps take 1.0 s, own steps
    3.0 s; a block's first step straddles the switch and is not counted."""
    chooser = WayChooser(block=2, blocks=4, keep=3)
    now, ways = 0.0, []
    for _ in range(8 + 3):
        way = chooser.next(now)
        ways.append(way)
        now += 1.0 if way else 3.0
    assert ways == [True, True, False, False, True, True, False, False] + [True] * 3
    assert chooser.chosen is True


def test_the_chooser_keeps_the_worker_s_own_thread_when_its_steps_are_faster_and_measures_again():
    chooser = WayChooser(block=2, blocks=2, keep=2)
    now, ways = 0.0, []
    for _ in range(4 + 2 + 4):
        way = chooser.next(now)
        ways.append(way)
        now += 2.5 if way else 2.0
    assert ways == [True, True, False, False] + [False, False] + [True, True, False, False]
    assert chooser.chosen is False


def test_one_slow_step_does_not_decide_the_way():
    """A validation pass makes one courier step 100 s long: the medians still pick the courier."""
    chooser = WayChooser(block=4, blocks=2, keep=1)
    durations = [1.0, 1.0, 100.0, 1.0, 2.0, 2.0, 2.0, 2.0]
    now = 0.0
    for step in range(8):
        chooser.next(now)
        now += durations[step]
    assert chooser.next(now) is True


def test_the_chooser_counts_only_the_steps_inside_a_block():
    """The straddling steps (the first of each block) are very slow here and must not decide."""
    chooser = WayChooser(block=3, blocks=2, keep=1)
    durations = {0: 10.0, 1: 1.0, 2: 1.0, 3: 0.1, 4: 2.0, 5: 2.0}  # step -> its time
    now = 0.0
    for step in range(6):
        chooser.next(now)
        now += durations[step]
    assert chooser.next(now) is True  # courier's counted steps 1.0 each, own 2.0 each
