"""Pipeline partitioning (nbdist.core.partition): hand-computed cases, and `optimal` against
brute force over every set of cuts on small random profiles."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from nbdist.core.partition import (
    candidates,
    fastest_measured,
    greedy_bounds,
    ideal_bubble,
    layer_compute,
    optimal_bounds,
    partition,
    random_bounds,
    schedule,
    stage_times,
    uniform_bounds,
)
from nbdist.errors import ConfigError


def test_stage_times_add_both_boundary_links():
    # layers 1, 2, 3, 4; cuts after layer 0: 100 B, after 1: 200 B, after 2: 300 B; 100 B/s,
    # 0.5 s latency
    times = stage_times([1, 2, 3, 4], [100, 200, 300], [(0, 1), (1, 3), (3, 4)], bandwidth=100,
                        latency=0.5)
    # stage 0: 1 + (1 + 0.5); stage 1: 5 + (1 + 0.5) + (3 + 0.5); stage 2: 4 + (3 + 0.5)
    assert times == pytest.approx((2.5, 10.0, 7.5))


def test_optimal_hand_computed():
    # compute only: [5, 1, 1, 1, 1, 1] into 2 -> {5} | {1 x5} = max(5, 5) = 5
    assert optimal_bounds([5, 1, 1, 1, 1, 1], [0] * 5, 2) == ((0, 1), (1, 6))
    # an expensive cut moves the boundary: cutting after layer 0 costs 10 s each way
    bounds = optimal_bounds([5, 1, 1, 1, 1, 1], [10, 0, 0, 0, 0], 2, bandwidth=1.0)
    assert bounds == ((0, 2), (2, 6))  # max(6, 4) = 6, the least possible
    assert partition([5, 1, 1, 1, 1, 1], [10, 0, 0, 0, 0], 2, bandwidth=1.0).slowest == 6


def test_greedy_hand_computed():
    # target 12 / 3 = 4: [2, 2] = 4; adding 3 makes 7, |4 - 4| < |7 - 4| -> close before it;
    # [3] + 3 = 6, |3 - 4| < |6 - 4| -> close before; the last stage takes [3, 2]
    assert greedy_bounds([2, 2, 3, 3, 2], 3) == ((0, 2), (2, 3), (3, 5))
    # closing after is closer: target 10 / 2 = 5, [4] then +2 = 6: |4-5| = 1 = |6-5| -> tie
    # closes before
    assert greedy_bounds([4, 2, 4], 2) == ((0, 1), (1, 3))
    # target 10 / 2 = 5, [3] + 2.5 = 5.5: |3-5| = 2 > 0.5 -> close after the 2.5
    assert greedy_bounds([3, 2.5, 4.5], 2) == ((0, 2), (2, 3))
    # never empty: as many layers left as stages to fill closes the stage
    assert greedy_bounds([1, 1, 1, 10], 3) == ((0, 2), (2, 3), (3, 4))


def test_uniform_and_random():
    assert uniform_bounds(7, 3) == ((0, 3), (3, 5), (5, 7))
    assert uniform_bounds(4, 4) == ((0, 1), (1, 2), (2, 3), (3, 4))
    a, b = random_bounds(20, 4, seed=3), random_bounds(20, 4, seed=3)
    assert a == b  # seeded
    assert len(a) == 4 and a[0][0] == 0 and a[-1][1] == 20 and all(s < e for s, e in a)
    # and it does vary with the seed
    assert {random_bounds(20, 4, seed=s) for s in range(10)} != {a}


def _valid(bounds, n, s):
    return (len(bounds) == s and bounds[0][0] == 0 and bounds[-1][1] == n
            and all(a < b for a, b in bounds)
            and all(x[1] == y[0] for x, y in zip(bounds, bounds[1:], strict=False)))


@pytest.mark.parametrize("seed", range(40))
def test_optimal_equals_brute_force_and_others_are_valid(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 9))
    s = int(rng.integers(1, n + 1))
    costs = rng.uniform(0.1, 5.0, n).round(3)
    cut_bytes = rng.uniform(0, 1000, n - 1).round()
    bw, lat = float(rng.choice([1e9, 500.0, 100.0])), float(rng.choice([0.0, 0.01]))
    brute = min(max(stage_times(costs, cut_bytes, tuple(zip((0, *c), (*c, n), strict=True)), bw,
                                lat))
                for c in itertools.combinations(range(1, n), s - 1))
    best = partition(costs, cut_bytes, s, "optimal", bandwidth=bw, latency=lat)
    assert best.slowest == pytest.approx(brute, rel=1e-12)
    for method in ("greedy", "uniform", "random"):
        p = partition(costs, cut_bytes, s, method, bandwidth=bw, latency=lat, seed=seed)
        assert _valid(p.bounds, n, s), (method, p.bounds)
        assert p.slowest >= best.slowest - 1e-12


def test_errors_name_the_problem():
    with pytest.raises(ConfigError, match=r"--stages 4 needs at least 4 layers.*has 3: a, b, c"):
        partition([1, 1, 1], [0, 0], 4, names=["a", "b", "c"])
    with pytest.raises(ConfigError, match="--partition must be one of"):
        partition([1, 1], [0], 2, "best")


def test_schedules_and_bubble():
    assert schedule("gpipe", 3, 2, 1) == [("F", 0), ("F", 1), ("B", 0), ("B", 1)]
    # 1F1B, S = 3, M = 4: stage 0 fills 2, stage 2 (last) alternates from the start
    assert schedule("1f1b", 3, 4, 0) == [("F", 0), ("F", 1), ("F", 2), ("B", 0), ("F", 3), ("B", 1),
                                         ("B", 2), ("B", 3)]
    assert schedule("1f1b", 3, 4, 2) == [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2),
                                         ("F", 3), ("B", 3)]
    # M < S: all forwards first
    assert schedule("1f1b", 4, 2, 0) == [("F", 0), ("F", 1), ("B", 0), ("B", 1)]
    for kind in ("gpipe", "1f1b"):
        for st in range(3):
            ops = schedule(kind, 3, 5, st)
            assert sorted(ops) == sorted([("F", i) for i in range(5)]
                                         + [("B", i) for i in range(5)])
    assert ideal_bubble(2, 4) == pytest.approx(1 / 5)
    assert ideal_bubble(1, 8) == 0.0


def test_1f1b_holds_at_most_s_minus_stage_micro_batches_gpipe_all_m():
    def most_in_flight(ops):
        held = peak = 0
        for kind, _ in ops:
            held += 1 if kind == "F" else -1
            peak = max(peak, held)
        return peak

    for s in range(4):
        assert most_in_flight(schedule("1f1b", 4, 8, s)) == 4 - s
        assert most_in_flight(schedule("gpipe", 4, 8, s)) == 8


# -- --partition measured: the cost model's best cuts, timed as whole stages --------------------

def test_layer_compute_takes_the_per_call_cost_out_and_stage_times_add_it_once_per_stage():
    """Three layers timed as calls of their own at 3, 0.5 and 1.2 ms, a call of nothing at
    1 ms: compute 2, 0 and 0.2 ms; one stage of all three, compiled as one function with a
    0.4 ms call, predicts 2.6 ms (the per-layer sum said 4.7)."""
    compute = layer_compute([0.003, 0.0005, 0.0012], 0.001)
    assert compute == pytest.approx([0.002, 0.0, 0.0002], abs=1e-15)
    assert stage_times(compute, [0, 0], [(0, 3)], overhead=0.0004) == pytest.approx((0.0026,))
    # two stages: each pays the call once, and its links
    assert stage_times([1, 2, 3], [10, 20], [(0, 1), (1, 3)], bandwidth=10, latency=0.5,
                       overhead=0.25) == (1 + 1.5 + 0.25, 5 + 1.5 + 0.25)


def test_candidates_are_the_models_best_cuts_then_greedy_and_uniform():
    """Five layers [4, 1, 1, 1, 1] into 2 stages, no links: the four cuts predict slowest
    stages 4, 5, 6 and 7 (cut after layer 1, 2, 3, 4); the best two, then greedy's (after 1:
    already in) and uniform's (after 3)."""
    got = candidates([4, 1, 1, 1, 1], [0, 0, 0, 0], 2, count=2)
    assert got == [((0, 1), (1, 5)), ((0, 2), (2, 5)), ((0, 3), (3, 5))]
    # a link's bytes count: a cut whose tensors are large ranks later
    linked = candidates([1, 1, 1, 1], [0, 100, 0], 2, bandwidth=10, count=1)
    assert linked[0] == ((0, 1), (1, 4))  # 1 | 3, not the even 2 | 2 across 10 s of link
    # S = 3: every choice of 2 cuts of 5 layers (6) ranked, each with no empty stage
    three = candidates([1, 1, 1, 1, 1], [0] * 4, 3, count=6)
    assert len(three) == 6 and all(b - a >= 1 for bounds in three for a, b in bounds)
    assert three[0] in (((0, 1), (1, 3), (3, 5)), ((0, 2), (2, 3), (3, 5)),
                        ((0, 2), (2, 4), (4, 5)))  # the 2-2-1 splits tie at 2 first


