"""The pure parts of --mode simulate: cost model, options, jitter, event order, config checks."""

import math

import pytest

from nbdist.config import TrainConfig
from nbdist.core.simclock import (
    CostModel,
    EventQueue,
    Jitter,
    fit_cost,
    parse_sim,
    round2,
    sim_options,
)
from nbdist.errors import ConfigError


def test_step_time_is_slowdown_times_overhead_plus_per_sample_cost():
    cost = CostModel(per_step_s=0.002, per_sample_s=0.0005)
    assert cost.step_time(10) == pytest.approx(0.007)
    assert cost.step_time(10, slowdown=4) == pytest.approx(0.028)
    assert cost.step_time(0, slowdown=2, noise=1.5) == pytest.approx(0.006)


def test_events_pop_by_time_then_worker_id():
    q = EventQueue()
    for t, w in [(0.3, 0), (0.1, 5), (0.3, 2), (0.1, 1), (0.2, 4)]:
        q.schedule(t, w)
    assert [q.pop() for _ in range(5)] == [(0.1, 1), (0.1, 5), (0.2, 4), (0.3, 0), (0.3, 2)]
    assert len(q) == 0 and q.peek_time() is None


def test_a_worker_has_one_step_in_flight():
    q = EventQueue()
    q.schedule(1.0, 3)
    assert q.pending(3)
    with pytest.raises(ValueError, match="already has a step in flight"):
        q.schedule(2.0, 3)
    q.pop()
    q.schedule(2.0, 3)  # after it completed, the next may be scheduled
    with pytest.raises(ValueError, match="finite"):
        q.schedule(math.nan, 1)


def test_two_workers_at_speeds_one_and_three_interleave_three_to_one():
    """The order a simulation produces for steps of 1 and 3 time units."""
    q, ends, order = EventQueue(), {0: 1.0, 1: 3.0}, []
    q.schedule(1.0, 0)
    q.schedule(3.0, 1)
    while len(order) < 8:
        t, w = q.pop()
        order.append(w)
        q.schedule(t + ends[w], w)
    assert order == [0, 0, 0, 1, 0, 0, 0, 1]  # at t=3 and t=6 the tie goes to worker 0 first


def test_jitter_is_reproducible_per_seed_and_worker():
    a, b, c = (Jitter(0.2, seed=1, num_workers=2), Jitter(0.2, seed=1, num_workers=2),
               Jitter(0.2, seed=2, num_workers=2))
    first = [a.factor(0) for _ in range(5)]
    assert first == [b.factor(0) for _ in range(5)]
    assert first != [c.factor(0) for _ in range(5)]
    assert first != [a.factor(1) for _ in range(5)][:5]
    assert all(f > 0 for f in first)
    assert Jitter(0.0, seed=1, num_workers=1).factor(0) == 1.0


def test_calibration_fit_is_rounded_to_two_digits():
    assert (fit_cost([(64, 0.00229), (16, 0.00133), (64, 0.00227), (16, 0.00131)])
            == CostModel(0.001, 2e-05))
    assert fit_cost([(10, 0.01), (20, 0.01)]) == CostModel(0.01, 0.0)  # no per-sample cost
    assert round2(0.0012345) == 0.0012
    with pytest.raises(ValueError, match="two different batch sizes"):
        fit_cost([(8, 0.1), (8, 0.2)])


def test_sim_options_parse_numbers_and_name_the_valid_ones():
    options = sim_options(parse_sim("per_step=0.002,per_sample=1e-4,jitter=0.1,eval_every=0.5,"
                                    "sync=1"))
    assert options.cost == CostModel(0.002, 1e-4, 0.1)
    assert options.sync and not options.calibrate and options.eval_every == 0.5
    assert sim_options({}).cost == CostModel()
    with pytest.raises(ConfigError, match="Unknown --sim option 'jiter'.*Valid: per_step"):
        parse_sim("jiter=0.1")
    with pytest.raises(ConfigError, match="sync must be 0 or 1"):
        parse_sim("sync=2")
    with pytest.raises(ConfigError, match="name=number"):
        parse_sim("per_step=fast")


def test_simulate_config_needs_workers_and_refuses_what_it_cannot_simulate():
    assert TrainConfig(mode="simulate", slowdown="1,2").sim == {}
    assert TrainConfig(mode="simulate", workers=3, sim="sync=1").sim == {"sync": 1}
    with pytest.raises(ConfigError, match="--workers N"):
        TrainConfig(mode="simulate")
    with pytest.raises(ConfigError,
                       match="--servers and --overlap do not apply to --mode simulate"):
        TrainConfig(mode="simulate", workers=2, servers=2, overlap=True)
    with pytest.raises(ConfigError, match="simulates --mode sync.*Drop --algorithm"):
        TrainConfig(mode="simulate", workers=2, algorithm="ddc-asgd", sim="sync=1")
