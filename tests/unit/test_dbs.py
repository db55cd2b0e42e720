import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nbdist.core.dbs import BatchSizer, allocate, fit_step_time
from nbdist.errors import ConfigError

# --- allocate -------------------------------------------------------------------------------


def test_speeds_one_two_four_split_seventy_exactly():
    assert allocate([1.0, 2.0, 4.0], 70) == [10, 20, 40]


def test_largest_remainder_gives_the_leftover_sample_to_the_largest_fraction():
    # 64/7 = 9.142.., 18.285.., 36.571..: floors 9 + 18 + 36 = 63; largest remainder is worker 2.
    assert allocate([1.0, 2.0, 4.0], 64) == [9, 18, 37]


def test_scaled_speeds_give_the_same_split():
    assert allocate([123.5, 247.0, 494.0], 64) == allocate([1, 2, 4], 64)


def test_equal_remainders_go_to_the_lower_worker_index():
    assert allocate([1, 1, 1], 10) == [4, 3, 3]


def test_clipping_at_b_min_moves_the_deficit_to_the_others():
    # Proportional: 70/31 = 2.26, 4.52, 63.2 -> workers 0 and 1 pinned at 8; 54 left for worker 2.
    assert allocate([1, 2, 28], 70, b_min=8) == [8, 8, 54]


def test_clipping_at_b_max_moves_the_excess_to_the_others_by_speed():
    # Proportional 10, 20, 40 -> worker 2 capped at 30; the other 40 split 1:2 -> 13.33, 26.67.
    assert allocate([1, 2, 4], 70, b_max=30) == [13, 27, 30]


def test_clipping_both_ends_keeps_the_sum():
    sizes = allocate([1, 5, 5, 100], 100, b_min=10, b_max=40)
    assert sizes == [10, 25, 25, 40] and sum(sizes) == 100


def test_bounds_that_cannot_hold_the_total_are_an_error():
    with pytest.raises(ConfigError, match=r"Cannot split a global batch of 100 over 3 workers"):
        allocate([1, 2, 4], 100, b_max=30)
    with pytest.raises(ValueError, match=r"Lower b_min"):
        allocate([1, 2, 4], 10, b_min=4)


def test_bad_bounds_and_no_workers_are_errors():
    with pytest.raises(ConfigError, match="b_min <= b_max"):
        allocate([1, 2], 10, b_min=6, b_max=5)
    with pytest.raises(ConfigError, match="b_min >= 1"):
        allocate([1, 2], 10, b_min=0)
    with pytest.raises(ConfigError, match="at least one worker"):
        allocate([], 10)


def test_negative_or_infinite_speed_is_an_error():
    with pytest.raises(ConfigError, match=r"speeds\[1\]=-1.0"):
        allocate([1.0, -1.0], 10)
    with pytest.raises(ConfigError, match=r"speeds\[0\]=inf"):
        allocate([math.inf, 1.0], 10)


def test_unmeasured_worker_gets_the_mean_speed():
    # Unknown speeds become mean(2, 4) = 3: speeds 3:2:4:3 over 48 -> 12, 8, 16, 12.
    assert allocate([0.0, 2.0, 4.0, None], 48) == [12, 8, 16, 12]
    assert allocate([math.nan, 2.0, 4.0, 0], 48) == [12, 8, 16, 12]


def test_no_measured_worker_means_an_equal_split():
    assert allocate([0, 0, 0], 30) == [10, 10, 10]
    assert allocate([None, None], 7) == [4, 3]


positive = st.floats(min_value=1e-3, max_value=1e6, allow_nan=False, allow_infinity=False)


@st.composite
def problems(draw):
    speeds = draw(st.lists(positive, min_size=1, max_size=12))
    m = len(speeds)
    b_min = draw(st.integers(1, 64))
    b_max = draw(st.one_of(st.none(), st.integers(b_min, 512)))
    total = draw(st.integers(m * b_min, m * (b_max if b_max is not None else 512)))
    return speeds, total, b_min, b_max


@settings(max_examples=300, deadline=None)
@given(problems())
def test_allocation_sums_to_total_within_bounds_and_faster_never_gets_less(problem):
    speeds, total, b_min, b_max = problem
    sizes = allocate(speeds, total, b_min, b_max)
    assert sum(sizes) == total
    assert all(b_min <= b <= (b_max if b_max is not None else total) for b in sizes)
    # Clipping is monotone too, so this holds whether or not a bound binds.
    for i, vi in enumerate(speeds):
        for j, vj in enumerate(speeds):
            if vi > vj:
                assert sizes[i] >= sizes[j], (speeds, sizes)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(1.0, 10.0), min_size=1, max_size=12), st.integers(120, 10_000))
