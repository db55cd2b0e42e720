"""A learning-rate schedule in the cell's optimizer, in --mode sync (each rank's own Keras optimizer);
checking and replacing a Keras schedule is tested in tests/inproc/test_learning_rate.py."""

import numpy as np
import pytest

import nbdist
from nbdist.errors import ConfigError
from tests.helpers import SYNTHETIC_CELL, global_step, wait_for

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


@pytest.mark.horovod
def test_sync_lr_flag_with_a_scheduled_optimizer_is_refused_before_any_engine(cluster):
    with pytest.raises(ConfigError, match="ExponentialDecay"):
        nbdist.train(SCHEDULE_CELL, cluster=cluster, namespace={}, mode="sync", workers=2, lr=0.01)


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
        result = run.worker_results[rank]
        assert result["steps"] == result["iterations"] == steps
        assert result["learning_rate"] == pytest.approx(float(schedule(steps)), rel=1e-5)
    assert float(schedule(steps)) < 0.5 * float(schedule(0))  # it did decay


@pytest.mark.horovod
def test_set_lr_during_a_scheduled_sync_run_replaces_the_schedule_and_says_so(cluster):
    pytest.importorskip("horovod.tensorflow", reason="Horovod is built by `make horovod`")
    run = nbdist.train(SCHEDULED_SYNTHETIC_CELL, cluster=cluster, namespace={}, mode="sync",
                       workers=2, epochs=100, batch_size=8)
    with run:
        wait_for(lambda: global_step(run) >= 5, 60)
        run.set_lr(0.0123)
        step = global_step(run)
        wait_for(lambda: global_step(run) >= step + 10, 60)
        run.stop()
        run.wait(timeout=60)
    assert any("CosineDecay" in w and "0.0123" in w for w in run.warnings)
    results = run.worker_results
    for rank in (0, 1):
        assert results[rank]["learning_rate"] == pytest.approx(0.0123)
    np.testing.assert_array_equal(results[0]["params"], results[1]["params"])
