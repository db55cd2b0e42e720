"""Keras's learning-rate schedules in NumPy agree with Keras's own `schedule(step)`.

Each case is evaluated at the steps that matter (0, 1, boundaries, warm-up, past the end) as
the optimizer calls it: with an int64 step, like `optimizer.iterations`.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from nbdist.algorithms.schedules import SUPPORTED_SCHEDULES, schedule_value
from nbdist.engine.optimizer_spec import describe_schedule
from nbdist.errors import ConfigError, UnsupportedOptimizerError

keras = pytest.importorskip("keras")
S = keras.optimizers.schedules

STEPS = sorted({*range(0, 40), 49, 50, 51, 99, 100, 101, 149, 150, 151, 199, 200, 201, 299, 300,
                301, 449, 450, 451, 700, 1000, 10_000, 123_457})

CASES = {
    "exponential": lambda: S.ExponentialDecay(0.1, decay_steps=100, decay_rate=0.96),
    "exponential-staircase": lambda: S.ExponentialDecay(0.05, 30, 0.5, staircase=True),
    "piecewise": lambda: S.PiecewiseConstantDecay([50, 150, 300], [0.1, 0.05, 0.01, 0.001]),
    "piecewise-one-boundary": lambda: S.PiecewiseConstantDecay([100], [1.0, 0.5]),
    "piecewise-float-boundaries": lambda: S.PiecewiseConstantDecay([49.5, 150.9], [0.3, 0.2, 0.1]),
    "cosine": lambda: S.CosineDecay(0.1, decay_steps=200),
    "cosine-alpha": lambda: S.CosineDecay(0.02, decay_steps=150, alpha=0.1),
    "cosine-warmup": lambda: S.CosineDecay(0.0, decay_steps=300, warmup_target=0.1,
                                           warmup_steps=50),
    "cosine-warmup-from-nonzero": lambda: S.CosineDecay(0.01, 100, alpha=0.05, warmup_target=0.2,
                                                        warmup_steps=30),
    "cosine-restarts": lambda: S.CosineDecayRestarts(0.1, first_decay_steps=50),
    "cosine-restarts-constant-period": lambda: S.CosineDecayRestarts(0.1, 30, t_mul=1.0,
                                                                     m_mul=0.8, alpha=0.1),
    "cosine-restarts-shrinking": lambda: S.CosineDecayRestarts(0.05, 20, t_mul=1.5, m_mul=0.5),
    "inverse-time": lambda: S.InverseTimeDecay(0.1, decay_steps=10, decay_rate=0.5),
    "inverse-time-staircase": lambda: S.InverseTimeDecay(0.1, 25, 2.0, staircase=True),
    "polynomial": lambda: S.PolynomialDecay(0.1, decay_steps=200),
    "polynomial-power": lambda: S.PolynomialDecay(0.1, 150, end_learning_rate=0.01, power=2.0),
    "polynomial-cycle": lambda: S.PolynomialDecay(0.1, 100, end_learning_rate=0.001, power=0.5,
                                                  cycle=True),
}


def keras_value(schedule, step: int) -> float:
    return float(schedule(keras.ops.convert_to_tensor(step, dtype="int64")))


@pytest.mark.parametrize("case", sorted(CASES))
def test_schedule_matches_keras_at_every_step_that_matters(case):
    schedule = CASES[case]()
    spec = describe_schedule(schedule)
    assert json.loads(json.dumps(spec)) == spec  # travels to the hub as JSON
    ours = np.array([schedule_value(spec, s) for s in STEPS])
    theirs = np.array([keras_value(schedule, s) for s in STEPS])
    np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-12)


def test_every_keras_schedule_is_supported():
    builtin = {name for name in dir(S) if isinstance(getattr(S, name), type)
               and issubclass(getattr(S, name), S.LearningRateSchedule)
               and getattr(S, name) is not S.LearningRateSchedule}
    assert builtin == set(SUPPORTED_SCHEDULES)


def test_subclassed_schedule_is_refused_naming_it_and_listing_the_supported():
    class Halving(S.ExponentialDecay):
        def __call__(self, step):
            return super().__call__(step) / 2

    with pytest.raises(UnsupportedOptimizerError) as info:
        describe_schedule(Halving(0.1, 10, 0.5))
    message = str(info.value)
    assert "Halving" in message and "subclass" in message
    assert all(name in message for name in SUPPORTED_SCHEDULES)
    assert "--server-optimizer sgd" in message
    assert isinstance(info.value, ConfigError)


def test_custom_schedule_is_refused():
    class Warmup(S.LearningRateSchedule):
        def __call__(self, step):
            return 0.1

    with pytest.raises(UnsupportedOptimizerError, match="Warmup.*Supported: .*ExponentialDecay"):
        describe_schedule(Warmup())


def test_unknown_spec_is_refused_when_evaluated():
    with pytest.raises(UnsupportedOptimizerError, match="'StepDecay'.*PolynomialDecay"):
        schedule_value({"class_name": "StepDecay", "config": {}}, 3)


def test_incomplete_spec_names_the_missing_setting():
    with pytest.raises(UnsupportedOptimizerError, match="decay_rate"):
        schedule_value({"class_name": "ExponentialDecay",
                        "config": {"initial_learning_rate": 0.1, "decay_steps": 10}}, 3)


def test_defaults_are_filled_in_like_keras():
    spec = {"class_name": "PolynomialDecay", "config": {"initial_learning_rate": 0.1,
                                                        "decay_steps": 100}}
    assert schedule_value(spec, 100) == pytest.approx(keras_value(S.PolynomialDecay(0.1, 100), 100))
