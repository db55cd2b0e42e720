"""A lost shard started anew from the kernel's snapshot (nbdist/run/takeover.py), its pure
part: the `state` reply a snapshot keeps, turned into a new shard's start
(`checkpoint.store.shard_restore`), continues exactly like the shard that was not lost, counts
its steps on, and does not pause again at a --pause-at step already passed."""

import numpy as np

from nbdist.checkpoint.store import shard_restore
from nbdist.core.plan import Plan
from nbdist.core.shard import ShardCore
from nbdist.hub.export import shard_state
from nbdist.wire.messages import Hello, Step


def core(**kw) -> ShardCore:
    plan = Plan(**{**dict(num_workers=2, num_samples=64, epochs=1, batch_size=4, lr=0.5,
                          has_validation=False, algorithm="dc-asgd-a"), **kw})
    return ShardCore(plan, np.zeros(5, np.float32), np.zeros(0, np.float32), now=lambda: 0.0)


def hello(c: ShardCore) -> None:
    for w in (0, 1):
        c.hello(Hello(w, host="h", engine=w))
        c.reply(w, pull=True)


def train(c: ShardCore, pushes: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for i in range(pushes):
        w = i % 2
        chunks = [chunk.id for chunk in c.reply(w, pull=False).chunks][:1]
        c.push(Step(w, chunks=chunks, batch=4), rng.normal(size=5).astype(np.float32))
        c.reply(w, pull=True)
    c.settle()


def test_a_shard_started_from_its_snapshot_goes_on_exactly_like_the_one_not_lost():
    straight, lost = core(pause_at=3), core(pause_at=3)
    for c in (straight, lost):
        hello(c)
        train(c, 6, seed=1)  # paused itself after 3 steps; resumed below
        c.coordinator.paused = False
    reply, buffers = shard_state(lost)  # what the kernel keeps (signed arrays and numbers)
    params, non_trainable, restore = shard_restore(reply, buffers)
    restore["paused_at"] = True  # the kernel saw --pause-at's pause
    assert restore["version"] == 6 and restore["steps"] == lost.coordinator.steps_counted == 6
    taken = ShardCore(core(pause_at=3).plan, params, non_trainable, now=lambda: 0.0)
    taken.restore(restore)
    assert taken.coordinator.stats.global_step == 6 and taken.coordinator.plan.pause_at is None
    hello(taken)  # the workers start again and pull
    hello(straight)
    train(straight, 4, seed=2)
    train(taken, 4, seed=2)
    np.testing.assert_array_equal(taken.params, straight.params)
    assert taken.version == straight.version == 10
    assert taken.coordinator.steps_counted == straight.coordinator.steps_counted
    assert not taken.coordinator.paused


def test_without_the_pause_seen_a_taken_over_shard_still_pauses_at_its_step():
    lost = core(pause_at=5)
    hello(lost)
    train(lost, 2, seed=1)
    params, non_trainable, restore = shard_restore(*shard_state(lost))
    taken = ShardCore(lost.plan, params, non_trainable, now=lambda: 0.0)
    taken.restore(restore)
    hello(taken)
    train(taken, 3, seed=2)
    assert taken.coordinator.paused and taken.coordinator.steps_counted == 5


def test_a_free_engine_that_answers_takes_the_shard_its_own_engine_last():
    from nbdist.modes.async_ps.backend import spare_engine

    # shards on 0 and 1, workers on 2 and 3; engine 4 does not answer (dead or busy)
    alive = {0, 1, 2, 3, 5}.__contains__
    assert spare_engine(1, [0, 1], [2, 3], set(), [0, 1, 2, 3, 4, 5], alive) == (5, None)
    # only its own engine is free: its hub process died alone, the engine serves it again
    assert spare_engine(1, [0, 1], [2, 3], set(), [0, 1, 2, 3], alive) == (1, None)
    # a lost worker's engine that answers is free
    assert spare_engine(1, [0, 1], [2, 3], {0}, [0, 2, 3], {0, 2, 3}.__contains__) == (2, None)


def test_with_no_free_engine_the_last_workers_engine_takes_it_or_the_error_says_what_is_missing():
    import pytest

    from nbdist.errors import ClusterError
    from nbdist.modes.async_ps.backend import spare_engine

    assert spare_engine(0, [0], [1, 2], set(), [1, 2], lambda e: True) == (2, 1)
    # worker 1 is out and its engine (2) does not answer: worker 2, the last left, gives its own
    assert spare_engine(0, [0], [1, 2, 3], {1}, [1, 2, 3], lambda e: e != 2) == (3, 2)
    with pytest.raises(ClusterError, match=r"Hub shard 0 was lost and no engine can take it over "
                                           r"\(Received: the cluster's engines \[1\]; .*1 worker"
                                           r"\(s\) left on \[1\].*Expected a free engine.*"
                                           r"%nbdist start N"):
        spare_engine(0, [0], [1, 2], {1}, [1], lambda e: True)


def test_snapshots_come_every_two_seconds_or_50_times_as_long_as_one_takes(monkeypatch):
    import time
    from types import SimpleNamespace

    from nbdist.run.takeover import maybe_snapshot

    class Control:
        def __init__(self, takes):
            self.takes, self.calls = takes, 0

        def state(self):
            self.calls += 1
            time.sleep(self.takes)
            return ["shard 0's state"]

    def run_state(takes, mode="async"):
        return SimpleNamespace(config=SimpleNamespace(mode=mode), control=Control(takes),
                               hub_snapshot=None, hub_snapshot_next=0.0, run_id="r",
                               snapshot={"global_step": 7})

    quick = run_state(0.0)
    maybe_snapshot(quick)
    maybe_snapshot(quick)  # not due yet
    snap = quick.hub_snapshot
    assert quick.control.calls == 1 and snap.shards == ["shard 0's state"] and snap.step == 7
    assert quick.hub_snapshot_next - snap.taken_at == 2.0
    slow = run_state(0.1)  # a large model: 0.1 s a snapshot, so one in 5 s at most
    maybe_snapshot(slow)
    assert slow.hub_snapshot_next - slow.hub_snapshot.taken_at >= 5.0
    for off in (run_state(0.0, mode="local"), run_state(0.0)):
        monkeypatch.setenv("NBDIST_HUB_SNAPSHOT_S", "0" if off.config.mode == "async" else "2")
        maybe_snapshot(off)  # a mode that cannot take a shard over, or snapshots turned off
        assert off.control.calls == 0 and off.hub_snapshot is None
