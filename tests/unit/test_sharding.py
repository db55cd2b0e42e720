"""The flat parameter vector cut into shards (`nbdist.core.sharding`); the cuts around
constrained variables are tested with the constraints (test_constraints.py)."""

import pytest

from nbdist.core.sharding import shard_bounds


@pytest.mark.parametrize("size,shards", [(100, 1), (100, 2), (1000, 3), (5, 2), (10_000_001, 4)])
def test_shard_bounds_cover_the_vector_contiguously(size, shards):
    bounds = shard_bounds(size, shards)
    assert len(bounds) == shards and bounds[0][0] == 0 and bounds[-1][1] == size
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:], strict=False))
    if size >= 16 * shards:
        assert all(lo % 16 == 0 for lo, _ in bounds)


def test_shard_bounds_by_hand():
    assert shard_bounds(100, 2) == [(0, 48), (48, 100)]
