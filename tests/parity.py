"""Training a cell with plain Keras and with nbdist on the same seed, for the parity tests
(tests/cluster/test_parity_cells.py) and benchmarks/parity_matrix.py alike."""

from __future__ import annotations

import contextlib
import io

BAR = 0.03  # every run lands at least fit − BAR on the same seed (above fit is fine)


def accuracy(cell: str, seed: int, cluster=None, namespace: dict | None = None, **options):
    """(the cell's `score[1]` after its fit call, the Run or None): plain Keras without
    `options`, else `nbdist.train(cell, seed=seed, **options)`, in `namespace` if given (so
    the caller can look at the model). Raises if the run failed."""
    import keras

    import nbdist

    keras.utils.set_random_seed(seed)
    ns: dict = {} if namespace is None else namespace
    with contextlib.redirect_stdout(io.StringIO()):
        if not options:
            exec(cell, ns)  # noqa: S102 - the test's own cell
            return float(ns["score"][1]), None
        run = nbdist.train(cell, namespace=ns, cluster=cluster, seed=seed, **options)
    if run.error is not None:
        raise AssertionError(f"the run with {options} failed: {run.error}")
    return float(ns["score"][1]), run


def gap_against_fit(cell: str, seed: int, cluster=None, **options):
    """(nbdist's accuracy − fit's on the same seed, the Run)."""
    fit, _ = accuracy(cell, seed)
    got, run = accuracy(cell, seed, cluster, **options)
    return got - fit, run
