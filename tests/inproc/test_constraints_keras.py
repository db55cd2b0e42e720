"""Keras's weight constraints on the hub equal Keras's own: each constraint against Keras's
constraint objects, N hub updates against Keras's `optimizer.apply` on a constrained model,
every path of `Updater.push` (fused SGD with its reply copy, the optimizer, group, softsync,
local-steps deltas, EASGD, shards), the kernel's reading of the model's constraints and its
refusals, and the modes that train in this process (simulate, local, pipeline).
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from nbdist.algorithms import make_rule
from nbdist.algorithms.blocks import run_serial
from nbdist.algorithms.constraints import ShardConstraints, constrain, constrained_ranges
from nbdist.algorithms.optimizers import HubOptimizer, server_optimizer_spec
from nbdist.config import TrainConfig
from nbdist.core.sharding import shard_bounds
from nbdist.core.updater import Updater
from nbdist.engine.optimizer_spec import (
    choose_constraints,
    describe_constraints,
    describe_optimizer,
)
from nbdist.errors import ConfigError, UnsupportedOptimizerError

keras = pytest.importorskip("keras")
kc = keras.constraints


# -- each constraint against Keras's object ---------------------------------------------------

CASES = {  # name: (shape, Keras's object, our class name and config, scale of the weights)
    "dense-maxnorm": ((300, 40), kc.MaxNorm(2.0), ("MaxNorm", {"max_value": 2.0, "axis": 0})),
    "dense-maxnorm-default": ((30, 7), kc.MaxNorm(), ("MaxNorm", {})),
    "dense-unitnorm": ((300, 40), kc.UnitNorm(), ("UnitNorm", {"axis": 0})),
    "dense-minmax-rows": ((20, 30), kc.MinMaxNorm(0.5, 1.5, rate=0.7, axis=1),
                          ("MinMaxNorm", {"min_value": 0.5, "max_value": 1.5, "rate": 0.7,
                                          "axis": 1})),
    "conv-maxnorm": ((3, 3, 16, 32), kc.MaxNorm(1.5, axis=[0, 1, 2]),
                     ("MaxNorm", {"max_value": 1.5, "axis": [0, 1, 2]})),
    "conv-minmax": ((3, 3, 16, 32), kc.MinMaxNorm(0.5, 1.0, rate=0.5, axis=[0, 1, 2]),
                    ("MinMaxNorm", {"min_value": 0.5, "max_value": 1.0, "rate": 0.5,
                                    "axis": [0, 1, 2]})),
    "conv-unitnorm": ((5, 5, 3, 8), kc.UnitNorm(axis=[0, 1, 2]), ("UnitNorm", {"axis": [0, 1, 2]})),
    "bias-nonneg": ((64,), kc.NonNeg(), ("NonNeg", {})),
    "bias-maxnorm": ((64,), kc.MaxNorm(1.0), ("MaxNorm", {"max_value": 1.0})),
    "kernel-nonneg": ((30, 20), kc.NonNeg(), ("NonNeg", {})),
}


@pytest.mark.parametrize("case", CASES)
def test_each_constraint_equals_keras_on_random_tensors(case):
    shape, keras_constraint, (name, config) = CASES[case]
    rng = np.random.default_rng(len(case))
    bit = 0
    for scale in (0.01, 0.1, 1.0):  # norms below, around and above the bounds
        w = (rng.normal(size=shape) * scale).astype(np.float32)
        expected = keras.ops.convert_to_numpy(keras_constraint(keras.Variable(w)))
        got = w.copy()
        constrain(got, name, config)
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)
        bit += not np.allclose(got, w, rtol=0, atol=1e-6)
    assert bit  # the constraint did something on some scale


# -- a constrained model: the kernel's description --------------------------------------------

def constrained_model(unit: object = None):
    keras.utils.set_random_seed(0)
    inp = keras.Input((6, 6, 2))
    x = keras.layers.Conv2D(4, 3, kernel_constraint=kc.MinMaxNorm(0.5, 1.0, rate=0.5,
                                                                  axis=[0, 1, 2]))(inp)
    x = keras.layers.Flatten()(x)
    x = keras.layers.Dense(8, kernel_constraint=kc.MaxNorm(2.0), bias_constraint="non_neg")(x)
    out = keras.layers.Dense(3, kernel_constraint=unit or kc.UnitNorm())(x)
    return keras.Model(inp, out)


def layout(model):
    variables = list(model.trainable_variables)
    return variables, [int(np.prod(v.shape)) for v in variables]


def test_the_kernel_describes_each_constrained_variable_as_json():
    variables, segments = layout(constrained_model())
    entries = describe_constraints(variables)
    assert json.loads(json.dumps(entries)) == entries
    assert [(e["class_name"], e["start"], e["shape"]) for e in entries] == [
        ("MinMaxNorm", 0, [3, 3, 2, 4]), ("MaxNorm", 76, [64, 8]), ("NonNeg", 588, [8]),
        ("UnitNorm", 596, [8, 3])]
    assert entries[0]["config"] == {"min_value": 0.5, "max_value": 1.0, "rate": 0.5,
                                    "axis": [0, 1, 2]}
    assert (entries[1]["variable"].endswith("kernel")
            and entries[1]["epsilon"] == pytest.approx(1e-7))
    assert constrained_ranges(entries)[1] == (76, 76 + 512) and sum(segments) == 623


def test_the_base_constraint_does_nothing_and_needs_no_entry():
    variables, _ = layout(constrained_model(unit=kc.Constraint()))
    assert ([e["class_name"] for e in describe_constraints(variables)]
            == ["MinMaxNorm", "MaxNorm", "NonNeg"])


def test_keras_epsilon_set_by_the_cell_travels_with_the_entry():
    variables, _ = layout(constrained_model())
    keras.config.set_epsilon(1e-4)
    try:
        assert {e["epsilon"] for e in describe_constraints(variables)} == {1e-4}
    finally:
        keras.config.set_epsilon(1e-7)


class ClippedMaxNorm(kc.MaxNorm):
    def __call__(self, w):
        return keras.ops.clip(super().__call__(w), -0.1, 0.1)


class Halve(kc.Constraint):
    def __call__(self, w):
        return w * 0.5


def clip_weights(w):
    return keras.ops.clip(w, -1.0, 1.0)


@pytest.mark.parametrize(("custom", "named", "what"), [
    (ClippedMaxNorm(2.0), "ClippedMaxNorm", "a subclass of keras.constraints.MaxNorm"),
    (Halve(), "Halve", "a custom keras.constraints.Constraint"),
    (clip_weights, "clip_weights", "a function"),
])
def test_a_custom_constraint_is_refused_saying_what_why_and_how_to_proceed(custom, named, what):
    variables, _ = layout(constrained_model(unit=custom))
    with pytest.raises(UnsupportedOptimizerError) as info:
        describe_constraints(variables)
    message = str(info.value)
    assert re.search(rf"Received: variable 'dense\w*/kernel' with the constraint \S*{named} "
                     rf"\({what}", message)
    assert "MaxNorm, MinMaxNorm, NonNeg, UnitNorm (exactly these classes)" in message
    assert "--mode sync" in message and "own Keras optimizer applies any constraint" in message
    # where each rank or stage applies the cell's own optimizer, nothing is refused
    for mode in ("sync", "pipeline"):
        assert choose_constraints(TrainConfig(mode=mode), variables) == []
    with pytest.raises(UnsupportedOptimizerError):
        choose_constraints(TrainConfig(mode="local"), variables)


def test_the_optimizer_spec_no_longer_refuses_a_constrained_model():
    variables, segments = layout(constrained_model())
    spec = describe_optimizer(keras.optimizers.Adam(), segments, variables)
    assert spec["class_name"] == "Adam" and spec["segments"] == segments


# -- N hub updates against Keras's optimizer.apply ------------------------------------------

def gradients(segments, steps, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=sum(segments)).astype(np.float32) for _ in range(steps)]


def keras_steps(model, optimizer, grads):
    """Keras's own `optimizer.apply` (which ends with the constraints) on the flat gradients."""
    variables, _ = layout(model)
    for g in grads:
        parts, start = [], 0
        for v in variables:
            n = int(np.prod(v.shape))
            parts.append(keras.ops.convert_to_tensor(g[start:start + n].reshape(v.shape)))
            start += n
        optimizer.apply(parts, variables)
    return flat(variables)


