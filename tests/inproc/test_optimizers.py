"""The hub's optimizer equals Keras's own `optimizer.apply`, for every class and setting nbdist
supports, on a few variables of different shapes over 50 seeded gradient sets; shards, state,
the learning-rate override and the refusals.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import tracemalloc

import numpy as np
import pytest

from nbdist.algorithms.optimizer_rules import FORMULAS
from nbdist.algorithms.optimizers import (
    SUPPORTED_OPTIMIZERS,
    HubOptimizer,
    server_optimizer_spec,
    sum_of_squares,
)
from nbdist.algorithms.schedules import schedule_value
from nbdist.engine.optimizer_spec import describe_optimizer
from nbdist.errors import CheckpointError, ConfigError, UnsupportedOptimizerError

keras = pytest.importorskip("keras")
ko = keras.optimizers  # the classes the hub reproduces

SHAPES = [(5, 3), (3,), (3, 2), (2,)]
SEGMENTS = [int(np.prod(s)) for s in SHAPES]  # 15, 3, 6, 2: boundaries 15, 18, 24
STEPS = 50

OPTIMIZERS = {  # (class, hyper-parameters): Keras defaults and non-default values of each class
    "sgd": (ko.SGD, {"learning_rate": 0.05}),
    "sgd-momentum": (ko.SGD, {"learning_rate": 0.05, "momentum": 0.9}),
    "sgd-nesterov": (ko.SGD, {"learning_rate": 0.03, "momentum": 0.8, "nesterov": True}),
    "adam": (ko.Adam, {}),
    "adam-custom": (ko.Adam, {"learning_rate": 0.01, "beta_1": 0.8, "beta_2": 0.99,
                             "epsilon": 1e-5}),
    "adam-amsgrad": (ko.Adam, {"learning_rate": 0.01, "amsgrad": True}),
    "adamw": (ko.AdamW, {"learning_rate": 0.01}),
    "adamw-amsgrad": (ko.AdamW, {"learning_rate": 0.005, "weight_decay": 0.1, "beta_1": 0.85,
                                "amsgrad": True}),
    "rmsprop": (ko.RMSprop, {}),
    "rmsprop-centered-momentum": (ko.RMSprop, {"learning_rate": 0.01, "rho": 0.8, "momentum": 0.5,
                                              "epsilon": 1e-6, "centered": True}),
    "adagrad": (ko.Adagrad, {"learning_rate": 0.05}),
    "adagrad-custom": (ko.Adagrad, {"learning_rate": 0.1, "initial_accumulator_value": 0.5,
                                   "epsilon": 1e-5}),
    "adamax": (ko.Adamax, {"learning_rate": 0.01}),
    "adamax-custom": (ko.Adamax, {"learning_rate": 0.02, "beta_1": 0.7, "beta_2": 0.9,
                                 "epsilon": 1e-4}),
    "nadam": (ko.Nadam, {"learning_rate": 0.01}),
    "nadam-custom": (ko.Nadam, {"learning_rate": 0.005, "beta_1": 0.8, "beta_2": 0.95,
                               "epsilon": 1e-6}),
}
SETTINGS = {
    "plain": {},
    "clipnorm": {"clipnorm": 0.5},
    "clipvalue": {"clipvalue": 0.05},
    "global_clipnorm": {"global_clipnorm": 0.8},
    "weight_decay": {"weight_decay": 0.5},
}


def schedule():
    return ko.schedules.CosineDecay(0.001, decay_steps=30, alpha=0.1, warmup_target=0.02,
                                   warmup_steps=10)


CASES = [(o, s) for o in OPTIMIZERS for s in SETTINGS] + [
    (o, "schedule") for o in ("sgd-nesterov", "adam", "adamw", "rmsprop", "nadam")]


def gradients(seed: int = 0, steps: int = STEPS) -> list[list[np.ndarray]]:
    """Seeded gradient sets of mixed magnitudes, so clipping bites on some steps only."""
    rng = np.random.default_rng(seed)
    return [[(rng.normal(size=s) * rng.choice([0.01, 0.1, 1.0])).astype(np.float32) for s in SHAPES]
            for _ in range(steps)]


def initial_weights(seed: int = 1) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.normal(size=s).astype(np.float32) for s in SHAPES]


def flat(arrays) -> np.ndarray:
    return np.concatenate([np.asarray(a, np.float32).ravel() for a in arrays])


def make_keras(case: str, setting: str):
    cls, hyper = OPTIMIZERS[case]
    if setting == "schedule":
        return cls(**{**hyper, "learning_rate": schedule()})
    return cls(**{**hyper, **SETTINGS[setting]})


def run_keras(optimizer, grads, weights):
    variables = [keras.Variable(w) for w in weights]
    for step in grads:
        optimizer.apply([keras.ops.convert_to_tensor(g) for g in step], variables)
    return flat(v.numpy() for v in variables)


@pytest.mark.parametrize(("case", "setting"), CASES, ids=[f"{o}-{s}" for o, s in CASES])
def test_hub_optimizer_equals_keras_apply_after_50_steps(case, setting):
    grads, weights = gradients(), initial_weights()
    keras_opt = make_keras(case, setting)
    spec = describe_optimizer(keras_opt, SEGMENTS)
    assert json.loads(json.dumps(spec)) == spec  # travels to the hub as JSON
    expected = run_keras(keras_opt, grads, weights)

    hub = HubOptimizer(spec, size=sum(SEGMENTS))
    assert hub.name == type(keras_opt).__name__
    assert hub.has_schedule == (setting == "schedule")
    w = flat(weights)
    for step in grads:
        g = flat(step)
        before = g.copy()
        hub.apply(w, g)
        np.testing.assert_array_equal(g, before)  # g is never modified
    assert hub.iterations == int(keras_opt.iterations) == STEPS
    np.testing.assert_allclose(w, expected, rtol=1e-5, atol=1e-5)
    assert not np.allclose(w, flat(weights), rtol=0, atol=1e-4)  # it did train


def test_weight_decay_follows_exclude_from_weight_decay_given_the_variables():
    grads, weights = gradients(2), initial_weights(3)
    names = ["kernel", "bias", "kernel", "bias"]
    keras_opt = ko.AdamW(0.01, weight_decay=0.2)
    keras_opt.exclude_from_weight_decay(var_names=["bias"])
    variables = [keras.Variable(w, name=n) for w, n in zip(weights, names, strict=True)]
    spec = describe_optimizer(keras_opt, SEGMENTS, variables)
    assert spec["decay_mask"] == [True, False, True, False]
    for step in grads:
        keras_opt.apply([keras.ops.convert_to_tensor(g) for g in step], variables)

    hub, w = HubOptimizer(spec, sum(SEGMENTS)), flat(weights)
    for step in grads:
        hub.apply(w, flat(step))
    np.testing.assert_allclose(w, flat(v.numpy() for v in variables), rtol=1e-5, atol=1e-5)


def test_exclude_from_weight_decay_without_the_variables_is_refused():
    keras_opt = ko.AdamW(0.01)
    keras_opt.exclude_from_weight_decay(var_names=["bias"])
    with pytest.raises(UnsupportedOptimizerError, match="exclude_from_weight_decay.*Supported"):
        describe_optimizer(keras_opt, SEGMENTS)


def test_defaults_are_keras_defaults():
    for name in SUPPORTED_OPTIMIZERS:
        keras_opt = getattr(ko, name)()
        config = keras_opt.get_config()
        spec = {"class_name": name, "segments": [3]}  # nothing given: every default applies
        hub = HubOptimizer(spec, 3)
        for key in (*FORMULAS[name].defaults, "weight_decay", "clipnorm", "clipvalue",
                    "global_clipnorm"):
            assert hub.config[key] == config[key], (name, key)
        keras_lr = float(keras_opt.learning_rate.numpy())
        assert hub.learning_rate() == pytest.approx(keras_lr, rel=1e-7)


# -- shards -----------------------------------------------------------------------------------


def run_sharded(spec, bounds, grads, weights) -> np.ndarray:
    """The flat result of one HubOptimizer per shard [bounds[i], bounds[i+1])."""
    w = flat(weights)
    shards = [(HubOptimizer(spec, hi - lo, offset=lo), lo, hi)
              for lo, hi in itertools.pairwise(bounds)]
    for step in grads:
        g = flat(step)
        norm = np.sqrt(sum(sum_of_squares(g[lo:hi]) for _, lo, hi in shards))
        for opt, lo, hi in shards:
            opt.apply(w[lo:hi], g[lo:hi], global_norm=norm if opt.needs_global_norm else None)
    return w


@pytest.mark.parametrize(("case", "setting", "bounds"), [
    ("adam", "global_clipnorm", [0, 10, 20, 26]),  # shards cut variables
    ("nadam", "plain", [0, 7, 26]),
    ("rmsprop-centered-momentum", "weight_decay", [0, 1, 16, 17, 26]),
    ("sgd-nesterov", "clipvalue", [0, 20, 26]),
    ("adamw", "schedule", [0, 13, 26]),
    ("adagrad", "clipnorm", [0, 15, 24, 26]),  # clipnorm: shard boundaries on variable boundaries
])
def test_shards_together_equal_the_whole_vector(case, setting, bounds):
    grads, weights = gradients(4, steps=20), initial_weights(5)
    spec = describe_optimizer(make_keras(case, setting), SEGMENTS)
    whole = run_sharded(spec, [0, sum(SEGMENTS)], grads, weights)
    sharded = run_sharded(spec, bounds, grads, weights)
    np.testing.assert_allclose(sharded, whole, rtol=1e-6, atol=1e-7)


def test_clipnorm_clips_a_cut_variable_per_part():
    spec = {"class_name": "SGD", "config": {"clipnorm": 1.0}, "learning_rate": 1.0,
            "segments": [4]}
    w, g = np.zeros(2, np.float32), np.array([3, 4], np.float32)  # the shard [2, 4) of one variable
    HubOptimizer(spec, 2, offset=2).apply(w, g)
    np.testing.assert_allclose(w, [-0.6, -0.8])  # clipped by the part's norm, 5


def test_a_shard_outside_the_model_is_refused():
    with pytest.raises(ConfigError, match="not inside the model's 26 floats"):
        HubOptimizer(server_optimizer_spec("sgd", None, SEGMENTS), 10, offset=20)


# -- state, learning rate, memory ---------------------------------------------------------------


@pytest.mark.parametrize(("case", "setting"), [(o, "plain") for o in OPTIMIZERS] + [
    ("adamw", "schedule"), ("sgd-momentum", "global_clipnorm")])
def test_export_and_restore_continue_bit_identically(case, setting):
    spec = describe_optimizer(make_keras(case, setting), SEGMENTS)
    grads, size = [flat(s) for s in gradients(6, steps=30)], sum(SEGMENTS)
    first, w1 = HubOptimizer(spec, size), flat(initial_weights(7))
    for g in grads[:12]:
        first.apply(w1, g)
    state = first.export_state()
    json.dumps({k: v for k, v in state.items() if not isinstance(v, np.ndarray)})  # numbers: JSON
    second, w2 = HubOptimizer(spec, size), w1.copy()
    second.restore_state(state)
    for g in grads[12:]:
        first.apply(w1, g)
        second.apply(w2, g)
    np.testing.assert_array_equal(w1, w2)
    assert second.iterations == first.iterations == 30


def test_restore_refuses_a_state_of_another_optimizer():
    adam = HubOptimizer(server_optimizer_spec("adam", None, [4]), 4)
    sgd = HubOptimizer(server_optimizer_spec("momentum", None, [4]), 4)
    with pytest.raises(CheckpointError, match="Adam optimizer state does not fit"):
        adam.restore_state(sgd.export_state())
    state = adam.export_state()
    state["momentum"] = np.zeros(5, np.float32)
    with pytest.raises(CheckpointError, match="wrong shape"):
        adam.restore_state(state)


def test_set_learning_rate_overrides_the_schedule_and_survives_a_restore():
    spec = describe_optimizer(ko.Adam(learning_rate=schedule()), [3])
    opt, w = HubOptimizer(spec, 3), np.zeros(3, np.float32)
    for _ in range(4):
        assert opt.learning_rate() == schedule_value(spec["learning_rate"], opt.iterations)
        opt.apply(w, np.ones(3, np.float32))
    opt.set_learning_rate(0.5)
    opt.apply(w, np.ones(3, np.float32))
    assert opt.learning_rate() == 0.5 and opt.has_schedule
    restored = HubOptimizer(spec, 3)
    restored.restore_state(opt.export_state())
    assert restored.learning_rate() == 0.5
    with pytest.raises(ConfigError, match="finite number >= 0. Received: nan"):
        opt.set_learning_rate(float("nan"))


def test_lr_scale_scales_the_step_and_the_weight_decay():
    scaled = HubOptimizer({"class_name": "SGD", "config": {"weight_decay": 0.5},
                           "learning_rate": 0.2, "segments": [2]}, 2)
    halved = HubOptimizer({"class_name": "SGD", "config": {"weight_decay": 0.5},
                           "learning_rate": 0.1, "segments": [2]}, 2)
    w1, w2, g = np.ones(2, np.float32), np.ones(2, np.float32), np.array([1, -1], np.float32)
    scaled.apply(w1, g, lr_scale=0.5)
    halved.apply(w2, g)
    np.testing.assert_array_equal(w1, w2)


def test_server_optimizer_specs():
    assert server_optimizer_spec("sgd", None, [2])["learning_rate"] == 1.0
    assert server_optimizer_spec("adam", None, [2])["learning_rate"] == 1e-2
    assert server_optimizer_spec("momentum", 0.1, [2])["config"] == {"momentum": 0.9}
    nesterov = server_optimizer_spec("nesterov", None, [2])  # DiLoCo's outer optimizer
    assert nesterov["config"] == {"momentum": 0.9, "nesterov": True}
    assert nesterov["learning_rate"] == 0.7
    with pytest.raises(ConfigError,
                       match="'adamw'. Expected one of: sgd, momentum, adam, nesterov"):
        server_optimizer_spec("adamw", None, [2])


def test_state_nbytes_counts_slots_and_scratch():
    size = 1000
    sgd = HubOptimizer(server_optimizer_spec("sgd", None, [size]), size)
    assert sgd.state_nbytes == 2 * 4 * size  # scratch only
    adam = HubOptimizer({"class_name": "Adam", "config": {"amsgrad": True, "clipnorm": 1.0},
                         "segments": [size]}, size)
    assert adam.state_nbytes == (3 + 2 + 1) * 4 * size  # m, v, v̂; scratch; clipped gradient


def test_apply_allocates_nothing_proportional_to_the_model():
    size = 1_000_000
    segments = [size // 4] * 4
    opt = HubOptimizer({"class_name": "Nadam", "config": {"clipnorm": 1.0, "weight_decay": 0.01},
                        "segments": segments}, size)
    w, g = np.zeros(size, np.float32), np.full(size, 0.01, np.float32)
    opt.apply(w, g)
    tracemalloc.start()
    opt.apply(w, g)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 50_000, peak


# -- refusals ---------------------------------------------------------------------------------


def assert_names_it_and_lists_the_supported(info, *names: str) -> None:
    message = str(info.value)
    for name in names:
        assert name in message, message
    for name in SUPPORTED_OPTIMIZERS:
        assert name in message, message
    assert "--server-optimizer sgd" in message
    assert isinstance(info.value, ConfigError)


def test_a_subclass_of_a_supported_optimizer_is_refused():
    class WarmAdam(ko.Adam):
        pass

    with pytest.raises(UnsupportedOptimizerError) as info:
        describe_optimizer(WarmAdam(), SEGMENTS)
    assert_names_it_and_lists_the_supported(info, "WarmAdam", "subclass of keras.optimizers.Adam")


def test_an_optimizer_nbdist_does_not_reproduce_is_refused():
    with pytest.raises(UnsupportedOptimizerError) as info:
        describe_optimizer(ko.Lion(), SEGMENTS)
    assert_names_it_and_lists_the_supported(info, "Lion")


@pytest.mark.parametrize(("kwargs", "named"), [
    ({"use_ema": True}, "use_ema"),
    ({"gradient_accumulation_steps": 2}, "gradient_accumulation_steps=2"),
    ({"loss_scale_factor": 128.0}, "loss_scale_factor=128.0"),
])
def test_settings_the_hub_cannot_reproduce_are_refused(kwargs, named):
    with pytest.raises(UnsupportedOptimizerError) as info:
        describe_optimizer(ko.Adam(**kwargs), SEGMENTS)
    assert_names_it_and_lists_the_supported(info, named)


def test_a_loss_scale_optimizer_is_refused():
    with pytest.raises(UnsupportedOptimizerError) as info:
        describe_optimizer(ko.LossScaleOptimizer(ko.Adam()), SEGMENTS)
    assert_names_it_and_lists_the_supported(info, "LossScaleOptimizer", "mixed precision")


def test_variables_that_do_not_match_the_segments_are_refused():
    variables = [keras.Variable(w) for w in initial_weights()]
    # the hub applies it (test_constraints_keras.py)
    variables[2].constraint = keras.constraints.MaxNorm(2.0)
    assert describe_optimizer(ko.Adam(), SEGMENTS, variables)["segments"] == SEGMENTS
    with pytest.raises(ConfigError, match=r"sizes \[15, 3, 6, 2\] vs segments \[15, 3, 8\]"):
        describe_optimizer(ko.Adam(), [15, 3, 8], variables)


def test_an_unknown_schedule_is_refused():
    class Halving(ko.schedules.LearningRateSchedule):
        def __call__(self, step):
            return 0.1 / (1 + step)

    with pytest.raises(UnsupportedOptimizerError, match="Halving.*Supported: .*CosineDecay"):
        describe_optimizer(ko.RMSprop(learning_rate=Halving()), SEGMENTS)


def test_a_learning_rate_function_is_refused():
    with pytest.raises(UnsupportedOptimizerError) as info:
        describe_optimizer(ko.SGD(learning_rate=lambda: 0.1), SEGMENTS)
    assert_names_it_and_lists_the_supported(info, "function")


def test_bad_specs_are_refused_on_the_hub():
    with pytest.raises(UnsupportedOptimizerError, match="'Ftrl'"):
        HubOptimizer({"class_name": "Ftrl", "segments": [2]}, 2)
    with pytest.raises(ConfigError, match="Unknown setting.*beta1.*Valid: .*beta_1"):
        HubOptimizer({"class_name": "Adam", "config": {"beta1": 0.9}, "segments": [2]}, 2)
    with pytest.raises(ConfigError, match="Only one of clipnorm"):
        HubOptimizer({"class_name": "SGD", "config": {"clipnorm": 1.0, "clipvalue": 1.0},
                      "segments": [2]}, 2)
    with pytest.raises(ConfigError, match="momentum must be a finite number. Received: 'high'"):
        HubOptimizer({"class_name": "SGD", "config": {"momentum": "high"}, "segments": [2]}, 2)
    with pytest.raises(ConfigError, match="segments must be"):
        HubOptimizer({"class_name": "SGD", "segments": [2.5]}, 2)


def test_importing_the_optimizers_loads_neither_tensorflow_nor_keras():
    code = ("import sys, nbdist.algorithms.optimizers, nbdist.engine.optimizer_spec, "
            "nbdist.algorithms.schedules; "
            "assert 'tensorflow' not in sys.modules and 'keras' not in sys.modules, "
            "[m for m in sys.modules if m.startswith(('tensorflow', 'keras'))][:5]")
    subprocess.run([sys.executable, "-c", code], check=True)
