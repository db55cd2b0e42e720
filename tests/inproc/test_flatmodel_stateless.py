"""The stateless gradient path (no variable written) gives what the assigning path gives, on
every kind of model a cell may compile: the worker's step must train as model.fit does."""

import keras
import numpy as np
import pytest

from nbdist.engine.flat_layout import read_flat
from nbdist.engine.flatmodel import FlatModel


class SubclassedNet(keras.Model):
    def __init__(self):
        super().__init__()
        self.hidden = keras.layers.Dense(7, activation="tanh",
                                         kernel_regularizer=keras.regularizers.l2(0.01))
        self.norm = keras.layers.BatchNormalization()
        self.drop = keras.layers.Dropout(0.4)
        self.out = keras.layers.Dense(3)

    def call(self, x, training=False):
        h = self.norm(self.hidden(x), training=training)
        self.add_loss(0.001 * keras.ops.sum(keras.ops.square(h)))  # a forward-pass loss
        return self.out(self.drop(h, training=training))


def _sequential():
    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"),
                             keras.layers.Dense(3)])


def _functional():
    inputs = keras.Input((6,))
    a = keras.layers.Dense(8, activation="relu", kernel_regularizer="l2",
                           activity_regularizer=keras.regularizers.l1(0.01))(inputs)
    b = keras.layers.BatchNormalization()(keras.layers.Dense(8)(inputs))
    merged = keras.layers.Dropout(0.3)(keras.layers.Concatenate()([a, b]))
    return keras.Model(inputs, keras.layers.Dense(3)(merged))


def _cnn():
    return keras.Sequential([keras.Input((6,)), keras.layers.Reshape((6, 1)),
                             keras.layers.Conv1D(4, 3, activation="relu"),
                             keras.layers.BatchNormalization(), keras.layers.Dropout(0.2),
                             keras.layers.Flatten(), keras.layers.Dense(3)])


def _augmented():
    """Keras's augmentation layers keep their random state in integer variables (SeedGenerator)."""
    return keras.Sequential([keras.Input((6,)), keras.layers.Reshape((2, 3, 1)),
                             keras.layers.RandomFlip("horizontal"),
                             keras.layers.RandomTranslation(0.3, 0.3),
                             keras.layers.Conv2D(4, 2, activation="relu"), keras.layers.Flatten(),
                             keras.layers.Dense(3)])


MODELS = {"sequential": _sequential, "functional": _functional, "subclassed": SubclassedNet,
          "cnn": _cnn, "augmented": _augmented}


def _flat(build):
    keras.utils.set_random_seed(0)
    model = build()
    model.compile(optimizer=keras.optimizers.SGD(0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model(np.zeros((1, 6), np.float32), training=False)
    return FlatModel(model)


def _seeds(model) -> list:
    return [v for v in model.non_trainable_variables if "float" not in str(v.dtype)]


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_stateless_gradients_equal_the_assigning_path(kind):
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(40, 6)).astype(np.float32), rng.integers(0, 3, 40)
    flat = _flat(MODELS[kind])
    assert flat.stateless
    flat.hold(x, y)
    params, nt = read_flat(flat.model)
    moved, nt_in = params + np.float32(0.02), nt + np.float32(0.1)  # not what the variables hold
    index = np.arange(5, 37, dtype=np.int64)
    seeds = _seeds(flat.model)
    for call in (lambda: flat.assign_and_gradients(moved, nt_in, x[index], y[index]),
                 lambda: flat.assign_and_gradients_at(moved, nt_in, index)):
        start = [v.numpy() for v in seeds]
        flat.stateless = False
        expected = call()
        seeds_after = [v.numpy() for v in seeds]
        for v, s in zip(seeds, start, strict=True):
            v.assign(s)
        flat.stateless = True
        got = call()
        assert flat.stateless and flat.stateless_error is None
        np.testing.assert_allclose(got[0], expected[0], rtol=1e-6)
        np.testing.assert_allclose(got[1], expected[1], rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(got[2], expected[2], rtol=1e-6)
        # BatchNorm statistics
        np.testing.assert_allclose(got[3], expected[3], rtol=1e-6, atol=1e-6)
        assert got[1].shape == (flat.size,) and np.abs(got[1]).sum() > 0
        for s, after in zip([v.numpy() for v in seeds], seeds_after, strict=True):
            np.testing.assert_array_equal(s, after)  # dropout seeds moved on the same way
    if seeds:  # the next step draws other dropout masks
        again = flat.assign_and_gradients_at(moved, nt_in, index)
        assert not np.allclose(again[1], got[1])
    if nt.size:  # BatchNorm's moving statistics came back changed
        assert not np.allclose(got[3], nt_in)


def test_the_stateless_path_leaves_the_variables_alone():
    flat = _flat(_functional)
    params, nt = read_flat(flat.model)
    x, y = np.ones((4, 6), np.float32), np.array([0, 1, 2, 0])
    flat.assign_and_gradients(params + np.float32(1.0), nt + np.float32(1.0), x, y)
    now = read_flat(flat.model)
    np.testing.assert_array_equal(now[0], params)
    np.testing.assert_array_equal(now[1], nt)


class NoStatelessNet(keras.Sequential):
    """A model whose stateless_call cannot trace (as some custom layers' cannot)."""

    def stateless_call(self, *args, **kwargs):
        raise NotImplementedError("no stateless_call here")


def test_a_model_that_cannot_run_stateless_falls_back_to_assigning():
    flat = _flat(lambda: NoStatelessNet(_sequential().layers))
    params, nt = read_flat(flat.model)
    x, y = np.ones((4, 6), np.float32), np.array([0, 1, 2, 0])
    expected = flat.gradients(x, y)
    got = flat.assign_and_gradients(params, nt, x, y)
    assert not flat.stateless and isinstance(flat.stateless_error, NotImplementedError)
    np.testing.assert_allclose(got[1], expected[1], rtol=1e-6)
    np.testing.assert_array_equal(read_flat(flat.model)[0], params)  # written by the fallback