def flat(variables):
    return np.concatenate([np.asarray(v.numpy(), np.float32).ravel() for v in variables])


@pytest.mark.parametrize("make", [
    lambda: keras.optimizers.SGD(0.1),
    lambda: keras.optimizers.Adam(0.05),
    lambda: keras.optimizers.SGD(0.05, momentum=0.9, clipnorm=1.0),
], ids=["sgd", "adam", "momentum-clipnorm"])
def test_hub_updates_with_constraints_equal_keras_optimizer_apply(make):
    """20 updates; measured: at most 2.4e-7 apart after 100 (weights up to 2.8)."""
    model = constrained_model()
    variables, segments = layout(model)
    w0 = flat(variables)
    spec = describe_optimizer(make(), segments, variables)
    entries = describe_constraints(variables)
    grads = gradients(segments, 20)
    expected = keras_steps(model, make(), grads)

    hub = Updater(make_rule("asgd", w0.size, 1), spec, constraints=entries)
    plain = Updater(make_rule("asgd", w0.size, 1), spec)
    w, unconstrained = w0.copy(), w0.copy()
    for g in grads:
        assert hub.push(0, w, g, delay=0) == (True, False)
        plain.push(0, unconstrained, g, delay=0)
    np.testing.assert_allclose(w, expected, rtol=1e-6, atol=1e-6)
    assert np.abs(unconstrained - expected).max() > 1e-2  # the constraints did bite
    kernel = w[76:76 + 512].reshape(64, 8)
    assert np.linalg.norm(kernel, axis=0).max() <= 2.0 + 1e-6


