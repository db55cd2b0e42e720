"""A rule written in the notebook runs on a real cluster's hub (its own process on an engine):
the class travels by value in the hub's spec. With one worker the pushes are a known
sequence, so the hub's weights after them equal what the rule's NumPy says: half-rate SGD
ends where asgd at half the rate ends, and not where asgd at the full rate does."""

from __future__ import annotations

import numpy as np
import pytest

import nbdist
from nbdist.algorithms.custom import CUSTOM
from tests.helpers import SEEDED_SYNTHETIC_CELL
from tests.rule_cases import half_step_rule

pytestmark = pytest.mark.cluster


def _weights(ns: dict) -> np.ndarray:
    return np.concatenate([v.numpy().ravel() for v in ns["model"].trainable_variables])


def _train(cluster, **options) -> dict:
    ns = {}
    run = nbdist.train(SEEDED_SYNTHETIC_CELL, cluster=cluster, namespace=ns, workers=1,
                       epochs=1, batch_size=64, seed=3, wait=True, **options)
    assert run.status == "finished", run.error
    return ns


def test_a_rule_defined_in_the_notebook_trains_on_the_clusters_hub_as_its_numpy_says(cluster):
    rule = half_step_rule("half-step-cluster")  # as a notebook cell defines it
    try:
        ours = _train(cluster, algorithm=rule, lr=0.2)
    finally:
        CUSTOM.pop(rule.name, None)
    half = _train(cluster, algorithm="asgd", lr=0.1)
    full = _train(cluster, algorithm="asgd", lr=0.2)
    np.testing.assert_allclose(_weights(ours), _weights(half), rtol=1e-5, atol=1e-6)
    assert np.abs(_weights(ours) - _weights(full)).max() > 1e-3  # the rule, not asgd, ran