def test_candidates_beyond_enumeration_are_the_optimal_cut_and_its_neighbours(monkeypatch):
    import nbdist.core.partition as partition_module

    monkeypatch.setattr(partition_module, "ENUMERATE_AT_MOST", 1)
    got = candidates([1, 1, 1, 1, 1, 1], [0] * 5, 2, count=3)
    assert got[0] == ((0, 3), (3, 6))  # optimal
    assert set(got[1:3]) == {((0, 2), (2, 6)), ((0, 4), (4, 6))}  # one cut point away


def test_the_measured_partition_is_the_fastest_timed_one_with_its_links():
    """Two candidates timed: 2.0 | 1.0 ms and 1.5 | 1.2 ms of compute; with a 1 ms link on
    each side of the cut (10 bytes at 10 bytes/ms), 3.0 | 2.0 against 2.5 | 2.2: the second."""
    timed = [(((0, 1), (1, 3)), [2.0, 1.0]), (((0, 2), (2, 3)), [1.5, 1.2])]
    chosen = fastest_measured(timed, [10, 10], 3, bandwidth=10)
    assert chosen.method == "measured" and chosen.bounds == ((0, 2), (2, 3))
    assert chosen.stage_times == pytest.approx((2.5, 2.2))
    with pytest.raises(ValueError, match="no measured candidate"):
        fastest_measured([], [10, 10], 3)
