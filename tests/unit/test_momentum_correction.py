"""--momentum-correction: the hub lowers the cell's momentum (SGD's and RMSprop's `momentum`, the
Adam family's `beta_1`) by what the workers' asynchrony adds, τ̄ / (1 + τ̄) for the moving average
τ̄ of the delays. Exact against NumPy oracles written out here; one worker is the cell's
optimizer bit for bit; which rules and modes take it, and what the run says."""

import numpy as np
import pytest

from nbdist.algorithms import make_rule
from nbdist.algorithms.momentum import (
    SMOOTHING,
    DelayAverage,
    compensated_momentum,
    correction_notice,
    implicit_momentum,
    max_workers,
    saturated,
)
from nbdist.algorithms.optimizers import momentum_setting, server_optimizer_spec
from nbdist.config import TrainConfig
from nbdist.core.updater import Updater
from nbdist.errors import ConfigError

F = np.float32


def spec(class_name, lr, **config):
    return {"class_name": class_name, "config": config, "learning_rate": lr, "segments": [3]}


def updater(opt, num_workers, correct=True):
    return Updater(make_rule("asgd", 3, num_workers), opt, momentum_correction=correct,
                   num_workers=num_workers)


GRADS = [np.array(g, F) for g in ([1, -2, 0.5], [0.5, 1, -1], [-1, 0.25, 2], [2, 2, -0.5],
                                  [0.1, -0.3, 0.7], [-0.6, 1.5, 0.2])]
DELAYS = [0, 1, 1, 3, 1, 1]


def averaged_delays(num_workers, delays):
    """τ̄ before each push, as DelayAverage computes it, written out: start M − 1, then
    τ̄ += 0.05 (min(d, 4M) − τ̄) per push."""
    tau, seen = float(num_workers - 1), []
    for d in delays:
        tau += SMOOTHING * (min(d, 4 * num_workers) - tau)
        seen.append(tau)
    return seen


def test_the_formulas_by_hand():
    assert implicit_momentum(1) == 0.5 and implicit_momentum(3) == 0.75
    assert implicit_momentum(0) == 0.0 and implicit_momentum(-2) == 0.0
    assert compensated_momentum(0.9, 1.0) == pytest.approx(0.4)
    assert compensated_momentum(0.99, 3.0) == pytest.approx(0.24)
    assert compensated_momentum(0.5, 3.0) == 0.0  # saturated: clipped at 0
    assert compensated_momentum(0.9, 0.0) == 0.9  # no delay: the cell's, exactly


def test_the_delay_average_starts_at_m_minus_1_and_caps_a_long_wait():
    avg = DelayAverage(num_workers=2)
    assert avg.mean == 1.0
    avg.add(3)  # 1 + 0.05 (3 - 1)
    assert avg.mean == pytest.approx(1.1)
    avg.add(1000)  # counted as 4M = 8: 1.1 + 0.05 (8 - 1.1)
    assert avg.mean == pytest.approx(1.445)
    one = DelayAverage(num_workers=1)
    for _ in range(10):
        one.add(0)
    assert one.mean == 0.0


def test_sgd_momentum_equals_the_numpy_oracle_with_the_lowered_momentum():
    up = updater(spec("SGD", 0.1, momentum=0.9), num_workers=2)
    assert up.momentum == pytest.approx(0.4)  # before any push: M - 1 = 1 expected
    w = np.array([1, 2, 3], F)
    ow, m = w.astype(np.float64), np.zeros(3)
    for g, d, tau in zip(GRADS, DELAYS, averaged_delays(2, DELAYS), strict=True):
        up.push(0, w, g, delay=d)
        mu = 0.9 - tau / (1 + tau)
        m = mu * m - 0.1 * g
        ow = ow + m
        assert up.momentum == pytest.approx(mu)
    np.testing.assert_allclose(w, ow, rtol=1e-6, atol=1e-6)


