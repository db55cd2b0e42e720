"""Kernel-side checks of a %%distribute cell: each bad input gets a clear error, no cluster needed."""

import pytest

from nbdist.cell import assigned_names, inspect_cell
from nbdist.config import TrainConfig
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
    exec(cell, ns)
    return inspect_cell(cell, ns, TrainConfig(**options))


def test_assigned_names_ignore_function_bodies_and_comprehensions():
    names = assigned_names("import numpy as np\nfor i in range(3): a = i\n"
                           "def f():\n    hidden = 1\n[z for z in range(2)]\nwith open('f') as fh: pass")
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
    cell = MODEL.replace('x_train, y_train = np.zeros((6, 4), "float32"), np.zeros(6, "int32")\n', "")
    contents = run(cell, ns)
    assert set(contents.pushed) == {"x_train", "y_train"}


def test_non_array_data_gets_a_conversion_hint():
    with pytest.raises(DataError, match="expected a NumPy array"):
        run(MODEL + "x_train = 5")


def test_parameters_and_helpers_from_earlier_cells_are_pushed_but_modules_are_not():
    import numpy

    ns = {"WIDTH": 2, "np": numpy, "helper": lambda: 1, "_private": 3}
    cell = MODEL.replace("import keras, numpy as np\n", "import keras\n").replace("Dense(2)", "Dense(WIDTH)")
    contents = run(cell + "\n_ = helper() + _private", ns)
    assert set(contents.pushed) == {"WIDTH", "helper"}
