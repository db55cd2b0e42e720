"""A cell with Keras weight constraints trained in this kernel: the MaxNorm cell
(tests.helpers.MAXNORM_CELL) in --mode local and simulate comes within 0.03 of plain `fit`, every
column norm within the bound; pipeline stages apply the cell's own optimizer, so constraints
(a custom one too) hold there as on one machine; and what the hubs cannot do is refused before
anything starts. (Async workers and sync ranks on a cluster:
tests/cluster/test_constraint_cells.py.)
"""

from __future__ import annotations

import numpy as np
import pytest

from nbdist.config import TrainConfig
from nbdist.errors import ConfigError, UnsupportedOptimizerError
from tests.helpers import (
    MAXNORM_CELL,
    PIPELINE_SKIP_CELL,
    column_norms,
    prepared,
    train_typical,
    typical_fit_accuracy,
)

BOUND = 2.0 + 1e-6


@pytest.fixture(scope="module")
def fit_accuracy():
    return typical_fit_accuracy({"maxnorm": MAXNORM_CELL})["maxnorm"]


@pytest.mark.slow
@pytest.mark.parametrize("options", [{"mode": "local"}, {"mode": "local", "servers": 2},
                                     {"mode": "local", "local_steps": 4},
                                     {"mode": "simulate", "workers": 2}],
                         ids=["local", "local-2-shards", "local-steps", "simulate"])
def test_a_maxnorm_cell_trains_like_fit_with_every_column_within_the_bound(fit_accuracy, options):
    """(Two shards: the boundary moves to the first kernel's end; a hub whose shard cut a
    constrained variable would refuse to start. Local steps: the worker's Keras optimizer
    constrains each step, the hub its server update. The last update's weights, where the
    constraint bites: the tail's mean of columns on the ball's surface lies inside it.)"""
    accuracy, run = train_typical(MAXNORM_CELL, average_tail=0, **options)
    assert accuracy >= fit_accuracy - 0.03, (accuracy, fit_accuracy)
    norms = column_norms(run.model)
    assert max(norms) <= BOUND, norms
    assert norms[0] >= 1.99, norms  # it bit: without the constraint this column reaches 2.16


def test_the_job_carries_the_constraints_and_refuses_shards_that_would_cut_one():
    job = prepared(MAXNORM_CELL, TrainConfig(mode="local"))
    assert [(e["class_name"], e["start"], e["shape"]) for e in job.constraints] == [
        ("MaxNorm", 0, [784, 128]), ("MaxNorm", 100480, [128, 128]), ("MaxNorm", 116992, [128, 10])]
    assert prepared(MAXNORM_CELL, TrainConfig(mode="sync", workers=2)).constraints == []
    cell = MAXNORM_CELL.replace('activation="relu", kernel',
                                'activation="relu", bias_constraint="non_neg", kernel')
    cell = cell.replace('activation="softmax", kernel',
                        'activation="softmax", bias_constraint="non_neg", kernel')
    # every variable constrained: the cuts can only fall between the 6 variables
    with pytest.raises(ConfigError,
                       match=r"cannot be split into 7 parameter shards.*Use --servers 6 or fewer"):
        prepared(cell, TrainConfig(mode="local", servers=7))


def test_a_custom_constraint_is_refused_before_anything_trains():
    cell = MAXNORM_CELL.replace("keras.constraints.MaxNorm(2.0))",
                                "lambda w: keras.ops.clip(w, -1, 1))", 1)
    with pytest.raises(UnsupportedOptimizerError,
                       match=r"constraint <lambda> \(a function\).*--mode sync"):
        prepared(cell, TrainConfig(mode="local"))
    assert prepared(cell, TrainConfig(mode="sync", workers=2)).constraints == []


PIPELINE_CONSTRAINED_CELL = PIPELINE_SKIP_CELL.replace(
    'name="d1"', 'name="d1", kernel_constraint=keras.constraints.MaxNorm(0.5)').replace(
    'name="d3"', 'name="d3", kernel_constraint=lambda w: keras.ops.clip(w, -0.05, 0.05)')


@pytest.mark.slow
def test_pipeline_stages_apply_the_constraints_as_one_machine_does():
    from nbdist.core.schedule import epoch_permutation
    from nbdist.engine.cell import inspect_cell
    from nbdist.modes.pipeline.start import start_stages

    cell = "B = 16\n" + PIPELINE_CONSTRAINED_CELL
    ref: dict = {}
    exec(compile(cell, "<cell>", "exec"), ref)  # noqa: S102 - the test's own cell
    model, x, y = ref["model"], ref["x_train"], ref["y_train"]
    perm = epoch_permutation(len(x), 0, 0)
    for start in range(0, len(x), 16):  # one machine, the same mini-batches in the same order
        model.train_on_batch(x[perm[start:start + 16]], y[perm[start:start + 16]])

    config = TrainConfig(mode="pipeline", stages=2, micro_batches=4, batch_size=16,
                         partition="uniform", timeout=60)
    ns: dict = {}
    exec(compile(cell, "<cell>", "exec"), ns)  # noqa: S102
    run = start_stages(cell, config, None, ns, False, inspect_cell(cell, ns, config), [],
                       in_process=True)
    run.wait(timeout=120)
    for a, b in zip(ns["model"].weights, model.weights, strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-5)
    layers = {layer.name: layer.kernel.numpy()
              for layer in ns["model"].layers if hasattr(layer, "kernel")}
    assert np.linalg.norm(layers["d1"], axis=0).max() <= 0.5 + 1e-6
    assert np.abs(layers["d3"]).max() <= 0.05 + 1e-7