def test_nesterov_equals_the_numpy_oracle_with_the_lowered_momentum():
    up = updater(spec("SGD", 0.05, momentum=0.9, nesterov=True), num_workers=4)
    w = np.array([1, 2, 3], F)
    ow, m = w.astype(np.float64), np.zeros(3)
    for g, d, tau in zip(GRADS, DELAYS, averaged_delays(4, DELAYS), strict=True):
        up.push(0, w, g, delay=d)
        mu = max(0.0, 0.9 - tau / (1 + tau))
        m = mu * m - 0.05 * g
        ow = ow + mu * m - 0.05 * g
    np.testing.assert_allclose(w, ow, rtol=1e-6, atol=1e-6)


def test_adam_beta_1_equals_the_numpy_oracle_with_its_bias_correction():
    up = updater(spec("Adam", 0.01), num_workers=2)
    w = np.array([1, 2, 3], F)
    ow, m, v = w.astype(np.float64), np.zeros(3), np.zeros(3)
    for t, (g, d, tau) in enumerate(zip(GRADS, DELAYS, averaged_delays(2, DELAYS),
                                        strict=True), start=1):
        up.push(0, w, g, delay=d)
        b1 = 0.9 - tau / (1 + tau)
        m = m + (g - m) * (1 - b1)
        v = v + (g * g - v) * (1 - 0.999)
        alpha = 0.01 * np.sqrt(1 - 0.999 ** t) / (1 - b1 ** t)
        ow = ow - m * alpha / (np.sqrt(v) + 1e-7)
    np.testing.assert_allclose(w, ow, rtol=1e-5, atol=1e-6)


