"""Kernel-side checks of a %%distribute cell: each bad input gets a clear error, no cluster
needed."""

import pytest

from nbdist.config import TrainConfig
from nbdist.engine.cell import assigned_names, inspect_cell
from nbdist.errors import (
    AmbiguousModelError,
    CellError,
    DataError,
    ModelNotCompiledError,
    ModelNotFoundError,
)

MODEL = '''
import keras, numpy as np
x_train, y_train = np.zeros((6, 4), "float32"), np.zeros(6, "int32")
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
'''


def run(cell, ns=None, **options):
    ns = {} if ns is None else ns
    exec(cell, ns)  # noqa: S102 - the test's own cell, as the kernel runs it
    return inspect_cell(cell, ns, TrainConfig(**options))


def test_assigned_names_ignore_function_bodies_and_comprehensions():
    names = assigned_names("import numpy as np\nfor i in range(3): a = i\n"
                           "def f():\n    hidden = 1\n[z for z in range(2)]\n"
                           "with open('f') as fh: pass")
    assert names == {"np", "i", "a", "f", "fh"}


def test_syntax_error_is_a_cell_error():
    with pytest.raises(CellError, match="not valid Python"):
        assigned_names("x = (")


def test_finds_the_one_compiled_model():
    contents = run(MODEL)
    assert contents.model_name == "model" and contents.num_samples == 6
    assert contents.validation is None and contents.pushed == {}


def test_no_model_says_how_to_define_one():
    with pytest.raises(ModelNotFoundError, match="defines no keras.Model"):
        run("import numpy as np\nx_train = np.zeros(3)")


def test_two_models_need_model_flag():
    with pytest.raises(AmbiguousModelError, match="model, model2.*--model model"):
        run(MODEL + "model2 = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])\n"
                    "model2.compile(optimizer='sgd', loss='mse')")
    assert run(MODEL + "model2 = model", model="model2").model_name == "model2"


def test_uncompiled_model_says_to_compile():
    with pytest.raises(ModelNotCompiledError, match="not compiled.*compile"):
        run(MODEL.replace("model.compile(", "(lambda **kw: None)("))


def test_missing_data_names_are_listed():
    with pytest.raises(DataError, match="--data names xa, ya"):
        run(MODEL, data="xa,ya")


def test_mismatched_lengths_are_reported():
    with pytest.raises(DataError, match="x_train has 6 samples but y_train has 5"):
        run(MODEL + "y_train = y_train[:5]")


def test_explicit_validation_must_exist():
    with pytest.raises(DataError, match="--validation names xv"):
        run(MODEL, validation="xv,yv")


def test_default_validation_is_used_when_present():
    contents = run(MODEL + "x_test, y_test = x_train[:2], y_train[:2]")
    assert contents.validation == ("x_test", "y_test")
    assert run(MODEL + "x_test, y_test = x_train, y_train", no_validation=True).validation is None


def test_arrays_from_earlier_cells_are_pushed_to_engines():
    import numpy as np

    ns = {"x_train": np.ones((6, 4), "float32"), "y_train": np.zeros(6, "int32")}
    cell = MODEL.replace('x_train, y_train = np.zeros((6, 4), "float32"), np.zeros(6, "int32")\n',
                         "")
    contents = run(cell, ns)
    assert set(contents.pushed) == {"x_train", "y_train"}


def test_non_array_data_gets_a_conversion_hint():
    with pytest.raises(DataError, match="expected a NumPy array"):
        run(MODEL + "x_train = 5")


def test_parameters_and_helpers_from_earlier_cells_are_pushed_but_modules_are_not():
    import numpy

    ns = {"WIDTH": 2, "np": numpy, "helper": lambda: 1, "_private": 3}
    cell = (MODEL.replace("import keras, numpy as np\n", "import keras\n")
            .replace("Dense(2)", "Dense(WIDTH)"))
    contents = run(cell + "\n_ = helper() + _private", ns)
    assert set(contents.pushed) == {"WIDTH", "helper"}


BASE = '''
import keras, numpy as np
x_train, y_train = np.zeros((6, 4), "float32"), np.zeros(6, "int32")
base = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
base.trainable = False
'''


def test_a_base_model_inside_the_model_is_not_ambiguous_and_the_choice_is_noted():
    contents = run(BASE + "model = keras.Sequential([base, keras.layers.Dense(2)])\n"
                          "model.compile(optimizer='sgd', loss='sparse_categorical_crossentropy')")
    assert contents.model_name == "model"
    assert contents.notes == ["Training `model` (it contains `base`); pass --model to choose "
                              "another."]


