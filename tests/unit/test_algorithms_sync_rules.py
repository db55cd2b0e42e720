"""Update rules that wait for, average or exchange pushes (softsync, SSP, group sync,
EASGD), and the rule registry, on exact hand-computed numbers and docs/rules.md's properties.
The same conventions as test_algorithms.py: w = [1, 2], g = [0.5, -1], powers-of-two rates."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nbdist.algorithms import (
    ASGD,
    RULES,
    StalenessClock,
    easgd_alpha,
    elastic_exchange,
    form_groups,
    group_lr,
    make_rule,
    mean_into,
)
from nbdist.errors import ConfigError
from tests.rule_cases import f32, random_pushes, run

GRADIENT_RULES = sorted(set(RULES) - {"easgd"})  # easgd pushes an elastic difference, not g


# -- softsync ------------------------------------------------------------------------------

def test_softsync_applies_the_mean_of_c_pushes_by_hand():
    rule = make_rule("softsync", 2, num_workers=4, options={"n": 2})  # c = 4 // 2 = 2
    w = f32(1, 2)
    assert rule.on_push(0, w, f32(0.5, -1), 0.5, 0) is False and w.tolist() == [1, 2]
    assert rule.on_push(1, w, f32(1, 1), 0.25, 0) is True
    # Σ lr g = [0.25, -0.5] + [0.25, 0.25] = [0.5, -0.25]; w -= Σ / 2 = [0.75, 2.125]
    assert w.tolist() == [0.75, 2.125]


def test_softsync_with_n_equal_to_workers_is_asgd():
    schedule = random_pushes(seed=1)
    soft = run(make_rule("softsync", 5, 3, {"n": 3}), schedule)
    np.testing.assert_array_equal(soft, run(make_rule("asgd", 5, 3), schedule))


def test_softsync_flush_applies_what_is_left():
    rule = make_rule("softsync", 2, num_workers=3, options={"n": 1})  # c = 3
    w = f32(1, 2)
    rule.on_push(0, w, f32(0.5, -1), 0.5, 0)
    assert rule.flush(w) is True and w.tolist() == [0.75, 2.5]
    assert rule.flush(w) is False


def test_softsync_set_option_changes_the_batching():
    rule = make_rule("softsync", 2, num_workers=4, options={"n": 1})
    assert rule.pushes_per_update == 4
    rule.set_option("n", 4)
    assert rule.pushes_per_update == 1 and rule.on_push(0, f32(1, 2), f32(1, 1), 0.5, 0)


# -- ssp -----------------------------------------------------------------------------------

@settings(max_examples=300, deadline=None)
@given(num_workers=st.integers(1, 5), staleness=st.integers(0, 3),
       schedule=st.lists(st.tuples(st.integers(0, 4), st.integers(0, 19)), max_size=200))
def test_ssp_never_lets_a_worker_run_more_than_s_ahead(num_workers, staleness, schedule):
    clock = StalenessClock(num_workers, staleness)
    for worker, roll in schedule:
        worker %= num_workers
        if roll == 0:
            clock.drop(worker)
        elif not clock.blocked(worker):
            active = [clock.clocks[p] for p in clock.active]
            if worker in clock.active:  # it starts a step at most S ahead of the slowest
                assert clock.clocks[worker] - min(active) <= staleness
            clock.tick(worker)
        active = [clock.clocks[p] for p in clock.active]
        if active:
            assert max(active) - min(active) <= staleness + 1
            assert any(not clock.blocked(p) for p in clock.active)  # the slowest can always go


def test_ssp_with_zero_staleness_is_lockstep():
    clock = StalenessClock(3, staleness=0)
    clock.tick(0)
    assert clock.blocked(0) and not clock.blocked(1)
    clock.tick(1)
    assert clock.blocked(0) and clock.blocked(1) and not clock.blocked(2)
    clock.tick(2)
    assert not any(clock.blocked(p) for p in range(3)) and clock.clocks == (1, 1, 1)


def test_dropped_worker_stops_holding_others_back_and_rejoins_at_the_slowest():
    clock = StalenessClock(2, staleness=1)
    clock.tick(0)
    clock.tick(0)
    assert clock.blocked(0)
    clock.drop(1)
    assert not clock.blocked(0) and not clock.blocked(1)
    clock.join(1)
    assert clock.clocks == (2, 2)


def test_ssp_rule_is_sgd_and_validates_its_staleness():
    rule = make_rule("ssp", 2, 2, {"staleness": 0})
    w = f32(1, 2)
    assert rule.on_push(0, w, f32(0.5, -1), 0.5, 0) and w.tolist() == [0.75, 2.5]
    rule.set_option("staleness", 1)
    assert rule.options == {"staleness": 1}
    with pytest.raises(ConfigError, match="whole number"):
        rule.set_option("staleness", 1.5)


# -- group ---------------------------------------------------------------------------------

def test_equal_speeds_form_one_group():
    assert form_groups([3.0] * 5) == [[0, 1, 2, 3, 4]]


def test_speeds_1_1_2_2_4_form_three_groups():
    assert form_groups([1, 1, 2, 2, 4]) == [[0, 1], [2, 3], [4]]
    assert form_groups([4, 1, 2, 1, 2]) == [[1, 3], [2, 4], [0]]


def test_speed_ratio_of_exactly_max_ratio_shares_a_group():
    assert form_groups([1, 1.5, 2.25]) == [[0, 1], [2]]


@given(st.lists(st.floats(0.01, 1000), min_size=1, max_size=30))
def test_groups_partition_workers_within_the_ratio_and_cannot_merge(rates):
    groups = form_groups(rates)
    assert sorted(i for g in groups for i in g) == list(range(len(rates)))
    for group in groups:
        speeds = [rates[i] for i in group]
        assert max(speeds) <= 1.5 * min(speeds) * (1 + 1e-9)
    for slow, fast in zip(groups, groups[1:], strict=False):  # greedy: as few groups as possible
        assert min(rates[i] for i in fast) > 1.5 * min(rates[i] for i in slow)


def test_asked_number_of_groups_minimises_the_widest_group():
    rates = [1, 1.1, 3, 3.3, 10]
    assert form_groups(rates, num_groups=3) == [[0, 1], [2, 3], [4]]
    # two groups: {1, 1.1, 3}, {3.3, 10} spans at most 3.03x, better than {1..3.3}, {10} (3.3x)
    assert form_groups(rates, num_groups=2) == [[0, 1, 2], [3, 4]]
    # ... but with 20 instead of 10, cutting off the fastest alone is best (3.3x < 6.06x)
    assert form_groups([1, 1.1, 3, 3.3, 20], num_groups=2) == [[0, 1, 2, 3], [4]]
    assert form_groups(rates, num_groups=1) == [[0, 1, 2, 3, 4]]
    assert form_groups(rates, num_groups=5) == [[0], [1], [2], [3], [4]]
    with pytest.raises(ValueError, match="num_groups must be between 1 and the number of workers"):
        form_groups(rates, num_groups=6)


def test_non_positive_speed_is_refused():
    with pytest.raises(ValueError, match="positive and finite"):
        form_groups([1.0, 0.0])


def test_group_rate_scales_with_its_batch():
    assert group_lr(0.1, group_batch=96, ref_batch=32) == pytest.approx(0.3)
    assert group_lr(0.1, 37, 37) == 0.1


def test_mean_into_averages_in_place():
    out = np.empty(2, np.float32)
    # ([1, 2] + [3, -2] + [2, 3]) / 3 = [2, 1]
    assert mean_into(out, [f32(1, 2), f32(3, -2), f32(2, 3)]).tolist() == [2, 1]


def test_one_group_of_all_workers_is_synchronous_sgd():
    grads = [f32(0.5, -1), f32(1, 1), f32(0, 0), f32(-0.5, 2)]
    mean = mean_into(np.empty(2, np.float32), grads)  # [0.25, 0.5]
    lr = group_lr(0.125, group_batch=4 * 32, ref_batch=32)  # 0.5
    w = f32(1, 2)
    make_rule("group", 2, 4).on_push(0, w, mean, lr, 0)
    # synchronous SGD on the global batch, linearly scaled rate: [1, 2] - 0.5 * [0.25, 0.5]
    assert w.tolist() == [0.875, 1.75]


def test_singleton_groups_are_asgd():
    schedule = random_pushes(seed=2)
    rule, w = make_rule("group", 5, 3), np.linspace(-1, 1, 5, dtype=np.float32)
    one = np.empty(5, np.float32)
    for worker, g, lr in schedule:
        rule.on_push(worker, w, mean_into(one, [g]), group_lr(lr, 32, 32), 0)
    np.testing.assert_array_equal(w, run(make_rule("asgd", 5, 3), schedule))


def test_form_groups_follows_max_ratio_and_a_number_of_groups():
    assert form_groups([1, 1, 2, 2, 4], 2.0) == [[0, 1, 2, 3], [4]]
    assert form_groups([1, 1, 2, 2, 4], 2.0, 3) == [[0, 1], [2, 3], [4]]


# -- easgd ---------------------------------------------------------------------------------

def test_elastic_exchange_by_hand():
    x, center = f32(1, 2), f32(0, 0)
    e = elastic_exchange(x, center, alpha=0.5)
    # e = 0.5 * ([1, 2] - [0, 0]); x -= e; center += e
    assert e.tolist() == [0.5, 1] and x.tolist() == [0.5, 1] and center.tolist() == [0.5, 1]


def test_elastic_exchange_conserves_the_sum():
    rng = np.random.default_rng(3)
    x, center = rng.standard_normal(6), rng.standard_normal(6)
    total = x + center
    elastic_exchange(x, center, 0.3, out=np.empty(6))
    np.testing.assert_allclose(x + center, total, rtol=1e-12)


def test_easgd_default_alpha_is_0_9_over_workers_and_hub_adds_the_push():
    assert easgd_alpha(4) == pytest.approx(0.225)
    rule = make_rule("easgd", 2, num_workers=4)
    assert rule.options == {"alpha": pytest.approx(0.225)}
    w = f32(1, 2)
    assert rule.on_push(0, w, f32(0.5, -1), lr=123.0, delay=7) and w.tolist() == [1.5, 1]



def test_rule_classes_are_registered_by_name():
    assert RULES["asgd"] is ASGD
    assert sorted(RULES) == ["asgd", "async-local-sgd", "dc-asgd", "dc-asgd-a", "ddc-asgd",
                             "diloco", "easgd", "group", "hogwild", "softsync", "ssp",
                             "streaming-diloco"]


def test_fused_push_and_read_equals_push_then_copy_across_blocks():
    from nbdist.algorithms import make_rule
    from nbdist.algorithms.blocks import BLOCK

    rng = np.random.default_rng(0)
    size = 2 * BLOCK + 123  # more than one block, and a ragged tail
    w0, g = rng.normal(size=size).astype(np.float32), rng.normal(size=size).astype(np.float32)
    for name in ("asgd", "dc-asgd"):  # the fused override, and the base-class fallback
        fused, plain = make_rule(name, size, 1), make_rule(name, size, 1)
        wa, wb, out = w0.copy(), w0.copy(), np.empty(size, np.float32)
        fused.on_pull(0, wa, 0)
        plain.on_pull(0, wb, 0)
        assert fused.push_and_read(0, wa, g, 0.1, 0, out)
        plain.on_push(0, wb, g, 0.1, 0)
        np.testing.assert_array_equal(wa, wb)
        np.testing.assert_array_equal(out, wb)
