"""--sync-batchnorm: BatchNorm statistics over the global batch, on real Horovod ranks (the
flag's parsing and checks are in tests/unit/test_config.py and tests/inproc/test_magic_flags.py)."""

import numpy as np
import pytest

import nbdist

# One BatchNorm on the inputs and one inside a nested sub-model of a functional model. 100
# samples at 2 x 64: one step, with uneven batches (64 and 36), as --dbs would give.
BN_CELL = '''
import keras, numpy as np
keras.utils.set_random_seed(7)
rng = np.random.default_rng(3)
x_train = (rng.normal(size=(100, 6)) * [1, 2, 3, 1, 1, 1] + [3, -2, 0.5, 5, 0, 1]).astype("float32")
y_train = (x_train[:, 0] + x_train[:, 3] > 8).astype("int64") + (x_train[:, 1] > -2)
inner = keras.Sequential([keras.layers.Dense(8, activation="relu"),
                          keras.layers.BatchNormalization()])
inputs = keras.Input((6,))
outputs = keras.layers.Dense(3, activation="softmax")(
    inner(keras.layers.BatchNormalization()(inputs)))
model = keras.Model(inputs, outputs)
model.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy")
'''


def one_step_on_the_global_batch(cell):
    """What one training step of a single model on all 100 samples gives."""
    import tensorflow as tf

    from nbdist.engine.flat_layout import read_flat

    ns = {}
    exec(cell, ns)  # noqa: S102 - the test's own cell; seeded, so the same initial weights
    model, x, y = ns["model"], ns["x_train"], ns["y_train"]
    with tf.GradientTape() as tape:
        loss = model.compute_loss(x=x, y=y, y_pred=model(x, training=True), training=True)
    grads = tape.gradient(loss, model.trainable_variables)
    model.optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
    return read_flat(model)


@pytest.mark.horovod
def test_sync_batchnorm_statistics_and_step_equal_one_model_on_the_global_batch(cluster):
    pytest.importorskip("horovod.tensorflow", reason="Horovod is built by `make horovod`")
    params, moving = one_step_on_the_global_batch(BN_CELL)
    run = nbdist.train(BN_CELL, cluster=cluster, namespace={}, mode="sync", workers=2, epochs=1,
                       model="model", batch_size=64, sync_batchnorm=True, wait=True)
    results = run.worker_results
    assert results[0]["steps"] == results[1]["steps"] == 1
    for rank in (0, 1):  # each rank's own moving statistics, before the final averaging
        np.testing.assert_allclose(results[rank]["own_non_trainable"], moving, atol=1e-5)
    np.testing.assert_allclose(results[0]["own_non_trainable"], results[1]["own_non_trainable"],
                               atol=1e-6)
    # the gradient through the allreduced statistics, weighted 64:36, is the global batch's
    np.testing.assert_allclose(results[0]["params"], params, atol=1e-5)

    # without it each rank normalises over its own samples: the statistics differ
    run = nbdist.train(BN_CELL, cluster=cluster, namespace={}, mode="sync", workers=2, epochs=1,
                       model="model", batch_size=64, sync_batchnorm=False, wait=True)
    own = [run.worker_results[r]["own_non_trainable"] for r in (0, 1)]
    assert np.abs(own[0] - own[1]).max() > 1e-3


NESTED_CELL = '''
import keras
from nbdist.datasets import make_synthetic
(x_train, y_train), (x_test, y_test) = make_synthetic(n=1200, shape=(8,), classes=3, seed=1)
block = keras.Sequential([keras.layers.Dense(16), keras.layers.BatchNormalization(),
                          keras.layers.Activation("relu")], name="block")
inputs = keras.Input((8,))
model = keras.Model(inputs, keras.layers.Dense(3, activation="softmax")(block(inputs)))
model.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy",
              metrics=["accuracy"])
'''


@pytest.mark.horovod
def test_sync_batchnorm_in_a_nested_sub_model_trains_with_identical_ranks(cluster):
    pytest.importorskip("horovod.tensorflow", reason="Horovod is built by `make horovod`")
    run = nbdist.train(NESTED_CELL, cluster=cluster, namespace={}, mode="sync", workers=2,
                       model="model", epochs=2, batch_size=32, sync_batchnorm=True, wait=True)
    results = run.worker_results
    np.testing.assert_allclose(results[0]["own_non_trainable"], results[1]["own_non_trainable"],
                               atol=1e-6)
    np.testing.assert_array_equal(results[0]["params"], results[1]["params"])
    assert run.history["val_accuracy"].dropna().iloc[-1] > 0.9
    # the notebook's model gets statistics recomputed at the final weights, as in async
    assert any(w.startswith("--precise-bn: the moving statistics of the model's 1 "
                            "BatchNormalization layer") for w in run.warnings), run.warnings
