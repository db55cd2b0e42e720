"""Large updates split into blocks: the ranges, and where the hub splits (the threads that
run the blocks, bit for bit against one pass: tests/inproc/test_blocks_threads.py)."""


from nbdist.algorithms.blocks import MIN_SPLIT, block_ranges, intersect
from nbdist.core.coordinator import Plan
from nbdist.core.updater import make_updater
from nbdist.hub.threads import split_updates

SIZE = MIN_SPLIT + 12345  # large enough to split, with a ragged last block


def test_block_ranges_cover_the_vector_once_with_aligned_inner_edges():
    assert block_ranges(10, 3, align=2, min_split=0) == [(0, 4), (4, 8), (8, 10)]
    assert block_ranges(10, 1, align=2, min_split=0) == [(0, 10)]
    assert block_ranges(100, 4) == [(0, 100)]  # small: one pass
    ranges = block_ranges(SIZE, 3)
    assert len(ranges) == 3 and ranges[0][0] == 0 and ranges[-1][1] == SIZE
    assert all(a[1] == b[0] and a[1] % (1 << 16) == 0 for a, b in zip(ranges[:-1], ranges[1:], strict=True))


def test_intersect_keeps_the_parts_of_runs_inside_a_range():
    assert intersect([(0, 3), (5, 9)], 2, 6) == [(2, 3), (5, 6)]
    assert intersect([(0, 3)], 3, 6) == []


def test_the_hub_splits_large_updates_only(monkeypatch):
    monkeypatch.setenv("NBDIST_HUB_THREADS", "2")
    plan = Plan(num_workers=1, num_samples=10, epochs=1, batch_size=1, lr=0.1,
                has_validation=False, algorithm="asgd")
    small = make_updater(plan, {}, None, 1000)
    assert split_updates(small) is None
    big = make_updater(plan, {}, None, SIZE)
    pool = split_updates(big)
    try:
        assert len(big.ranges) == pool.threads == 2
    finally:
        pool.close()
    monkeypatch.setenv("NBDIST_HUB_THREADS", "1")
    assert split_updates(make_updater(plan, {}, None, SIZE)) is None