# -- every path of Updater.push ------------------------------------------------------------

@pytest.fixture(scope="module")
def setup():
    model = constrained_model()
    variables, segments = layout(model)
    return flat(variables), segments, describe_constraints(variables)


def by_hand(w, entries):
    ShardConstraints(entries, 0, w.size).apply(w)
    return w


def test_fused_sgd_constrains_before_its_reply_copy(setup):
    w0, segments, entries = setup
    spec = describe_optimizer(keras.optimizers.SGD(0.5), segments)
    up = Updater(make_rule("asgd", w0.size, 1), spec, constraints=entries)
    assert up.fused
    w, out = w0.copy(), np.full(w0.size, np.nan, np.float32)
    for g in gradients(segments, 3, seed=1):
        expected = by_hand(w - np.float32(0.5) * g, entries)
        assert up.push(0, w, g, delay=0, into=out) == (True, True)
        np.testing.assert_allclose(w, expected, rtol=1e-6, atol=1e-7)
        np.testing.assert_array_equal(out, w)  # the reply holds the constrained weights


def test_the_optimizer_path_constrains_and_refreshes_its_blockwise_reply_copy(setup):
    w0, segments, entries = setup
    spec = describe_optimizer(keras.optimizers.Adam(0.05), segments)
    up = Updater(make_rule("asgd", w0.size, 1), spec, constraints=entries)
    up.optimizer.use_blocks(run_serial, [(0, 300), (300, w0.size)])  # copies the reply itself
    reference = HubOptimizer(spec, w0.size)
    w, w_hand, out = w0.copy(), w0.copy(), np.empty(w0.size, np.float32)
    for g in gradients(segments, 3, seed=2):
        assert up.push(0, w, g, delay=0, into=out) == (True, True)
        reference.apply(w_hand, g)
        by_hand(w_hand, entries)
        np.testing.assert_allclose(w, w_hand, rtol=1e-6, atol=1e-7)
        np.testing.assert_array_equal(out, w)


