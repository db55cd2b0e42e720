"""--precise-bn: the kernel recomputes each BatchNormalization layer's moving statistics at the
weights a run hands the notebook, as the mean of its batch statistics over training samples;
which runs do it, and what they say. The effect on accuracy: tests/cluster/test_parity_cells.py
and benchmarks/parity_matrix.py."""

import numpy as np
import pytest

import nbdist
from nbdist.engine.batchnorm import batchnorm_layers, recompute_batchnorm

CELL = """
import numpy as np
import keras
from keras import layers
rng = np.random.default_rng(0)
x_train = rng.normal(3.0, 2.0, size=(512, 6)).astype("float32")
y_train = (x_train.sum(axis=1) > 18).astype("int32")
model = keras.Sequential([keras.Input((6,)), layers.Dense(8), layers.BatchNormalization(),
                          layers.ReLU(), layers.Dense(2, activation="softmax")])
model.compile(optimizer=keras.optimizers.SGD(0.05), loss="sparse_categorical_crossentropy",
              metrics=["accuracy"])
"""


def model_and_data():
    ns: dict = {}
    exec(CELL, ns)  # noqa: S102 - the test's own cell
    return ns["model"], ns["x_train"]


def test_the_moving_statistics_become_the_mean_of_the_batch_statistics():
    import keras

    model, x = model_and_data()
    bn = batchnorm_layers(model)[0]
    assert bn.momentum == 0.99
    rows = recompute_batchnorm(model, x, batch_size=100, samples=300)
    assert rows == 300
    features = keras.Model(model.inputs, bn.input).predict(x[:300], verbose=0)
    batches = [features[i:i + 100] for i in range(0, 300, 100)]
    np.testing.assert_allclose(bn.moving_mean.numpy(),
                               np.mean([b.mean(axis=0) for b in batches], axis=0), rtol=1e-4,
                               atol=1e-5)
    np.testing.assert_allclose(bn.moving_variance.numpy(),
                               np.mean([b.var(axis=0) for b in batches], axis=0), rtol=1e-4,
                               atol=1e-5)
    assert bn.momentum == 0.99  # the layer's own momentum is back


def test_nested_models_are_searched_and_a_model_without_batchnorm_is_left_alone():
    import keras
    from keras import layers

    inner = keras.Sequential([keras.Input((4,)), layers.BatchNormalization()])
    outer = keras.Sequential([keras.Input((4,)), inner, layers.Dense(1)])
    assert batchnorm_layers(outer) == [inner.layers[0]]
    plain = keras.Sequential([keras.Input((4,)), layers.Dense(1)])
    assert recompute_batchnorm(plain, np.zeros((8, 4), np.float32), 4) == 0


@pytest.mark.parametrize(("options", "recomputed"), [
    ({}, True),
    ({"precise_bn": False}, False),
])
def test_a_local_run_hands_back_recomputed_statistics_and_says_so(options, recomputed):
    ns: dict = {}
    run = nbdist.train(CELL, namespace=ns, mode="local", epochs=1, batch_size=32, wait=True,
                       **options)
    assert run.status == "finished", run.error
    said = [w for w in run.warnings if w.startswith("--precise-bn")]
    assert bool(said) is recomputed
    bn = batchnorm_layers(ns["model"])[0]
    hub_mean = run.state.final_weights[1][:8]  # the hub's moving mean: the first float state
    if recomputed:
        copy, x = model_and_data()
        copy.set_weights(ns["model"].get_weights())
        recompute_batchnorm(copy, x, 32)
        np.testing.assert_allclose(bn.moving_mean.numpy(),
                                   batchnorm_layers(copy)[0].moving_mean.numpy(), atol=1e-5)
        assert np.abs(bn.moving_mean.numpy() - hub_mean).max() > 1e-3
    else:
        np.testing.assert_allclose(bn.moving_mean.numpy(), hub_mean, atol=1e-6)
