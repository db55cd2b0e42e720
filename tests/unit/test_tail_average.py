"""Tail averaging on the shard core (nbdist/core/tail_average.py): which updates are averaged,
what the shard hands back, the model's constraints on the mean, and where it is off; each with
hand-computed numbers."""

import numpy as np
import pytest

from nbdist.core.plan import Plan
from nbdist.core.shard import ShardCore
from nbdist.core.tail_average import TailAverage, tail_start
from nbdist.wire.messages import Hello, Step

UNIT_NORM = {"variable": "k", "start": 0, "shape": [2], "class_name": "UnitNorm",
             "config": {"axis": 0}, "epsilon": 0.0}


def one_worker_core(average_tail, size=2, constraints=(), sync=False):
    """One worker, 4 samples, batch 1, plain SGD at rate 1 (`lr` 1: w -= g)."""
    plan = Plan(num_workers=1, num_samples=4, epochs=1, batch_size=1, lr=1.0,
                has_validation=False, average_tail=average_tail)
    core = ShardCore(plan, np.zeros(size, np.float32), np.zeros(0, np.float32),
                     now=lambda: 0.0, constraints=constraints, sync=sync)
    core.hello(Hello(0))
    core.chunk = core.reply(0, pull=True).chunks[0].id
    return core


def push(core, grad):
    """One push of `grad` for the chunk the worker holds, then its next pull."""
    core.push(Step(0, push=True, chunks=[core.chunk], batch=1), np.asarray(grad, np.float32))
    core.settle()
    reply = core.reply(0, pull=True)
    if reply is not None and reply.chunks:
        core.chunk = reply.chunks[0].id


def test_the_shard_hands_back_the_mean_of_the_updates_after_the_tail_starts():
    core = one_worker_core(average_tail=0.5)  # 4 samples: updates 3 and 4 are averaged
    for _ in range(2):
        push(core, [1.0, 2.0])
        assert core.result_weights().tolist() == core.params.tolist()  # not in the tail yet
    push(core, [1.0, 2.0])  # w = (-3, -6)
    push(core, [1.0, 2.0])  # w = (-4, -8)
    assert core.params.tolist() == [-4.0, -8.0]  # the shard itself trains on, unaveraged
    assert core.result_weights().tolist() == [-3.5, -7.0]
    assert core.tail.count == 2


def test_no_tail_hands_back_the_last_update_and_a_copy():
    core = one_worker_core(average_tail=0.0)
    assert core.tail is None
    push(core, [1.0, 2.0])
    weights = core.result_weights()
    assert weights.tolist() == [-1.0, -2.0]
    weights[0] = 9.0
    assert core.params[0] == -1.0


def test_the_mean_keeps_the_models_constraints():
    """UnitNorm's set (the circle) is not convex: the mean of two points on it lies inside,
    so the hub normalises the mean as it does every update."""
    core = one_worker_core(average_tail=0.5, constraints=[UNIT_NORM])
    for grad in ([-1.0, 0.0], [-1.0, 0.0], [1.0, -1.0], [1.0, 1.0]):
        push(core, grad)  # after each: (1, 0), (1, 0), (0, 1), (-1, 0) on the circle
    got = core.result_weights()  # mean of (0, 1) and (-1, 0) = (-0.5, 0.5), normalised
    np.testing.assert_allclose(got, [-0.5 ** 0.5, 0.5 ** 0.5], rtol=1e-6)


def test_the_simulators_sync_mode_averages_nothing():
    assert one_worker_core(average_tail=0.5, sync=True).tail is None


@pytest.mark.parametrize(("fraction", "epochs", "samples", "start"), [
    (0.1, 2, 12000, 21600), (0.5, 1, 4, 2), (0.25, 3, 100, 225), (0.0, 2, 100, None),
    (0.1, 2, None, None), (0.1, 2, 0, None)])
def test_the_tail_starts_after_the_share_of_the_runs_samples(fraction, epochs, samples, start):
    assert tail_start(fraction, epochs, samples) == start


def test_an_update_counts_its_samples_and_is_averaged_once_they_pass_the_start():
    tail = TailAverage(start=100)
    w = np.ones(3, np.float32)
    tail.add(w, 60)
    tail.add(2 * w, 40)  # 100 samples: still not past the start
    assert (tail.samples, tail.count) == (100, 0)
    tail.add(3 * w, 1)
    tail.add(5 * w, 64)
    assert (tail.samples, tail.count) == (165, 2)
    assert tail.result(w).tolist() == [4.0, 4.0, 4.0]


def test_a_shard_restored_from_its_export_averages_the_same_updates_as_one_never_stopped():
    straight, broken = one_worker_core(0.5), one_worker_core(0.5)
    for grad in ([1.0, 2.0], [1.0, 2.0], [1.0, 2.0]):  # the third update is in the tail
        push(straight, grad)
        push(broken, grad)
    saved = broken.export()
    resumed = one_worker_core(0.5)
    resumed.restore({"version": saved["version"], "rule": {}, "opt": saved["opt_state"],
                     "tail": saved["tail_state"]})
    resumed.params[:] = saved["params"]
    push(straight, [1.0, 2.0])
    push(resumed, [1.0, 2.0])
    assert resumed.result_weights().tolist() == straight.result_weights().tolist() == [-3.5, -7.0]


def test_a_checkpoint_from_before_the_tail_restores_nothing():
    tail = TailAverage(start=10)
    tail.restore({})
    assert (tail.samples, tail.count) == (0, 0)
    tail.restore({"samples": 12, "count": 3})  # no sum: nothing to average from
    assert (tail.samples, tail.count) == (12, 0)