def test_unclipped_allocation_is_within_one_of_proportional(speeds, total):
    # Speeds within 10x and total >= 10 * 12 keep every exact share >= 1: b_min never binds.
    sizes = allocate(speeds, total)
    for v, b in zip(speeds, sizes, strict=True):
        assert abs(b - total * v / sum(speeds)) < 1 + 1e-9


# --- BatchSizer ------------------------------------------------------------------------------


def feed(sizer, rates, samples=100):
    for w, r in enumerate(rates):
        sizer.observe(w, samples=samples, compute_s=samples / r)


def test_starts_with_the_base_batch_for_everyone():
    s = BatchSizer(num_workers=3, base_batch=32)
    assert s.batches == [32, 32, 32] and s.total == 96 and s.policy == "dbs"
    assert s.speeds == [0.0, 0.0, 0.0]


def test_speed_is_an_exact_moving_average_of_compute_rate():
    s = BatchSizer(num_workers=2, base_batch=10, ema=0.5)
    s.observe(0, samples=10, compute_s=0.5)  # 20/s seeds the average
    s.observe(0, samples=10, compute_s=0.25)  # 40/s
    s.observe(0, samples=10, compute_s=0.125)  # 80/s
    assert s.speeds == [55.0, 0.0]  # 0.5 * (0.5*20 + 0.5*40) + 0.5 * 80 = 15 + 40
    d = BatchSizer(num_workers=1, base_batch=10)  # default ema 0.2, as in RunStats
    d.observe(0, 10, 0.5)
    d.observe(0, 10, 0.25)
    assert d.speeds == [0.8 * 20 + 0.2 * 40]


def test_steps_without_time_or_samples_are_ignored():
    s = BatchSizer(num_workers=1, base_batch=10)
    s.observe(0, samples=10, compute_s=0.0)
    s.observe(0, samples=0, compute_s=1.0)
    assert s.speeds == [0.0]


def test_slow_worker_gets_smaller_batch_after_rebalance_every_k_pushes():
    s = BatchSizer(num_workers=3, base_batch=100, ema=1.0, rebalance_every=3)
    feed(s, [100.0, 200.0, 400.0])
    assert not s.maybe_rebalance() and not s.maybe_rebalance()
    assert s.batches == [100, 100, 100]
    assert s.maybe_rebalance()
    # 300 * 1/7, 2/7, 4/7 = 42.86, 85.71, 171.43 -> floors 298, remainders .857 > .714 > .429.
    assert s.batches == [43, 86, 171] and s.batch_for(0) == 43


def test_five_percent_speed_wobble_keeps_the_batches():
    s = BatchSizer(num_workers=3, base_batch=100, ema=1.0, rebalance_every=1)
    feed(s, [100.0, 200.0, 400.0])
    assert s.maybe_rebalance()
    feed(s, [105.0, 200.0, 400.0])  # would be 300*105/705 = 44.7 -> 45: +4.7% < 10%
    assert not s.maybe_rebalance()
    assert s.batches == [43, 86, 171]


def test_doubled_speed_moves_all_batches_and_keeps_the_sum():
    s = BatchSizer(num_workers=3, base_batch=100, ema=1.0, rebalance_every=1)
    feed(s, [100.0, 200.0, 400.0])
    s.maybe_rebalance()
    feed(s, [200.0, 200.0, 400.0])  # 300 * 1/4, 1/4, 1/2
    assert s.maybe_rebalance()
    assert s.batches == [75, 75, 150] and sum(s.batches) == s.total


def test_rebalance_every_zero_only_rebalances_when_asked():
    s = BatchSizer(num_workers=2, base_batch=30, ema=1.0, rebalance_every=0)
    feed(s, [100.0, 200.0])
    assert not any(s.maybe_rebalance() for _ in range(50))
    assert s.rebalance() and s.batches == [20, 40]


def test_fixed_policy_gives_everyone_the_base_batch():
    s = BatchSizer(num_workers=3, base_batch=100, ema=1.0, rebalance_every=1, policy="fixed")
    feed(s, [100.0, 200.0, 400.0])
    assert not s.maybe_rebalance() and s.batches == [100, 100, 100]
    s.set_policy("dbs")  # applied at once, from the speeds measured meanwhile
    assert s.batches == [43, 86, 171]
    s.set_policy("fixed")
    assert s.batches == [100, 100, 100]


