"""Pinning this process to cores reaches every thread it has, and unpinning restores them
(the placement itself is pure: tests/unit/test_affinity.py)."""

import os
import threading

import pytest

from nbdist.cluster import affinity


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs sched_setaffinity and two cores")
def test_pin_process_reaches_every_thread_and_unpin_restores_them():
    before = os.sched_getaffinity(0)
    ready, stop, seen = threading.Event(), threading.Event(), {}

    def other():  # started before the pin: it must be pinned too
        ready.set()
        stop.wait(10)
        seen["pinned"] = os.sched_getaffinity(0)

    thread = threading.Thread(target=other)
    thread.start()
    ready.wait(10)
    core = min(before)
    try:
        assert affinity.pin_process((core,))
        assert os.sched_getaffinity(0) == {core}
    finally:
        stop.set()
        thread.join(10)
        affinity.unpin_process()
    assert seen["pinned"] == {core}
    assert os.sched_getaffinity(0) == before
    assert not affinity.pin_process((max(before) + 1000,))  # a core it may not use: nothing changes
    assert os.sched_getaffinity(0) == before
