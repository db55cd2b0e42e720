"""The simulator's network (`nbdist.modes.simulate.network.VirtualNetwork`) in sync: a step's
pull waits for one ring allreduce, an evaluation's for nothing (a rank evaluates the weights it
holds; before, each evaluation was charged a ring)."""

import numpy as np
import pytest

from nbdist.core.links import Link, ring_allreduce_s
from nbdist.modes.simulate.network import VirtualNetwork


def test_a_sync_steps_pull_waits_for_the_ring_and_an_evaluations_for_nothing():
    links = {**{str(w): Link(1e6, 5e-4) for w in range(4)}, "hub": Link(1e6, 5e-4)}
    network = VirtualNetwork("none", 4, count=200, non_trainable=0, links=links, seed=0,
                             sync=True)
    weights, out = np.arange(200, dtype=np.float32), np.zeros(200, np.float32)
    ring = ring_allreduce_s(800, [Link(1e6, 5e-4)] * 4)  # 6 rounds of 200 bytes and 1 ms
    assert ring == pytest.approx(6 * (8 * 200 / 1e6 + 1e-3))
    assert network.pull(1, 2.0, weights, out) == pytest.approx(2.0 + ring)
    np.testing.assert_array_equal(out, weights)
    assert network.pull(1, 3.0, weights, out, full=True) == 3.0
    gradient = np.ones(200, np.float32)
    received, arrives = network.push(1, 4.0, gradient)
    assert arrives == 4.0 and received is gradient  # the ring bypasses the hub
    assert network.traffic[1] == [0] * 8
