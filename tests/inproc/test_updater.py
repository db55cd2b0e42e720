"""How a rule composes with the cell's optimizer on the hub (`nbdist.core.updater`).

The rule decides the gradient and when; the optimizer takes the step. Each property is checked
against the optimizer applied by hand to what the rule should hand it.
"""

import keras
import numpy as np
import pytest

from nbdist.algorithms import dc_compensate, make_rule
from nbdist.algorithms.optimizers import HubOptimizer, server_optimizer_spec
from nbdist.config import TrainConfig
from nbdist.core.updater import Updater, check_composition, plain_sgd
from nbdist.engine.optimizer_spec import choose_optimizer
from nbdist.errors import ConfigError, UnsupportedOptimizerError

SIZE = 6
SEGMENTS = [4, 2]


def f32(*values):
    return np.array(values, np.float32)


def rng_vectors(n, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=SIZE).astype(np.float32) for _ in range(n)]


def adam_spec(lr=0.01):
    return {"class_name": "Adam", "learning_rate": lr, "segments": SEGMENTS,
            "config": {"beta_1": 0.9, "beta_2": 0.999, "epsilon": 1e-7, "amsgrad": False,
                       "clipnorm": None, "clipvalue": None, "global_clipnorm": None,
                       "weight_decay": None}}


def describe(optimizer):
    from nbdist.engine.optimizer_spec import describe_optimizer

    return describe_optimizer(optimizer, SEGMENTS)


def test_with_no_delay_a_push_is_one_step_of_the_cells_optimizer():
    spec = describe(keras.optimizers.Adam(0.01))
    up, by_hand = Updater(make_rule("asgd", SIZE, 1), spec), HubOptimizer(spec, SIZE)
    w, w_hand = rng_vectors(2)
    w_hand = w.copy()
    for g in rng_vectors(5, seed=1):
        assert up.push(0, w, g, delay=0) == (True, False)
        by_hand.apply(w_hand, g)
    np.testing.assert_array_equal(w, w_hand)
    assert up.optimizer.iterations == 5


def test_staleness_lr_scales_the_optimizers_step_by_one_over_the_delay():
    spec = describe(keras.optimizers.SGD(0.1, momentum=0.9))
    up, by_hand = (Updater(make_rule("asgd", SIZE, 1), spec, staleness_lr=True),
                   HubOptimizer(spec, SIZE))
    w = rng_vectors(1)[0]
    w_hand = w.copy()
    for delay, g in zip((0, 3, 1, 4), rng_vectors(4, seed=2), strict=True):
        up.push(0, w, g, delay=delay)
        by_hand.apply(w_hand, g, lr_scale=1.0 / max(1, delay))
    np.testing.assert_allclose(w, w_hand, rtol=1e-6)


def test_dc_asgd_compensates_the_gradient_before_the_optimizer_steps():
    spec = adam_spec()
    rule = make_rule("dc-asgd", SIZE, 2, {"lambda0": 0.5})
    up, by_hand = Updater(rule, spec), HubOptimizer(spec, SIZE)
    w = rng_vectors(1)[0]
    backup = w.copy()
    rule.on_pull(0, w, 0)  # worker 0 reads w at version 0
    other, g = rng_vectors(2, seed=3)
    up.push(1, w, other, delay=0)  # another worker moves w first
    w_hand = w.copy()
    expected = dc_compensate(g, w_hand, backup, np.float32(0.5) * g * g, np.empty(SIZE, np.float32))
    by_hand.iterations = 1  # the hand-made optimizer takes the same second step
    by_hand.restore_state(up.optimizer.export_state())
    by_hand.apply(w_hand, expected)
    up.push(0, w, g, delay=1)
    np.testing.assert_allclose(w, w_hand, rtol=1e-6)


def test_softsync_hands_the_optimizer_the_mean_of_c_scaled_pushes():
    spec = adam_spec()
    up = Updater(make_rule("softsync", SIZE, 2, {"n": 1}), spec, staleness_lr=True)  # c = 2
    by_hand = HubOptimizer(spec, SIZE)
    w = rng_vectors(1)[0]
    w_hand, (g1, g2) = w.copy(), rng_vectors(2, seed=4)
    assert up.push(0, w, g1, delay=2) == (False, False)  # buffered: w unchanged
    np.testing.assert_array_equal(w, w_hand)
    assert up.push(1, w, g2, delay=1)[0]
    by_hand.apply(w_hand, (g1 * np.float32(0.5) + g2) * np.float32(0.5))
    np.testing.assert_allclose(w, w_hand, rtol=1e-6)
    assert up.optimizer.iterations == 1


def test_group_step_is_taken_at_the_groups_rate_scale():
    spec = describe(keras.optimizers.RMSprop(0.01))
    up, by_hand = Updater(make_rule("group", SIZE, 2), spec), HubOptimizer(spec, SIZE)
    w = rng_vectors(1)[0]
    w_hand, g = w.copy(), rng_vectors(1, seed=5)[0]
    up.push(0, w, g, delay=0, scale=96 / 64)  # a group of 96 samples against batch 64
    by_hand.apply(w_hand, g, lr_scale=1.5)
    np.testing.assert_allclose(w, w_hand, rtol=1e-6)


