"""The tutorial cells with their own model.fit(...) call, --mode local: within 0.03 of plain
Keras at equal epochs, Keras's own loop never run (the cluster modes:
tests/cluster/test_fit_cells.py)."""

import contextlib
import io

import pytest

import nbdist
from tests.tutorial_cells import FIT_CELLS, fit_baseline


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(FIT_CELLS))
def test_the_cell_trains_in_this_kernel_as_its_fit_call_says(name):
    import keras

    cell, result = FIT_CELLS[name]
    keras.utils.set_random_seed(0)
    ns: dict = {}
    with contextlib.redirect_stdout(io.StringIO()) as out:
        run = nbdist.train(cell, namespace=ns, mode="local")
    assert run.status in ("finished", "stopped") and run.error is None
    assert result(ns) >= fit_baseline(name) - 0.03, (result(ns), fit_baseline(name))
    assert ns["model"].train_function is None and "━" not in out.getvalue()
