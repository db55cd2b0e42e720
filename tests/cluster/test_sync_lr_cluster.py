"""A learning-rate schedule in the cell's optimizer, in --mode sync (each rank's own Keras optimizer)."""

import time

import numpy as np
import pytest

import nbdist
from nbdist.errors import ConfigError
from tests.conftest import SYNTHETIC_CELL

SCHEDULE_CELL = '''
import keras
from nbdist.datasets import load_fashion_mnist
keras.utils.set_random_seed(0)
(x_train, y_train), (x_test, y_test) = load_fashion_mnist()
x_train, y_train = x_train[:6000].reshape(-1, 784).astype("float32") / 255.0, y_train[:6000]
x_test, y_test = x_test[:2000].reshape(-1, 784).astype("float32") / 255.0, y_test[:2000]
schedule = keras.optimizers.schedules.ExponentialDecay(2e-3, decay_steps=20, decay_rate=0.8)
model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(128, activation="relu"),
                          keras.layers.Dense(10, activation="softmax")])
model.compile(optimizer=keras.optimizers.Adam(schedule), loss="sparse_categorical_crossentropy",
              metrics=["accuracy"])
'''

def evaluate_accuracy(ns: dict) -> float:
    return ns["model"].evaluate(ns["x_test"], ns["y_test"], batch_size=1000, verbose=0,
                                return_dict=True)["accuracy"]


SCHEDULED_SYNTHETIC_CELL = SYNTHETIC_CELL.replace(
    "keras.optimizers.SGD(0.1)",
    "keras.optimizers.SGD(keras.optimizers.schedules.CosineDecay(0.1, decay_steps=10_000))")


def test_lr_with_a_schedule_is_refused_naming_both():
    import keras

    from nbdist.engine.learning_rate import check_lr

    optimizer = keras.optimizers.Adam(keras.optimizers.schedules.ExponentialDecay(1e-3, 10, 0.9))
    with pytest.raises(ConfigError, match=r"--lr 0.01 replaces a constant .*Adam.*ExponentialDecay. "
                                          r"Drop --lr, or change the schedule in the cell"):
        check_lr(0.01, optimizer)
    check_lr(None, optimizer)  # no --lr: the schedule runs
    check_lr(0.01, keras.optimizers.Adam(1e-3))  # a constant rate: --lr replaces it


def test_set_constant_lr_replaces_a_schedule_once_and_assigns_a_constant():
    import keras

    from nbdist.engine.learning_rate import schedule_name, set_constant_lr

    optimizer = keras.optimizers.Adam(keras.optimizers.schedules.CosineDecay(1e-3, 100))
    assert set_constant_lr(optimizer, 5e-4) == "CosineDecay"
    assert schedule_name(optimizer) is None
    assert float(optimizer.learning_rate.numpy()) == pytest.approx(5e-4)
    assert set_constant_lr(optimizer, 2e-4) is None
    assert float(optimizer.learning_rate.numpy()) == pytest.approx(2e-4)


@pytest.mark.cluster
@pytest.mark.horovod
def test_sync_lr_flag_with_a_scheduled_optimizer_is_refused_before_any_engine(cluster):
    with pytest.raises(ConfigError, match="ExponentialDecay"):
        nbdist.train(SCHEDULE_CELL, cluster=cluster, namespace={}, mode="sync", workers=2, lr=0.01)


@pytest.mark.cluster
@pytest.mark.horovod
@pytest.mark.slow
def test_sync_adam_with_exponential_decay_matches_fit_and_follows_the_schedule(cluster):
    pytest.importorskip("horovod.tensorflow", reason="Horovod is built by `make horovod`")
    fit_ns = {}
    exec(SCHEDULE_CELL, fit_ns)  # noqa: S102 - the test's own cell
    fit_ns["model"].fit(fit_ns["x_train"], fit_ns["y_train"], batch_size=128, epochs=2, verbose=0)
    ns = {}
    run = nbdist.train(SCHEDULE_CELL, cluster=cluster, namespace=ns, mode="sync", workers=2,
                       epochs=2, batch_size=64, no_validation=True, wait=True)
    assert abs(evaluate_accuracy(ns) - evaluate_accuracy(fit_ns)) <= 0.03
    steps = 2 * 47  # ceil(6000 / 128) per epoch
    schedule = ns["schedule"]
    for rank in (0, 1):
        result = run._backend.results[rank]
        assert result["steps"] == result["iterations"] == steps
        assert result["learning_rate"] == pytest.approx(float(schedule(steps)), rel=1e-5)
    assert float(schedule(steps)) < 0.5 * float(schedule(0))  # it did decay


@pytest.mark.cluster
@pytest.mark.horovod
def test_set_lr_during_a_scheduled_sync_run_replaces_the_schedule_and_says_so(cluster):
    pytest.importorskip("horovod.tensorflow", reason="Horovod is built by `make horovod`")
    run = nbdist.train(SCHEDULED_SYNTHETIC_CELL, cluster=cluster, namespace={}, mode="sync",
                       workers=2, epochs=100, batch_size=8)
    with run:
        deadline = time.monotonic() + 60
        while run._snapshot.get("global_step", 0) < 5:
            assert time.monotonic() < deadline, "the run made no progress"
            time.sleep(0.05)
        run.set_lr(0.0123)
        step = run._snapshot.get("global_step", 0)
        while run._snapshot.get("global_step", 0) < step + 10:
            assert time.monotonic() < deadline, "the run made no progress"
            time.sleep(0.05)
        run.stop()
        run.wait(timeout=60)
    assert any("CosineDecay" in w and "0.0123" in w for w in run.warnings)
    results = run._backend.results
    for rank in (0, 1):
        assert results[rank]["learning_rate"] == pytest.approx(0.0123)
    np.testing.assert_array_equal(results[0]["params"], results[1]["params"])