def test_plain_sgd_takes_the_rules_fused_pass_and_follows_its_schedule():
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=1, decay_rate=0.5)
    spec = describe(keras.optimizers.SGD(schedule))
    assert plain_sgd(spec) and not plain_sgd(describe(keras.optimizers.SGD(0.1, clipnorm=1.0)))
    up = Updater(make_rule("asgd", SIZE, 1), spec)
    assert up.fused
    w = np.zeros(SIZE, np.float32)
    out = np.empty(SIZE, np.float32)
    for _ in range(3):  # rates 0.1, 0.05, 0.025
        assert up.push(0, w, np.ones(SIZE, np.float32), delay=0, into=out) == (True, True)
    np.testing.assert_allclose(w, -0.175, rtol=1e-6)
    np.testing.assert_array_equal(out, w)
    assert up.learning_rate() == pytest.approx(0.0125)


def test_set_lr_replaces_a_schedule_from_then_on():
    schedule = keras.optimizers.schedules.CosineDecay(0.1, decay_steps=100)
    up = Updater(make_rule("asgd", SIZE, 1), describe(keras.optimizers.Adam(schedule)))
    assert up.learning_rate() == pytest.approx(0.1)
    up.set_learning_rate(0.02)
    up.push(0, np.zeros(SIZE, np.float32), np.ones(SIZE, np.float32), delay=0)
    assert up.learning_rate() == pytest.approx(0.02)


def test_ddc_asgd_refuses_any_optimizer_but_plain_sgd():
    check_composition("ddc-asgd", describe(keras.optimizers.SGD(0.05)))
    for optimizer in (keras.optimizers.Adam(), keras.optimizers.SGD(0.05, momentum=0.9)):
        with pytest.raises(ConfigError,
                           match="ddc-asgd is its own delay-weighted momentum.*dc-asgd-a"):
            check_composition("ddc-asgd", describe(optimizer))
    check_composition("dc-asgd-a", describe(keras.optimizers.Adam()))


def _model(optimizer):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer=optimizer, loss="mse")
    return model


def _choose(optimizer, **options):
    model = _model(optimizer)
    segments = [int(np.prod(v.shape)) for v in model.trainable_variables]
    return choose_optimizer(TrainConfig(**options), model.optimizer, segments,
                            model.trainable_variables)


def test_the_hub_takes_the_cells_optimizer_as_it_is():
    spec, warnings = _choose("adam")
    assert spec["class_name"] == "Adam" and spec["learning_rate"] == pytest.approx(0.001)
    assert warnings == []


def test_lr_flag_replaces_a_constant_rate_with_a_warning_and_refuses_a_schedule():
    from nbdist.engine.learning_rate import check_lr

    spec, warnings = _choose(keras.optimizers.Adam(0.001), lr=0.01)
    assert spec["learning_rate"] == 0.01
    assert warnings == ["--lr 0.01 replaces the cell's learning rate 0.001."]
    schedule = keras.optimizers.schedules.ExponentialDecay(1e-3, 100, 0.9)
    with pytest.raises(ConfigError, match="uses the schedule ExponentialDecay. Drop --lr"):
        check_lr(0.01, keras.optimizers.Adam(schedule))


def test_server_optimizer_sgd_trains_with_sgd_on_purpose_and_warns():
    spec, warnings = _choose("adam", server_optimizer="sgd")
    assert spec["class_name"] == "SGD" and spec["learning_rate"] == pytest.approx(0.001)
    assert len(warnings) == 1 and "not with the cell's Adam" in warnings[0]


def test_an_optimizer_nbdist_cannot_reproduce_is_refused_naming_it():
    class Mine(keras.optimizers.Adam):
        pass

    with pytest.raises(UnsupportedOptimizerError, match="Mine") as err:
        _choose(Mine())
    assert "Adam" in str(err.value) and "--server-optimizer sgd" in str(err.value)


def test_local_steps_apply_the_workers_deltas_with_sgd_at_rate_one():
    spec, warnings = _choose("adam", local_steps=4)
    assert (spec["class_name"], spec["learning_rate"], warnings) == ("SGD", 1.0, [])


def test_easgd_has_no_hub_optimizer_and_refuses_one():
    assert _choose("adam", algorithm="easgd", local_steps=2) == (None, [])
    with pytest.raises(ConfigError, match="does not apply to --algorithm easgd"):
        _choose("adam", algorithm="easgd", local_steps=2, server_optimizer="adam")


# -- nbdist's own server optimizers (--server-optimizer, --local-steps) ---------------------

def test_server_sgd_applies_a_delta_at_rate_one():
    opt, w = HubOptimizer(server_optimizer_spec("sgd", None, [2]), 2), f32(1, 2)
    opt.apply(w, f32(0.5, -1))
    assert w.tolist() == [0.5, 3]
    opt.apply(w, f32(0.5, -1), lr_scale=0.25)
    assert w.tolist() == [0.375, 3.25]


def test_server_momentum_by_hand():
    opt, w = HubOptimizer(server_optimizer_spec("momentum", None, [2]), 2), f32(1, 2)
    opt.apply(w, f32(0.5, -1))  # m = -Δ = [-0.5, 1]; w = [0.5, 3]
    opt.apply(w, f32(0.5, -1))  # m = 0.9 m - Δ = [-0.95, 1.9]; w = [-0.45, 4.9]
    np.testing.assert_allclose(w, [-0.45, 4.9], rtol=1e-6)


def test_server_adam_by_hand():
    opt, w = HubOptimizer(server_optimizer_spec("adam", None, [2]), 2), f32(1, 2)
    assert opt.learning_rate() == pytest.approx(0.01)
    opt.apply(w, f32(0.5, -1))  # t = 1: a step of ≈ lr · sign(Δ)
    np.testing.assert_allclose(w, [0.99, 2.01], rtol=1e-6)
