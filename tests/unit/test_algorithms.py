"""Update rules on exact, hand-computed numbers, and the properties in docs/rules.md.

Most cases use w = [1, 2], g = [0.5, -1] and rates that are powers of two, so float32 is
exact and the expected values in the comments are the arithmetic done by hand.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from nbdist.algorithms import (
    RULES,
    SnapshotStore,
    dc_compensate,
    ddc_beta,
    make_rule,
    sgd_step,
)
from nbdist.errors import ConfigError
from tests.rule_cases import f32, random_pushes, run, stale_push

# easgd pushes an elastic difference, not g; async-local-sgd and streaming-diloco are outer
# optimizers of their own on deltas, a push not one SGD step (tests/unit/test_local_sgd.py,
# test_streaming_diloco.py)
GRADIENT_RULES = sorted(set(RULES) - {"easgd", "async-local-sgd", "streaming-diloco"})


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
    with pytest.raises(ValueError,
                       match="Unknown algorithm 'dcasgd'. Expected one of: asgd, "
                             "async-local-sgd, dc-asgd,"):
        make_rule("dcasgd", 2, 2)


def test_unknown_option_lists_valid_names_and_defaults():
    with pytest.raises(ConfigError,
                       match=r"^Unknown option 'lamda' for dc-asgd. Valid: lambda0=0.04.$"):
        make_rule("dc-asgd", 2, 2, {"lamda": 1})
    with pytest.raises(ValueError,
                       match="Valid: lambda0=2, ms_decay=0.95, epsilon=1e-07, momentum=0.9"):
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


def test_asgd_state_is_one_scratch_buffer_with_numpy_and_none_with_the_compiled_kernel():
    from nbdist.algorithms.kernels import COMPILED

    assert make_rule("asgd", 1000, 8).state_nbytes == (4000 if COMPILED is None else 0)


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
    # λ g⊙g = [2.041239751, 6.405122868];
    # ĝ = g + λ g⊙g ⊙ [-0.5, -0.5] = [-0.520619876, -4.202561434]
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
