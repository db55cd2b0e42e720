"""The group-sync barrier: exact weighted means, flushing on regroup, leave and time-out."""

import time

import numpy as np

from nbdist.core.barrier import GroupBarrier


def g(*values):
    return np.array(values, dtype=np.float32)


def test_step_completes_when_every_member_pushed_with_batch_weighted_mean():
    b = GroupBarrier(2)
    assert b.add((0, 1), 0, g(1, 0), batch=1, read_version=3, header={"a": 0}) == []
    assert b.waiting(0) and not b.waiting(1)
    (step,) = b.add((0, 1), 1, g(0, 3), batch=2, read_version=4, header={"b": 1})
    np.testing.assert_allclose(step.mean, [1 / 3, 2.0])  # (1*[1,0] + 2*[0,3]) / 3
    assert step.batch == 3 and step.read_versions == {0: 3, 1: 4}
    assert not b.waiting(0) and not b.pending


def test_singleton_completes_at_once_and_flushes_a_stale_group_of_its_own():
    b = GroupBarrier(1)
    b.add((0, 1), 0, g(2), batch=1, read_version=0, header={})
    ready = b.add((1,), 1, g(4), batch=1, read_version=0, header={})
    assert sorted(s.members for s in ready) == [(0, 1), (1,)]
    assert not b.waiting(0)


def test_leaving_member_flushes_its_pending_steps():
    b = GroupBarrier(1)
    b.add((0, 1), 0, g(2), batch=1, read_version=0, header={})
    (step,) = b.drop(1)
    assert step.members == (0, 1) and list(step.headers) == [0]


def test_steps_waiting_too_long_expire():
    b = GroupBarrier(1)
    b.add((0, 1), 0, g(2), batch=1, read_version=0, header={})
    assert b.expired(10.0) == []
    time.sleep(0.02)  # deliberate: the step must be older than the 0.01 s limit
    assert [s.members for s in b.expired(0.01)] == [(0, 1)]
