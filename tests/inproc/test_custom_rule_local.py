"""A rule written in the notebook (`nbdist.Rule`) trains in the kernel's own modes (local:
the hub in this kernel; simulate: virtual workers), named by its class or, as the magic's
`--algorithm NAME` does, by its name in the notebook's namespace; a rule that fails a
property, or that defines only a plain-SGD step for a cell that compiles Adam, is refused
before anything trains. (On a cluster's hub: tests/cluster/test_custom_rule_cluster.py.)"""

from __future__ import annotations

import numpy as np
import pytest

import nbdist
from nbdist.algorithms.custom import CUSTOM
from nbdist.errors import ConfigError
from tests.helpers import SEEDED_SYNTHETIC_CELL
from tests.rule_cases import half_step_rule

HalfStep = half_step_rule("half-step")


class Copying(nbdist.Rule):
    name = "copying"

    def on_push(self, worker, w, g, lr, delay):
        w -= lr * g  # a new array per push
        return True


def _weights(ns: dict) -> np.ndarray:
    return np.concatenate([v.numpy().ravel() for v in ns["model"].trainable_variables])


def _train(namespace: dict, **options):
    options = {"mode": "local", "epochs": 1, "batch_size": 64, "seed": 3, "wait": True,
               **options}
    run = nbdist.train(SEEDED_SYNTHETIC_CELL, namespace=namespace, **options)
    assert run.status == "finished", run.error
    return run


@pytest.fixture(autouse=True)
def _forget_the_rules():
    yield
    for name in ("half-step", "copying"):
        CUSTOM.pop(name, None)


def test_a_rule_of_yours_trains_as_its_numpy_says_by_class_and_by_name():
    ours, by_name, builtin, other = {}, {"HalfStep": HalfStep}, {}, {}
    _train(ours, algorithm=HalfStep, lr=0.2)
    _train(by_name, algorithm="half-step", lr=0.2)  # as %%distribute --algorithm half-step
    _train(builtin, algorithm="asgd", lr=0.1)
    _train(other, algorithm="asgd", lr=0.2)
    np.testing.assert_allclose(_weights(ours), _weights(builtin), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(_weights(by_name), _weights(ours), rtol=1e-5, atol=1e-6)
    assert np.abs(_weights(ours) - _weights(other)).max() > 1e-3  # the rule, not asgd, ran
    # the cell that defines it edited and run again: the notebook's class is the one that runs
    edited = {"HalfStep": half_step_rule("half-step")}
    _train(edited, algorithm="half-step", lr=0.2)
    assert CUSTOM["half-step"] is edited["HalfStep"]


def test_a_rule_of_yours_runs_in_the_simulator_too():
    ns = {}
    run = nbdist.train(SEEDED_SYNTHETIC_CELL, namespace=ns, mode="simulate", workers=2,
                       epochs=1, batch_size=64, seed=3, algorithm=HalfStep, wait=True)
    assert run.status == "finished", run.error
    assert run.config.rule_name == "half-step"


def test_a_rule_that_fails_a_property_or_the_optimizer_is_refused_before_training():
    with pytest.raises(ConfigError, match="The rule copying allocates .* in a push"):
        nbdist.train(SEEDED_SYNTHETIC_CELL, namespace={}, mode="local", algorithm=Copying)
    with pytest.raises(ConfigError, match="Unknown --algorithm 'nowhere'.*a rule of yours"):
        nbdist.train(SEEDED_SYNTHETIC_CELL, namespace={}, mode="local", algorithm="nowhere")
    adam = SEEDED_SYNTHETIC_CELL.replace("keras.optimizers.SGD(0.1)", "keras.optimizers.Adam()")
    assert adam != SEEDED_SYNTHETIC_CELL
    with pytest.raises(ConfigError, match="Your rule half-step defines on_push.*Adam"):
        nbdist.train(adam, namespace={}, mode="local", algorithm=HalfStep, wait=True)
