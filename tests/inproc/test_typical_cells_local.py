"""The cells people actually write (tests.helpers.TYPICAL_CELLS: a tutorial convnet with
optimizer="adam", an MLP with RMSprop on a schedule) trained in this kernel, in --mode local and
simulate, against plain `model.fit`: each comes within 0.03 of `fit`'s accuracy."""

import pytest

from tests.helpers import TYPICAL_CELLS, train_typical, typical_fit_accuracy


@pytest.fixture(scope="module")
def fit_accuracy():
    return typical_fit_accuracy()


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(TYPICAL_CELLS))
def test_local_mode_trains_with_the_cells_optimizer_like_fit(fit_accuracy, name):
    accuracy, _ = train_typical(TYPICAL_CELLS[name], mode="local")
    assert accuracy >= fit_accuracy[name] - 0.03, (accuracy, fit_accuracy[name])


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(TYPICAL_CELLS))
def test_simulate_mode_trains_with_the_cells_optimizer_like_fit(fit_accuracy, name):
    accuracy, _ = train_typical(TYPICAL_CELLS[name], mode="simulate", workers=2)
    assert accuracy >= fit_accuracy[name] - 0.03, (accuracy, fit_accuracy[name])