def test_rmsprop_momentum_that_reaches_zero_and_rises_again_keeps_its_slot():
    up = updater(spec("RMSprop", 0.01, momentum=0.5), num_workers=4)  # 0.5 - 0.75 < 0
    assert up.momentum == 0.0
    w = np.array([1, 2, 3], F)
    ow, m, v = w.astype(np.float64), np.zeros(3), np.zeros(3)
    delays = [0, 0, 0, 0, 0, 0]  # τ̄ falls from 3 towards 0: μ' rises from 0
    for g, d, tau in zip(GRADS, delays, averaged_delays(4, delays), strict=True):
        up.push(0, w, g, delay=d)
        mu = max(0.0, 0.5 - tau / (1 + tau))
        v = 0.9 * v + 0.1 * g * g
        m = mu * m + 0.01 * g / np.sqrt(v + 1e-7)
        ow = ow - m
    assert up.momentum == 0.0  # τ̄ = 3 · 0.95^6 = 2.2: still saturated
    np.testing.assert_allclose(w, ow, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("opt", [spec("SGD", 0.1, momentum=0.9),
                                 spec("SGD", 0.1, momentum=0.9, nesterov=True),
                                 spec("Adam", 0.001), spec("AdamW", 0.001, weight_decay=0.004),
                                 spec("RMSprop", 0.001, momentum=0.5), spec("Nadam", 0.002),
                                 spec("Adamax", 0.002)])
def test_one_worker_trains_exactly_as_the_cells_optimizer(opt):
    on, off = updater(opt, 1), updater(opt, 1, correct=False)
    w_on, w_off = np.array([1, 2, 3], F), np.array([1, 2, 3], F)
    for g in GRADS:
        on.push(0, w_on, g, delay=0)
        off.push(0, w_off, g, delay=0)
    assert w_on.tobytes() == w_off.tobytes()  # the same code on the same floats
    assert on.momentum == off.momentum


def test_an_optimizer_without_momentum_is_left_alone():
    for opt in (spec("SGD", 0.1), spec("Adagrad", 0.1), spec("RMSprop", 0.1)):
        up = updater(opt, 2)
        assert up.delays is None and up.momentum is None
    assert momentum_setting(spec("SGD", 0.1)) is None
    assert momentum_setting(spec("RMSprop", 0.1, momentum=0.3)) == ("momentum", 0.3)
    assert momentum_setting(server_optimizer_spec("adam", None, [3])) == ("beta_1", 0.9)


def test_saturation_and_the_workers_it_allows():
    assert not saturated(0.9, 10) and saturated(0.9, 11)
    assert max_workers(0.9) == 10 and max_workers(0.75) == 4 and max_workers(0.0) == 1
    note, extra = correction_notice("SGD", "momentum", 0.9, 2)
    assert "momentum=0.9 runs as 0.4" in note and "--no-momentum-correction" in note
    assert extra is None
    note, extra = correction_notice("RMSprop", "momentum", 0.5, 4)
    assert "runs as 0 " in note
    assert "more than the cell's RMSprop momentum=0.5" in extra and "--mode sync" in extra
    assert "at most 2" in extra


@pytest.mark.parametrize(("options", "corrected"), [
    ({}, True),
    ({"algorithm": "ssp"}, True),
    ({"algorithm": "hogwild"}, True),
    ({"algorithm": "dc-asgd-a"}, True),
    ({"algorithm": "softsync"}, False),
    ({"algorithm": "ddc-asgd"}, False),
    ({"algorithm": "easgd"}, False),
    ({"local_steps": 4}, False),
    ({"mode": "sync"}, False),
    ({"mode": "pipeline"}, False),
    ({"mode": "local"}, True),
    ({"mode": "simulate", "workers": 2}, True),
    ({"momentum_correction": False}, False),
])
def test_the_correction_is_on_where_it_works_unless_turned_off(options, corrected):
    assert TrainConfig(**options).momentum_corrected is corrected


@pytest.mark.parametrize("options", [{"algorithm": "easgd"}, {"algorithm": "softsync"},
                                     {"algorithm": "ddc-asgd"}, {"local_steps": 2}])
def test_asking_for_the_correction_where_it_cannot_work_is_refused(options):
    with pytest.raises(ConfigError, match="--momentum-correction works with --algorithm asgd, "
                                          "hogwild, dc-asgd, dc-asgd-a, ssp, one step"):
        TrainConfig(momentum_correction=True, **options)


@pytest.mark.parametrize("mode", ["sync", "pipeline"])
def test_a_mode_without_a_hub_rule_refuses_the_correction(mode):
    with pytest.raises(ConfigError, match=f"--momentum-correction does not apply to --mode {mode}"):
        TrainConfig(mode=mode, momentum_correction=True)


def test_by_default_only_momentum_sgd_at_a_large_effective_step_is_corrected():
    from nbdist.algorithms.momentum import EFFECTIVE_STEP_MIN, worth_correcting
    from nbdist.algorithms.optimizers import initial_rate

    assert EFFECTIVE_STEP_MIN == 0.5
    assert worth_correcting("SGD", 0.9, 0.1)  # 1.0: two async workers fell apart without it
    assert not worth_correcting("SGD", 0.9, 0.01)  # 0.1: it cost 0.09 there
    assert worth_correcting("SGD", 0.5, 0.25) and not worth_correcting("SGD", 0.5, 0.2)
    # more workers, longer delays: SGD(0.1, momentum=0.5) (0.2) fell to 0.37-0.50 with four
    # simulated workers without it, 0.77-0.78 with it (fit 0.81); it helped with three too
    assert worth_correcting("SGD", 0.5, 0.1, 3) and worth_correcting("SGD", 0.5, 0.1, 4)
    assert not worth_correcting("SGD", 0.5, 0.01, 4)  # 0.02: it cost 0.025 there
    assert not worth_correcting("SGD", 0.9, 1.0, 1)  # one worker: nothing to take out
    assert not worth_correcting("Adam", 0.9, 0.1) and not worth_correcting("RMSprop", 0.9, 1.0)
    decaying = {"class_name": "ExponentialDecay",
                "config": {"initial_learning_rate": 0.2, "decay_steps": 10, "decay_rate": 0.5}}
    assert initial_rate(spec("SGD", decaying, momentum=0.9)) == pytest.approx(0.2)
    assert initial_rate({"class_name": "SGD", "config": {}, "learning_rate": None}) == 0.01
