"""What a run says at its start when it trains unlike the cell: momentum compensation where it
runs by default (momentum SGD at a large effective step) and not elsewhere, and what four or
more async workers cost at equal epochs, and that the weights handed back average the run's
tail. Simulated runs of a small synthetic cell."""

import pytest

import nbdist
from tests.helpers import SYNTHETIC_CELL


def warnings_of(optimizer: str, **options) -> list[str]:
    cell = SYNTHETIC_CELL.replace("keras.optimizers.SGD(0.1)", optimizer)
    run = nbdist.train(cell, namespace={}, mode="simulate", epochs=1, wait=True, **options)
    assert run.status == "finished", run.error
    return [w for w in run.warnings]


@pytest.mark.parametrize(("optimizer", "corrected"), [
    ("keras.optimizers.SGD(0.1, momentum=0.9)", True),  # effective step 1.0
    ("keras.optimizers.SGD(0.01, momentum=0.9)", False),  # 0.1: it would cost accuracy
    ("keras.optimizers.Adam()", False),
    ("keras.optimizers.SGD(0.1)", False),
])
def test_momentum_compensation_runs_by_default_where_it_was_measured_to_help(optimizer,
                                                                             corrected):
    said = warnings_of(optimizer, workers=2)
    assert any(w.startswith("--momentum-correction: the cell's SGD momentum=0.9 runs as 0.4")
               for w in said) is corrected
    assert not any(w.startswith("--momentum-correction") for w in warnings_of(optimizer,
                                                                               workers=1))
    asked = warnings_of(optimizer, workers=2, momentum_correction=True)
    assert any(w.startswith("--momentum-correction") for w in asked) is ("momentum" in optimizer
                                                                        or "Adam" in optimizer)


def test_momentum_compensation_runs_by_default_at_a_smaller_step_with_more_workers():
    said = warnings_of("keras.optimizers.SGD(0.1, momentum=0.5)", workers=4)
    assert any(w.startswith("--momentum-correction: the cell's SGD momentum=0.5") for w in said)
    assert not any(w.startswith("--momentum-correction") for w in warnings_of(
        "keras.optimizers.SGD(0.1, momentum=0.5)", workers=2))


@pytest.mark.parametrize(("workers", "warned"), [(2, False), (3, False), (4, True)])
def test_four_async_workers_are_told_what_staleness_costs(workers, warned):
    said = warnings_of("keras.optimizers.SGD(0.1)", workers=workers)
    assert any(w.startswith(f"{workers} async workers: each push lands about {workers - 1}")
               for w in said) is warned
    synced = warnings_of("keras.optimizers.SGD(0.1)", workers=workers, algorithm="softsync")
    assert not any("async workers:" in w for w in synced)


@pytest.mark.slow
def test_the_weights_handed_back_average_the_tail_by_default_and_say_so():
    said = warnings_of("keras.optimizers.SGD(0.1)", workers=2)
    assert any(w.startswith("--average-tail 0.1: the weights handed back are the mean over the "
                            "run's last 10% of samples, not the last update's") for w in said)
    assert not any("--average-tail" in w for w in warnings_of("keras.optimizers.SGD(0.1)",
                                                               workers=2, average_tail=0))
    # a rule that averages pushes already hands back its last update
    assert not any("--average-tail" in w for w in warnings_of("keras.optimizers.SGD(0.1)",
                                                               workers=2, algorithm="softsync"))
    # one worker: fit's own sequence of updates, handed back as fit does, unless asked
    assert not any("--average-tail" in w for w in warnings_of("keras.optimizers.SGD(0.1)",
                                                               workers=1))
    assert any(w.startswith("--average-tail 0.2:") for w in warnings_of(
        "keras.optimizers.SGD(0.1)", workers=1, average_tail=0.2))


RECURRENT_CELL = '''
import numpy as np
import keras
x_train = np.random.default_rng(0).integers(0, 10, size=(256, 6))
y_train = (x_train == 3).any(axis=1).astype("int32")
model = keras.Sequential([keras.Input((6,), dtype="int32"), keras.layers.Embedding(10, 4),
                          keras.layers.Bidirectional(keras.layers.GRU(4)),
                          keras.layers.Dense(2, activation="softmax")])
model.compile(optimizer=keras.optimizers.SGD(0.5), loss="sparse_categorical_crossentropy")
'''


@pytest.mark.parametrize(("optimizer", "options", "warned"), [
    ("keras.optimizers.SGD(0.5)", {"workers": 2}, True),
    ("keras.optimizers.SGD(0.5)", {"workers": 1}, False),  # no push lands late
    ("keras.optimizers.SGD(0.5)", {"workers": 2, "algorithm": "dc-asgd-a"}, False),  # the pick
    ("keras.optimizers.SGD(0.5, momentum=0.9)", {"workers": 2}, False),  # compensated
    ("keras.optimizers.Adam()", {"workers": 2}, False),
])
def test_a_recurrent_net_under_async_plain_sgd_is_told_the_measured_gap(optimizer, options,
                                                                        warned):
    cell = RECURRENT_CELL.replace("keras.optimizers.SGD(0.5)", optimizer)
    run = nbdist.train(cell, namespace={}, mode="simulate", epochs=1, batch_size=32, wait=True,
                       **options)
    assert run.status == "finished", run.error
    assert any(w.startswith("The model has a recurrent layer (GRU) trained with plain SGD by 2 "
                            "async workers") for w in run.warnings) is warned
