"""Update rules on exact, hand-computed numbers, and the properties in ALGORITHMS.md.

Most cases use w = [1, 2], g = [0.5, -1] and rates that are powers of two, so float32 is
exact and the expected values in the comments are the arithmetic done by hand.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nbdist.algorithms import (
    ASGD,
    RULES,
    SnapshotStore,
    StalenessClock,
    dc_compensate,
    ddc_beta,
    easgd_alpha,
    elastic_exchange,
    form_groups,
    group_lr,
    make_rule,
    mean_into,
    sgd_step,
)
from nbdist.errors import ConfigError

GRADIENT_RULES = sorted(set(RULES) - {"easgd"})  # easgd pushes an elastic difference, not g


def f32(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float32)


def stale_push(rule, lr: float = 0.5) -> np.ndarray:
    """Worker 0 reads w = [1, 2]; worker 1 reads it too and pushes [1, 1] (w -> [0.5, 1.5]);
    then worker 0 pushes g = [0.5, -1] computed at [1, 2], one version late."""
    w = f32(1, 2)
    rule.on_pull(0, w, 0)
    rule.on_pull(1, w, 0)
    assert rule.on_push(1, w, f32(1, 1), lr, 0)
    rule.on_pull(1, w, 1)
    assert rule.on_push(0, w, f32(0.5, -1), lr, 1)
    return w


def random_pushes(seed: int = 0, pushes: int = 12, size: int = 5, workers: int = 3):
    """A reproducible interleaving: (worker, gradient, lr) per push."""
    rng = np.random.default_rng(seed)
    return [(int(rng.integers(workers)), rng.standard_normal(size).astype(np.float32),
             float(rng.uniform(0.01, 0.5))) for _ in range(pushes)]


def run(rule, schedule, size: int = 5) -> np.ndarray:
    """Apply `schedule` as the hub would: each worker pulls right after its push."""
    w = np.linspace(-1, 1, size, dtype=np.float32)
    version, read = 0, {}
    for worker in {p[0] for p in schedule}:
        rule.on_pull(worker, w, version)
        read[worker] = version
    for worker, g, lr in schedule:
        if rule.on_push(worker, w, g, lr, version - read[worker]):
            version += 1
        rule.on_pull(worker, w, version)
        read[worker] = version
    return w


# -- every rule ----------------------------------------------------------------------------

@pytest.mark.parametrize("name", GRADIENT_RULES)
def test_fresh_push_is_exactly_one_sgd_step(name):
    rule = make_rule(name, size=2, num_workers=4)
    w = f32(1, 2)
    rule.on_pull(0, w, 0)
    assert rule.on_push(0, w, f32(0.5, -1), lr=0.5, delay=0) is True
    # [1, 2] - 0.5 * [0.5, -1] = [0.75, 2.5]
    assert w.tolist() == [0.75, 2.5]


@pytest.mark.parametrize("name", sorted(RULES))
def test_push_allocates_nothing_proportional_to_the_model(name):
    size = 250_000  # 1 MB of float32
    rule = make_rule(name, size, num_workers=2)
    w, g = np.ones(size, np.float32), np.full(size, 0.5, np.float32)
    for worker in (0, 1):
        rule.on_pull(worker, w, 0)
    rule.on_push(0, w, g, 0.1, 0)  # warm-up
    tracemalloc.start()
    try:
        rule.on_push(1, w, g, 0.1, 1)
        rule.on_push(1, w, g, 0.1, 2)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64_000


def test_only_hogwild_reads_live_memory():
    assert [n for n, r in RULES.items() if not r.consistent_reads] == ["hogwild"]


def test_unknown_algorithm_lists_the_valid_ones():
    with pytest.raises(ValueError, match="Unknown algorithm 'dcasgd'. Expected one of: asgd, dc-asgd,"):
        make_rule("dcasgd", 2, 2)


def test_unknown_option_lists_valid_names_and_defaults():
    with pytest.raises(ConfigError, match=r"^Unknown option 'lamda' for dc-asgd. Valid: lambda0=0.04.$"):
        make_rule("dc-asgd", 2, 2, {"lamda": 1})
    with pytest.raises(ValueError, match="Valid: lambda0=2, ms_decay=0.95, epsilon=1e-07, momentum=0.9"):
        make_rule("ddc-asgd", 2, 2, {"mu": 0.5})
    with pytest.raises(ValueError, match=r"for asgd. Valid: \(none\)"):
        make_rule("asgd", 2, 2).set_option("momentum", 0.9)


@pytest.mark.parametrize(("name", "option", "value"), [
    ("dc-asgd", "lambda0", -1.0), ("dc-asgd-a", "ms_decay", 1.0), ("ddc-asgd", "momentum", 1.0),
    ("softsync", "n", 0), ("softsync", "n", 5), ("softsync", "n", 1.5), ("ssp", "staleness", -1),
    ("dc-asgd", "lambda0", float("nan")), ("dc-asgd", "lambda0", True), ("group", "max_ratio", 0.5),
    ("easgd", "alpha", 2.0),
])
def test_out_of_range_option_is_refused(name, option, value):
    rule = make_rule(name, 2, 4)
    with pytest.raises(ConfigError, match=f"Option '{option}' of {name} must be"):
        rule.set_option(option, value)
    assert rule.options == make_rule(name, 2, 4).options  # unchanged


def test_options_report_the_defaults_and_live_changes():
    rule = make_rule("softsync", 2, num_workers=6)
    assert rule.options == {"n": 6}
    rule.set_option("n", 3.0)
    assert rule.options == {"n": 3} and isinstance(rule.options["n"], int)


def test_asgd_state_is_one_scratch_buffer():
    assert make_rule("asgd", 1000, 8).state_nbytes == 4000


# -- dc-asgd -------------------------------------------------------------------------------

def test_dc_asgd_compensates_a_stale_push_by_hand():
    rule = make_rule("dc-asgd", 2, 2, {"lambda0": 0.5})
    # w - bak = [0.5, 1.5] - [1, 2] = [-0.5, -0.5]; λ g⊙g = 0.5 * [0.25, 1] = [0.125, 0.5]
    # ĝ = [0.5, -1] + [0.125 * -0.5, 0.5 * -0.5] = [0.4375, -1.25]
    # w = [0.5, 1.5] - 0.5 * ĝ = [0.28125, 2.125]
    assert stale_push(rule).tolist() == [0.28125, 2.125]


def test_dc_asgd_default_lambda_is_0_04():
    # λ g⊙g = [0.01, 0.04]; ĝ = [0.5 - 0.005, -1 - 0.02]; w = [0.5 - 0.2475, 1.5 + 0.51]
    np.testing.assert_allclose(stale_push(make_rule("dc-asgd", 2, 2)), [0.2525, 2.01], rtol=1e-6)


def test_dc_asgd_with_zero_lambda_equals_asgd():
    schedule = random_pushes()
    dc = run(make_rule("dc-asgd", 5, 3, {"lambda0": 0.0}), schedule)
    asgd = run(make_rule("asgd", 5, 3), schedule)
    np.testing.assert_array_equal(dc, asgd)
    assert not np.array_equal(run(make_rule("dc-asgd", 5, 3), schedule), asgd)  # pushes were stale


def test_set_option_changes_the_update():
    rule = make_rule("dc-asgd", 2, 2, {"lambda0": 0.5})
    rule.set_option("lambda0", 0.0)
    assert stale_push(rule).tolist() == [0.25, 2.0]  # plain SGD: [0.5, 1.5] - 0.5 * [0.5, -1]


def test_adaptive_dc_asgd_by_hand():
    # push 1 (fresh): MS = 0.05 * [1, 1] = [0.05, 0.05]; w = [0.5, 1.5]
    # push 2: MS = 0.95 * 0.05 + 0.05 * [0.25, 1] = [0.06, 0.0975]
    # sqrt(MS + 1e-7) = [0.244949178, 0.312250060]; λ = 2 / that
    # λ g⊙g = [2.041239751, 6.405122868]; ĝ = g + λ g⊙g ⊙ [-0.5, -0.5] = [-0.520619876, -4.202561434]
    # w = [0.5, 1.5] - 0.5 * ĝ = [0.760309938, 3.601280717]
    w = stale_push(make_rule("dc-asgd-a", 2, 2))
    np.testing.assert_allclose(w, [0.760309938, 3.601280717], rtol=1e-6)


def test_exact_hessian_makes_a_stale_gradient_fresh_on_a_quadratic():
    # f(w) = ½ wᵀAw, A = diag(2, 0.5): ∇f = A w, the Hessian's diagonal is [2, 0.5]
    a = f32(2, 0.5)
    bak, w = f32(1, 2), f32(0.5, 1.75)
    # A bak + A (w - bak) = [2, 1] + [2 * -0.5, 0.5 * -0.25] = [1, 0.875] = A w
    out = dc_compensate(a * bak, w, bak, a, out=np.empty(2, np.float32))
    assert out.tolist() == (a * w).tolist() == [1, 0.875]


def test_exact_hessian_reproduces_the_sequential_trajectory_with_delayed_gradients():
    a, lr, steps = np.array([2, 0.5]), 0.25, 8
    seq = np.array([1.0, 2.0])
    for _ in range(steps):
        seq = seq - lr * a * seq
    w, bak = np.array([1.0, 2.0]), np.array([1.0, 2.0])  # both workers read w0
    plain, scratch = w.copy(), np.empty(2)
    for _ in range(steps):  # each push is one version late except the first
        g = dc_compensate(a * bak, w, bak, a, out=np.empty(2))
        bak = w.copy()
        sgd_step(w, g, lr, scratch)
    np.testing.assert_array_equal(w, seq)  # float64, dyadic numbers: exact
    plain_bak = plain.copy()
    for _ in range(steps):  # without compensation the delayed run drifts off
        g = a * plain_bak
        plain_bak = plain.copy()
        sgd_step(plain, g, lr, scratch)
    assert not np.array_equal(plain, seq)


def test_dc_asgd_compensates_an_overlapped_push_against_the_read_it_was_computed_on():
    # reads_kept = 2 (--overlap): worker 0 read w0 = [1, 2] at v0 and w1 = [0, 0] at v1, and
    # its push was computed on w0 (lag 1). lambda0 = 1, lr = 1, g = [1, 1], w now = [0, 0]:
    # g_hat = g + g*g*(w - w0) = [1 + (0 - 1), 1 + (0 - 2)] = [0, -1]; w -= g_hat -> [0, 1]
    rule = make_rule("dc-asgd", 2, 1, {"lambda0": 1.0})
    rule.reads_kept = 2
    rule.on_pull(0, f32(1, 2), 0)
    rule.on_pull(0, f32(0, 0), 1)
    rule.computed_at(0, 1)
    w = f32(0, 0)
    rule.on_push(0, w, f32(1, 1), lr=1.0, delay=1)
    assert w.tolist() == [0.0, 1.0]
    rule.computed_at(0, 0)  # on the latest read, w1 = w: no compensation
    w = f32(0, 0)
    rule.on_push(0, w, f32(1, 1), lr=1.0, delay=0)
    assert w.tolist() == [-1.0, -1.0]
    rule.on_pull(0, f32(5, 5), 2)  # only the last two reads stay
    assert rule.backup_versions == [1, 2]
    rule.forget(0)
    assert rule.backup_versions == []


def test_backup_is_shared_by_workers_reading_the_same_version():
    size = 1000
    rule = make_rule("dc-asgd", size, num_workers=8)
    w, scratch = np.ones(size, np.float32), 2 * 4 * size
    for worker in range(8):
        rule.on_pull(worker, w, version=0)
    assert rule.backup_versions == [0] and rule.state_nbytes == scratch + 4 * size
    rule.on_push(3, w, np.ones(size, np.float32), 0.1, 0)
    for worker in range(8):
        rule.on_pull(worker, w, version=1)
    # version 0 freed; its buffer is kept as the one spare and reused by the next version
    assert rule.backup_versions == [1] and rule.state_nbytes == scratch + 2 * 4 * size


def test_backups_grow_with_distinct_versions_not_workers():
    size = 100
    rule, w = make_rule("dc-asgd-a", size, num_workers=8), np.zeros(size, np.float32)
    base = rule.state_nbytes
    for worker in range(8):
        rule.on_pull(worker, w, version=worker % 2)
    assert rule.backup_versions == [0, 1] and rule.state_nbytes == base + 2 * 4 * size
    for worker in range(8):
        rule.forget(worker)
    assert rule.backup_versions == []


def test_forgotten_worker_is_applied_without_compensation():
    rule = make_rule("dc-asgd", 2, 2, {"lambda0": 0.5})
    w = f32(1, 2)
    rule.on_pull(0, w, 0)
    rule.on_push(1, w, f32(1, 1), 0.5, 0)  # w = [0.5, 1.5]
    rule.forget(0)
    rule.on_push(0, w, f32(0.5, -1), 0.5, 1)
    assert w.tolist() == [0.25, 2.0]


# -- snapshots -----------------------------------------------------------------------------

def test_eight_readers_of_one_version_share_one_copy():
    store, w = SnapshotStore(size=2, spares=0), f32(1, 2)
    snaps = [store.acquire(7, w) for _ in range(8)]
    assert all(s is snaps[0] for s in snaps) and store.nbytes == 8 and store.refcount(7) == 8
    w[:] = 9  # a copy, not a view of w
    assert snaps[0].tolist() == [1, 2]
    with pytest.raises(ValueError):
        snaps[0][0] = 3  # read-only


def test_snapshot_is_freed_when_every_reader_moved_on():
    store, w = SnapshotStore(size=2, spares=0), f32(1, 2)
    for _ in range(8):
        store.acquire(0, w)
    for _ in range(8):
        store.release(0)
        store.acquire(1, w)
    assert store.versions == [1] and store.refcount(0) == 0 and store.nbytes == 8


def test_spare_buffer_is_reused_for_the_next_version():
    store = SnapshotStore(size=2, spares=1)
    first = store.acquire(0, f32(1, 2))
    store.release(0)
    second = store.acquire(1, f32(3, 4))
    assert np.shares_memory(first, second) and second.tolist() == [3, 4] and store.nbytes == 8


def test_releasing_an_unheld_version_raises():
    with pytest.raises(KeyError, match="version 3"):
        SnapshotStore(2).release(3)


# -- ddc-asgd ------------------------------------------------------------------------------

def test_ddc_beta_grows_with_delay():
    assert ddc_beta(0, 0.9) == 0.0
    assert ddc_beta(10, 0.9) == pytest.approx(0.5)  # q = 1 / (1 - 0.9) = 10
    betas = [ddc_beta(t, 0.9) for t in range(50)]
    assert all(a < b < 1 for a, b in zip(betas, betas[1:], strict=False))


def test_ddc_asgd_delay_weighted_momentum_by_hand():
    rule = make_rule("ddc-asgd", 2, 2, {"momentum": 0.5})  # q = 2
    w = f32(1, 2)
    rule.on_pull(0, w, 0)
    rule.on_push(0, w, f32(0.5, -1), 0.5, 0)
    # β = 0: d = -0.5 * [0.5, -1] = [-0.25, 0.5]; w = [0.75, 2.5]
    assert w.tolist() == [0.75, 2.5]
    rule.on_pull(1, w, 1)
    rule.on_push(1, w, f32(1, 1), 0.5, delay=2)  # w == bak, so ĝ = g
    # β = 2 / (2 + 2) = 0.5: d = 0.5 * [-0.25, 0.5] - 0.5 * 0.5 * [1, 1] = [-0.375, 0]
    assert w.tolist() == [0.375, 2.5]


def test_ddc_asgd_fresh_push_ignores_momentum():
    rule = make_rule("ddc-asgd", 2, 2)
    w = f32(1, 2)
    rule.on_pull(0, w, 0)
    rule.on_push(0, w, f32(4, 4), 0.25, 0)  # d = [-1, -1], w = [0, 1]
    rule.on_pull(0, w, 1)
    rule.on_push(0, w, f32(0.5, -1), 0.5, 0)
    assert w.tolist() == [-0.25, 1.5]  # [0, 1] - 0.5 * [0.5, -1]: plain SGD, d forgotten


def test_staler_ddc_push_trusts_momentum_more():
    steps = {}
    for delay in (1, 5, 50):
        rule = make_rule("ddc-asgd", 2, 2)
        w = f32(1, 2)
        rule.on_pull(0, w, 0)
        rule.on_push(0, w, f32(4, 4), 0.25, 0)  # d = [-1, -1]
        rule.on_pull(0, w, 1)
        before = w.copy()
        rule.on_push(0, w, f32(-4, 4), 0.25, delay)
        steps[delay] = w - before
        # w == bak, so ĝ = g: d = β [-1, -1] - (1 - β) * 0.25 * [-4, 4] = [1 - 2β, -1]
        beta = ddc_beta(delay, 0.9)
        np.testing.assert_allclose(steps[delay], [1 - 2 * beta, -1], rtol=1e-6)
    # closer to the momentum direction [-1, -1] the staler the push
    assert steps[1][0] > steps[5][0] > steps[50][0]


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
    assert sorted(RULES) == ["asgd", "dc-asgd", "dc-asgd-a", "ddc-asgd", "easgd", "group",
                             "hogwild", "softsync", "ssp"]


def test_fused_push_and_read_equals_push_then_copy_across_blocks():
    from nbdist.algorithms import make_rule
    from nbdist.algorithms.sgd import BLOCK

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
