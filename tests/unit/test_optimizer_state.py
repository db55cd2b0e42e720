"""The run's optimizer state read from the hubs' checkpoint replies, as one state over every
trainable parameter (nbdist.fit.optimizer_state): exact, hand-made shards."""

import numpy as np

from nbdist.fit.optimizer_state import shard_slots
from nbdist.wire.messages import ShardState

ADAM = {"class_name": "Adam", "config": {}}


def shard(i: int, momentum: list, velocity: list, iterations: int = 7) -> tuple:
    names = ["params", "opt.momentum", "opt.velocity", "rule.sum"]
    arrays = [np.zeros(len(momentum), np.float32), np.array(momentum, np.float32),
              np.array(velocity, np.float32), np.zeros(1, np.float32)]
    return ShardState(shard=i, version=3, names=names, optimizer=ADAM,
                      numbers={"opt.iterations": iterations, "rule.count": 2}), arrays


def test_the_slots_of_every_shard_join_in_shard_order():
    state = shard_slots([shard(1, [3, 4, 5], [0.3, 0.4, 0.5]), shard(0, [1, 2], [0.1, 0.2])])
    assert state.iterations == 7 and state.ordered is None
    assert sorted(state.named) == ["momentum", "velocity"]  # the rule's arrays are not slots
    np.testing.assert_array_equal(state.named["momentum"], [1, 2, 3, 4, 5])
    np.testing.assert_array_equal(state.named["velocity"], np.float32([0.1, 0.2, 0.3, 0.4, 0.5]))


def test_no_state_where_the_workers_keep_the_optimizer():
    header, arrays = shard(0, [1.0], [1.0])
    header.optimizer = None
    assert shard_slots([(header, arrays)]) is None


def test_a_sync_run_hands_rank_0s_slots_in_keras_build_order():
    header = ShardState(shard=0, version=5, names=["params", "non_trainable", "optimizer_slots"],
                        sync={"optimizer": "Adam", "slots": [[2], [2]], "iterations": 11,
                              "steps": 11})
    arrays = [np.zeros(2, np.float32), np.zeros(0, np.float32), np.float32([1, 2, 3, 4])]
    state = shard_slots([(header, arrays)])
    assert state.iterations == 11 and state.named is None
    np.testing.assert_array_equal(state.ordered, [1, 2, 3, 4])
