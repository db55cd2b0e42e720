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


@pytest.mark.parametrize(("optimizer", "options", "rule", "said"), [
    # the default without a fit call: dc-asgd-a, said at the start
    ("keras.optimizers.SGD(0.5)", {"workers": 2}, "dc-asgd-a",
     "So the hub applies --algorithm dc-asgd-a"),
    ("keras.optimizers.SGD(0.5)", {"workers": 1}, "asgd", None),  # no push lands late
    # the rule the user named is kept, and the gap measured with it said
    ("keras.optimizers.SGD(0.5)", {"workers": 2, "algorithm": "asgd"}, "asgd", "To track fit"),
    ("keras.optimizers.SGD(0.5)", {"workers": 2, "algorithm": "dc-asgd"}, "dc-asgd", None),
    # options asked of asgd keep asgd
    ("keras.optimizers.SGD(0.5)", {"workers": 2, "predict_weights": True}, "asgd",
     "To track fit"),
    ("keras.optimizers.SGD(0.5, momentum=0.9)", {"workers": 2}, "asgd", None),  # compensated
    ("keras.optimizers.Adam()", {"workers": 2}, "asgd", None),
])
def test_a_recurrent_net_under_async_plain_sgd_gets_delay_compensation_by_default(
        optimizer, options, rule, said):
    cell = RECURRENT_CELL.replace("keras.optimizers.SGD(0.5)", optimizer)
    run = nbdist.train(cell, namespace={}, mode="simulate", epochs=1, batch_size=32, wait=True,
                       **options)
    assert run.status == "finished", run.error
    assert run.config.algorithm == rule
    told = [w for w in run.warnings if w.startswith(
        "The model has a recurrent layer (GRU) trained with plain SGD by 2 async workers")]
    assert len(told) == (said is not None)
    assert said is None or said in told[0]
    notes = run.events.query("event == 'note'")
    assert said is None or notes["text"].str.contains(said, regex=False).any()


def test_a_net_without_recurrent_layers_keeps_asgd_by_default():
    run = nbdist.train(SYNTHETIC_CELL, namespace={}, mode="simulate", workers=2, epochs=1,
                       wait=True)
    assert run.status == "finished", run.error
    assert run.config.algorithm == "asgd"


def test_a_recurrent_cell_with_its_fit_call_has_its_workers_share_the_call_s_batch():
    """With the cell's fit call, the pick is the mean over the call's batch per update, as
    --mode sync makes it: the workers share the batch and the hub averages their pushes."""
    cell = RECURRENT_CELL + "model.fit(x_train, y_train, batch_size=32, epochs=1)\n"
    run = nbdist.train(cell, namespace={}, mode="simulate", workers=2, wait=True)
    assert run.status == "finished", run.error
    assert (run.config.algorithm, run.config.n, run.config.batch_size) == ("softsync", 1, 16)
    assert any("So the hub averages the 2 workers' pushes into one update (--algorithm "
               "softsync --n 1), each worker computing 16 samples of model.fit(batch_size=32)"
               in w for w in run.warnings)
    # --batch-size on the magic line: the workers' own batch, so the curvature correction
    given = nbdist.train(cell, namespace={}, mode="simulate", workers=2, batch_size=16,
                         wait=True)
    assert given.status == "finished", given.error
    assert given.config.algorithm == "dc-asgd-a"
