"""A run per model (a sweep, a study) builds a FlatModel per model: TensorFlow's warning of
"excessive" retracing, which it counts by Python code, must not fill the notebook with
warnings about nbdist's own functions, and must still warn about the cell's."""

import logging

import keras
import numpy as np
import pytest

from nbdist.engine.flatmodel import FlatModel


@pytest.fixture
def tensorflow_warnings():
    import tensorflow as tf

    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    tf.get_logger().addHandler(handler)
    yield seen
    tf.get_logger().removeHandler(handler)


def test_a_flat_model_per_run_warns_of_no_retracing_and_the_cells_own_functions_still_do(
        tensorflow_warnings):
    import tensorflow as tf

    x, y = np.zeros((2, 4), np.float32), np.zeros((2, 3), np.float32)
    for _ in range(8):  # TensorFlow warns from the fifth trace of one code on
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
        model.compile("sgd", "mse")
        flat = FlatModel(model)
        params = np.zeros(flat.size, np.float32)
        flat.assign_and_gradients(params, np.zeros(flat.nt_size, np.float32), x, y)
        flat.assign(params, np.zeros(flat.nt_size, np.float32))
    assert not [m for m in tensorflow_warnings if "retracing" in m], tensorflow_warnings
    for _ in range(8):  # a cell's own function made in a loop: TensorFlow's warning stands
        tf.function(lambda t: t + 1)(tf.constant(1.0))
    assert [m for m in tensorflow_warnings if "triggered tf.function retracing" in m]