def test_a_group_step_is_constrained(setup):
    w0, segments, entries = setup
    spec = describe_optimizer(keras.optimizers.RMSprop(0.01), segments)
    up = Updater(make_rule("group", w0.size, 2), spec, constraints=entries)
    w, w_hand, g = w0.copy(), w0.copy(), gradients(segments, 1, seed=3)[0]
    up.push(0, w, g, delay=0, scale=1.5)
    HubOptimizer(spec, w0.size).apply(w_hand, g, lr_scale=1.5)
    np.testing.assert_allclose(w, by_hand(w_hand, entries), rtol=1e-6, atol=1e-7)


def test_softsync_constrains_when_it_applies_not_while_it_buffers(setup):
    w0, segments, entries = setup
    spec = describe_optimizer(keras.optimizers.SGD(0.1, momentum=0.5), segments)
    up = Updater(make_rule("softsync", w0.size, 2, {"n": 1}), spec, constraints=entries)  # c = 2
    w = w0.copy()
    w[588:596] = -1  # the NonNeg bias, outside its constraint: untouched until an update
    g1, g2 = gradients(segments, 2, seed=4)
    assert up.push(0, w, g1, delay=0) == (False, False)
    assert (w[588:596] == -1).all()
    w_hand = w.copy()
    assert up.push(1, w, g2, delay=0)[0]
    HubOptimizer(spec, w0.size).apply(w_hand, (g1 + g2) * np.float32(0.5))
    np.testing.assert_allclose(w, by_hand(w_hand, entries), rtol=1e-6, atol=1e-7)
    assert (w[588:596] >= 0).all()


def test_a_local_steps_delta_is_applied_then_constrained(setup):
    w0, segments, entries = setup
    up = Updater(make_rule("asgd", w0.size, 1), server_optimizer_spec("sgd", None, segments),
                 constraints=entries)
    delta = gradients(segments, 1, seed=5)[0]
    w = w0.copy()
    up.push(0, w, delta, delay=0)
    np.testing.assert_allclose(w, by_hand(w0 - delta, entries), rtol=1e-6, atol=1e-7)


def test_the_easgd_centre_is_constrained_after_each_elastic_sum(setup):
    w0, segments, entries = setup
    up = Updater(make_rule("easgd", w0.size, 2), None, constraints=entries)
    e = gradients(segments, 1, seed=6)[0]
    w, out = w0.copy(), np.empty(w0.size, np.float32)
    assert up.push(0, w, e, delay=0, into=out) == (True, True)
    np.testing.assert_allclose(w, by_hand(w0 + e, entries), rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(out, w)


@pytest.mark.parametrize("shards", [2, 3, 4])
def test_shards_with_aligned_bounds_together_equal_one_shard(setup, shards):
    w0, segments, entries = setup
    spec = describe_optimizer(keras.optimizers.Adam(0.05), segments)
    bounds = shard_bounds(w0.size, shards, whole=constrained_ranges(entries))
    whole = Updater(make_rule("asgd", w0.size, 1), spec, constraints=entries)
    parts = [(Updater(make_rule("asgd", hi - lo, 1), spec, lo, constraints=entries), lo, hi)
             for lo, hi in bounds]
    w, w_sharded = w0.copy(), w0.copy()
    for g in gradients(segments, 5, seed=7):
        whole.push(0, w, g, delay=0)
        for up, lo, hi in parts:
            up.push(0, w_sharded[lo:hi], g[lo:hi], delay=0)
    np.testing.assert_allclose(w_sharded, w, rtol=1e-6, atol=1e-7)
    with pytest.raises(ConfigError, match="is cut by the shard"):
        # [50, 150) cuts the MaxNorm kernel
        Updater(make_rule("asgd", 100, 1), spec, 50, constraints=entries)