def test_a_model_nested_two_levels_deep_in_a_functional_model_is_found():
    contents = run(BASE + "mid = keras.Sequential([base, keras.layers.Dense(3)])\n"
                          "inputs = keras.Input((4,))\n"
                          "outer = keras.Model(inputs, keras.layers.Dense(2)(mid(inputs)))\n"
                          "outer.compile(optimizer='sgd', loss='sparse_categorical_crossentropy')")
    assert contents.model_name == "outer"
    assert contents.notes == ["Training `outer` (it contains `base`, `mid`); pass --model to "
                              "choose another."]


def test_two_unrelated_models_beside_a_base_are_refused_naming_the_outer_ones():
    with pytest.raises(AmbiguousModelError,
                       match="base, head, model, and none contains head, model.*--model head"):
        run(BASE + "model = keras.Sequential([base, keras.layers.Dense(2)])\n"
                   "head = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])")


SUBCLASSED = '''
import keras, numpy as np
x_train, y_train = np.zeros((6, 10), "float32"), np.zeros(6, "int32")
class Net(keras.Model):
    def __init__(self):
        super().__init__()
        self.hidden, self.out = keras.layers.Dense(32, activation="relu"), keras.layers.Dense(3)
    def call(self, x):
        return self.out(self.hidden(x))
model = Net()
model.build((None, 10))
model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
'''


def test_subclassed_model_gets_its_variables_from_ensure_built_as_on_every_engine():
    import warnings

    from nbdist.engine.flat_layout import ensure_built, layout

    ns = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # Keras: build() on a layer without build()
        exec(SUBCLASSED, ns)  # noqa: S102 - the test's own cell
        assert layout(ns["model"])["trainable"] == []  # what an engine saw before
        ensure_built(ns["model"], ns["x_train"][:2])
        kernel = run(SUBCLASSED).model
    assert layout(ns["model"]) == layout(kernel)
    assert layout(kernel)["trainable"] == [[10, 32], [32], [32, 3], [3]]


DATASET = MODEL + '''
import tensorflow as tf
train_ds = tf.data.Dataset.from_tensor_slices((x_train, y_train)).batch(4)
'''


def test_a_dataset_is_read_into_arrays_when_it_fits():
    contents = run(DATASET, data="train_ds", validation="train_ds")
    assert contents.data == ("train_ds",) and contents.num_samples == 6 and not contents.streamed
    assert contents.arrays[0].shape == (6, 4) and contents.validation_arrays[1].shape == (6,)
    assert contents.notes == []


def test_a_dataset_beyond_the_limit_streams_and_says_what_changes():
    contents = run(DATASET, data="train_ds", in_memory_limit="64B")
    assert contents.streamed and contents.arrays is None and contents.num_samples == 6
    assert "train_ds holds more than --in-memory-limit 64B" in contents.warnings[0]
    assert "faster worker goes through its own shard more often" in contents.warnings[0]
    with pytest.raises(DataError, match="--validation train_ds holds more than.*take"):
        run(DATASET, data="train_ds", validation="train_ds", in_memory_limit="64B")


def test_a_dataset_that_does_not_fit_the_model_is_reported_with_its_shapes():
    with pytest.raises(DataError,
                       match=r"train_ds's inputs \(shape \(6, 4\).*do not fit the model"):
        run(DATASET.replace("(x_train, y_train)", "(x_train, y_train[:, None] * np.ones((1, 7)))"),
            data="train_ds")


def test_a_dataset_from_another_cell_cannot_reach_the_engines():
    import numpy as np
    import tensorflow as tf

    ns = {"train_ds": tf.data.Dataset.from_tensor_slices((np.zeros((6, 4), "float32"),
                                                          np.zeros(6, "int32")))}
    with pytest.raises(DataError, match="train_ds is a tf.data.Dataset from another cell.*"
                                        "inside the %%distribute cell"):
        run(MODEL, ns, data="train_ds")
    assert run(MODEL, ns, data="train_ds", mode="local").num_samples == 6


def test_one_name_that_is_no_dataset_says_what_is_expected():
    with pytest.raises(DataError,
                       match="--data x_train is a ndarray, expected a tf.data.Dataset.*X,Y"):
        run(MODEL, data="x_train")