def test_unknown_policy_lists_the_valid_ones():
    with pytest.raises(ConfigError, match=r"Unknown batch policy 'fast'.*\['dbs', 'fixed'\]"):
        BatchSizer(num_workers=2, base_batch=8, policy="fast")
    s = BatchSizer(num_workers=2, base_batch=8)
    with pytest.raises(ValueError, match="Unknown batch policy"):
        s.set_policy("adaptive")


def test_dropped_worker_share_goes_to_the_rest():
    s = BatchSizer(num_workers=3, base_batch=100, ema=1.0, rebalance_every=1)
    feed(s, [100.0, 200.0, 400.0])
    s.maybe_rebalance()
    s.drop(2)
    # B' = 2 * 100 split 1:2 -> 66.67, 133.33 -> [67, 133].
    assert s.batches == [67, 133, 0] and s.total == 200 and s.active == [0, 1]
    s.drop(2)  # reported twice: no-op
    assert s.batches == [67, 133, 0]
    with pytest.raises(ConfigError, match="Worker 2 was dropped"):
        s.batch_for(2)
    s.observe(2, 100, 0.1)  # a late push from the dropped worker is ignored
    assert s.speeds[2] == 400.0


def test_drop_under_fixed_policy_keeps_base_batches():
    s = BatchSizer(num_workers=3, base_batch=16, policy="fixed")
    s.drop(0)
    assert s.batches == [0, 16, 16]
    s.drop(1)
    s.drop(2)
    assert s.batches == [0, 0, 0] and s.total == 0 and not s.rebalance()


def test_bounds_are_respected_by_the_sizer():
    s = BatchSizer(num_workers=3, base_batch=100, b_min=50, b_max=150, ema=1.0, rebalance_every=1)
    feed(s, [100.0, 200.0, 400.0])
    assert s.maybe_rebalance()
    # 42.86, 85.71, 171.43: the cap takes more (21.43) than the floor adds (7.14), so worker 2 is
    # pinned at 150 first; the 150 left split 1:2 is 50, 100, inside the bounds.
    assert s.batches == [50, 100, 150]


def test_invalid_sizer_settings_are_errors():
    with pytest.raises(ConfigError, match="num_workers >= 1"):
        BatchSizer(num_workers=0, base_batch=8)
    with pytest.raises(ConfigError, match="base_batch must lie in"):
        BatchSizer(num_workers=2, base_batch=8, b_max=4)
    with pytest.raises(ConfigError, match="0 < ema <= 1"):
        BatchSizer(num_workers=2, base_batch=8, ema=0.0)
    with pytest.raises(ConfigError, match="Unknown worker 5"):
        BatchSizer(num_workers=2, base_batch=8).observe(5, 1, 1.0)


def test_equal_time_allocation_with_per_step_overhead_by_hand():
    """T = c + s·b: fast workers c = 1 ms, 30k samples/s; the slow one 3x both. B = 192:
    T* = (192 + 30 + 30 + 30) / (30000 + 30000 + 10000) s = 4.0286 ms,
    b_fast = 3.0286 ms x 30/ms = 90.86, b_slow = 1.0286 ms x 10/ms = 10.29 -> [91, 91, 10]."""
    from nbdist.core.dbs import allocate, equal_time_weights

    weights = equal_time_weights([(0.001, 1 / 30000), (0.001, 1 / 30000), (0.003, 1 / 10000)], 192)
    assert allocate(weights, 192) == [91, 91, 10]


def test_slow_worker_does_not_collapse_when_overhead_dominates():
    """A fixed cost per step makes samples/s fall with the batch; proportional allocation on
    samples/s would then shrink the slow worker's batch every rebalance. The fitted time model
    settles where step times are equal instead."""
    s = BatchSizer(num_workers=3, base_batch=64, rebalance_every=3)

    def step_time(worker, batch):
        c, per_sample = 0.001, 1 / 30000
        return (3 if worker == 2 else 1) * (c + per_sample * batch)

    for _ in range(60):  # a simulated run: each worker pushes at its current batch
        for w in range(3):
            b = s.batch_for(w)
            s.observe(w, b, step_time(w, b))
            s.maybe_rebalance()
    times = [step_time(w, s.batch_for(w)) for w in range(3)]
    assert sum(s.batches) == 192
    assert s.batch_for(2) >= 8  # did not collapse to b_min = 1
    assert max(times) / min(times) < 1.15  # iteration times equalised


def test_a_flat_step_time_is_no_fit_even_with_rounding_noise():
    # the mean of five 0.1s and one: the slope comes out ~1e-17, not 0, before rounding; a fit
    # whose slope rounds to 0 would divide by zero in equal_time_weights
    assert fit_step_time([(1, 0.1)] * 5 + [(3, 0.1)]) is None
