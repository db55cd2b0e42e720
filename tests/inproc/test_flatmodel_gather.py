"""A step that gathers its batch inside the compiled call trains on the same samples."""

import keras
import numpy as np

from nbdist.engine.data import ArraySource
from nbdist.engine.flat_layout import read_flat
from nbdist.engine.flatmodel import FlatModel


def _model():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(5, activation="relu"),
                              keras.layers.BatchNormalization(),
                              keras.layers.Dense(3, activation="softmax")])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy")
    return model


def test_gradients_at_indices_equal_gradients_of_the_host_gathered_batch():
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(50, 6)).astype(np.float32), rng.integers(0, 3, 50)
    source = ArraySource(x, y, num_samples=50, seed=3)
    index = source.indices(epoch=1, start=10, stop=26)
    np.testing.assert_array_equal(source.batch(1, 10, 26)[0], x[index])
    assert len(set(index.tolist())) == 16 and index.tolist() != list(range(10, 26))

    flat = FlatModel(_model())
    assert not flat.holds_data
    flat.hold(x, y)
    assert flat.holds_data
    params, nt = read_flat(flat.model)
    moved = params + np.float32(0.01)
    for with_assign in (False, True):  # the model's state is rewritten before each call
        flat.assign(params, nt)
        host = (flat.assign_and_gradients(moved, nt, x[index], y[index]) if with_assign
                else flat.gradients(x[index], y[index]))
        flat.assign(params, nt)
        graph = (flat.assign_and_gradients_at(moved, nt, index) if with_assign
                 else flat.gradients_at(index))
        np.testing.assert_allclose(graph[0], host[0], rtol=1e-6)
        np.testing.assert_allclose(graph[1], host[1], rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(graph[3], host[3], rtol=1e-5, atol=1e-7)  # BatchNorm statistics
        assert np.abs(host[1]).sum() > 0
    other = flat.gradients_at(index[:5])  # another batch size, another set of samples
    assert not np.allclose(other[1], graph[1])
