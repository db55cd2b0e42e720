"""Sync under int8, qsgd, topk or randomk: every rank's frame gathered and summed in rank order
(nbdist.core.gathered), exact against the ranks' own encoders, the same on every rank."""

import numpy as np
import pytest

from nbdist.core.compression import PushEncoder, decode, parse
from nbdist.core.gathered import GatheredFrames

COUNT = 1000


def gather(messages):
    """What an allgather gives every rank: every message, one row each, in rank order."""
    return np.stack([m.copy() for m in messages])


@pytest.mark.parametrize("codec", ["int8", "qsgd:8", "topk:0.05", "randomk:0.05"])
def test_every_rank_sums_every_ranks_frame_as_its_own_encoder_made_it(codec):
    ranks = [GatheredFrames(codec, COUNT, np.random.default_rng([4, r, 3])) for r in range(3)]
    oracles = [PushEncoder(codec, COUNT, np.random.default_rng([4, r, 3])) for r in range(3)]
    data = np.random.default_rng(0)
    for step in range(3):
        gradients = [data.normal(size=COUNT).astype(np.float32) for _ in ranks]
        controls = [np.array([r, step], np.float32) for r in range(3)]
        rows = gather([f.message(g, c) for f, g, c in zip(ranks, gradients, controls,
                                                          strict=True)])
        expected = np.zeros(COUNT, np.float32)
        for oracle, gradient in zip(oracles, gradients, strict=True):
            expected += decode(oracle.encode(gradient), codec, COUNT)
        sums = [f.sum(rows) for f in ranks]
        for total, control in sums:
            np.testing.assert_array_equal(total, expected)  # rank order: the same additions
            assert control.tolist() == [3.0, 3.0 * step]
    assert rows.shape == (3, parse(codec).wire_bytes(COUNT) + 8)


def test_topks_error_feedback_stays_with_each_rank_and_nothing_is_lost():
    ranks = [GatheredFrames("topk:0.02", COUNT, np.random.default_rng(r)) for r in range(2)]
    data = np.random.default_rng(1)
    applied, pushed = np.zeros(COUNT), np.zeros(COUNT)
    for _ in range(30):
        gradients = [data.normal(size=COUNT).astype(np.float32) for _ in ranks]
        pushed += gradients[0].astype(np.float64) + gradients[1]
        rows = gather([f.message(g, np.zeros(0, np.float32))
                       for f, g in zip(ranks, gradients, strict=True)])
        applied += ranks[0].sum(rows)[0]
    residuals = ranks[0].push.residual + ranks[1].push.residual.astype(np.float64)
    np.testing.assert_allclose(applied + residuals, pushed, atol=1e-4)
