"""The names of a pipeline stage's optimizer slots, from the stage's variables to the kernel's
(nbdist.modes.pipeline.optimizer_slots): pure, exact."""

import numpy as np

from nbdist.modes.pipeline.optimizer_slots import (
    StageSlots,
    kernel_names,
    kernel_state,
    slot_owners,
)


class Var:
    def __init__(self, path):
        self.path = path


def test_each_slot_goes_to_the_variable_keras_named_it_after_the_longest_name_winning():
    paths = ["seq/d/kernel", "seq/d/bias", "seq/d/kernel_1"]
    names = ["iteration", "learning_rate", "seq_d_kernel_momentum", "seq_d_kernel_1_momentum",
             "seq_d_bias_velocity", "seq_d_kernel_1_velocity_hat"]
    assert slot_owners(paths, names) == [None, None, (0, "momentum"), (2, "momentum"),
                                         (1, "velocity"), (2, "velocity_hat")]
    assert slot_owners(["seq/d/kernel"], ["seq_d_kernel_"]) == [None]  # a name, no slot


def test_the_kernel_names_each_slot_after_its_own_variable_at_that_place():
    kernel = [Var("sequential_4/dense_9/kernel"), Var("sequential_4/dense_9/bias")]
    assert kernel_names(kernel, [0, 1, 0], ["momentum", "momentum", "velocity"]) == [
        "sequential_4_dense_9_kernel_momentum", "sequential_4_dense_9_bias_momentum",
        "sequential_4_dense_9_kernel_velocity"]


def test_every_stages_slots_make_one_state_with_the_step_count_none_without_slots():
    graph = {3: [Var("m/a/kernel")], 5: [Var("m/b/kernel"), Var("m/b/bias")]}

    def variables_of(steps):
        return [v for k in steps for v in graph[k]]

    first = StageSlots([3], [0], ["momentum"], [np.ones(2)], 7)
    second = StageSlots([5], [1, 0], ["momentum", "momentum"], [np.zeros(1), np.full(3, 2.0)], 7)
    state = kernel_state([first, second], variables_of)
    assert state.iterations == 7 and state.named is None and state.ordered is None
    assert sorted(state.by_name) == ["m_a_kernel_momentum", "m_b_bias_momentum",
                                     "m_b_kernel_momentum"]
    np.testing.assert_array_equal(state.by_name["m_b_kernel_momentum"], [2.0, 2.0, 2.0])
    assert kernel_state([StageSlots([3], [], [], [], 0)], variables_of) is None
