"""The dropout paper's MaxNorm cell (tests.helpers.MAXNORM_CELL) on a real cluster: two async
workers (the hub applies the constraints after each update) and two sync ranks (each rank's
own Keras optimizer applies them) come within 0.03 of plain `fit` at equal epochs, with every
column norm within the bound; sync also applies a custom constraint, which the hub refuses.
(--mode local and simulate: tests/inproc/test_constraint_cells_local.py.)
"""

import numpy as np
import pytest

from tests.helpers import MAXNORM_CELL, column_norms, train_typical, typical_fit_accuracy

BOUND = 2.0 + 1e-6


@pytest.fixture(scope="module")
def fit_accuracy():
    return typical_fit_accuracy({"maxnorm": MAXNORM_CELL})["maxnorm"]


def test_async_two_workers_train_a_maxnorm_cell_like_fit_within_the_bound(cluster, fit_accuracy):
    # the last update's weights, where the constraint bites (the tail's mean of columns on the
    # ball's surface lies inside it: tests/unit/test_tail_average.py)
    accuracy, run = train_typical(MAXNORM_CELL, cluster=cluster, workers=2, average_tail=0)
    assert accuracy >= fit_accuracy - 0.03, (accuracy, fit_accuracy)
    norms = column_norms(run.model)
    assert max(norms) <= BOUND, norms
    assert norms[0] >= 1.99, norms  # it bit: without the constraint this column reaches 2.16


@pytest.mark.horovod
def test_sync_ranks_apply_the_constraints_a_custom_one_too(cluster, fit_accuracy):
    pytest.importorskip("horovod.tensorflow", reason="Horovod is built by `make horovod`")
    accuracy, run = train_typical(MAXNORM_CELL, cluster=cluster, mode="sync", workers=2)
    assert accuracy >= fit_accuracy - 0.03, (accuracy, fit_accuracy)
    assert max(column_norms(run.model)) <= BOUND
    custom = MAXNORM_CELL.replace("keras.constraints.MaxNorm(2.0))",
                                  "lambda w: keras.ops.clip(w, -0.05, 0.05))", 1)
    _, run = train_typical(custom, cluster=cluster, mode="sync", workers=2)
    first = run.model.layers[1].kernel.numpy()  # Dropout, then the clipped Dense
    assert np.abs(first).max() <= 0.05 + 1e-7
    assert (np.abs(first) == np.float32(0.05)).any()  # the clip bit
