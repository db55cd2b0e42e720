"""Which way an overlapped exchange goes: the courier only over TCP, and the chooser that
times both ways (the courier's own thread: tests/inproc/test_courier_thread.py)."""

from __future__ import annotations

from nbdist.modes.common.courier import WayChooser, wanted


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
