"""Cells as tutorials write them, with their own `model.fit(...)` call, on offline data.

The keras.io "Simple MNIST convnet" (12,000 Fashion-MNIST images from nbdist.datasets instead of
a download, 3 epochs instead of 15 so the suite stays short), the same with EarlyStopping and
ReduceLROnPlateau, a functional model with two inputs and two outputs, a MaxNorm MLP (the
dropout paper's recipe) and a class-weighted imbalanced classifier. Apart from the data line
and the sizes, each is the tutorial's cell unchanged; every test trains it with plain Keras
too (`fit_baseline`) and compares.
"""

from __future__ import annotations

_FASHION = '''
from nbdist.datasets import load_fashion_mnist
(x_train, y_train), (x_test, y_test) = load_fashion_mnist()
x_train, y_train, x_test, y_test = x_train[:12000], y_train[:12000], x_test[:2000], y_test[:2000]
'''
# 12,000 images (as in the trial): with fewer, two async runs of one seed differ by as
# much as 0.04 and an async run lags fit's first epoch, so 0.03 from fit would measure noise;
# the MLP cells, cheap, test on more images too (sync and pipeline, which step as fit does,
# take half of them on the other backends: tests/backend_child.py)
_FASHION_MLP = _FASHION.replace("x_test[:2000], y_test[:2000]", "x_test[:4000], y_test[:4000]")

KERAS_IO_CONVNET = '''
import numpy as np
import keras
from keras import layers
num_classes = 10
input_shape = (28, 28, 1)
''' + _FASHION + '''
x_train = x_train.astype("float32") / 255
x_test = x_test.astype("float32") / 255
x_train = np.expand_dims(x_train, -1)
x_test = np.expand_dims(x_test, -1)
y_train = keras.utils.to_categorical(y_train, num_classes)
y_test = keras.utils.to_categorical(y_test, num_classes)
model = keras.Sequential(
    [
        keras.Input(shape=input_shape),
        layers.Conv2D(32, kernel_size=(3, 3), activation="relu"),
        layers.MaxPooling2D(pool_size=(2, 2)),
        layers.Conv2D(64, kernel_size=(3, 3), activation="relu"),
        layers.MaxPooling2D(pool_size=(2, 2)),
        layers.Flatten(),
        layers.Dropout(0.5),
        layers.Dense(num_classes, activation="softmax"),
    ]
)
batch_size = 128
epochs = 3
model.compile(loss="categorical_crossentropy", optimizer="adam", metrics=["accuracy"])
model.fit(x_train, y_train, batch_size=batch_size, epochs=epochs, validation_split=0.1)
score = model.evaluate(x_test, y_test, verbose=0)
print("Test loss:", score[0])
print("Test accuracy:", score[1])
'''

CONVNET_EARLY_STOPPING = KERAS_IO_CONVNET.replace(
    "model.fit(x_train, y_train, batch_size=batch_size, epochs=epochs, validation_split=0.1)",
    """callbacks = [
    keras.callbacks.EarlyStopping(monitor="val_loss", patience=2, restore_best_weights=True),
    keras.callbacks.ReduceLROnPlateau(monitor="val_loss", factor=0.5, patience=1, min_lr=1e-5),
]
history = model.fit(x_train, y_train, batch_size=batch_size, epochs=epochs, validation_split=0.1,
                    callbacks=callbacks)""").replace("epochs = 3", "epochs = 4")

TWO_INPUTS_TWO_OUTPUTS = '''
import numpy as np
import keras
from keras import layers
''' + _FASHION_MLP + '''
pixels_train = x_train.reshape(-1, 784).astype("float32") / 255
pixels_test = x_test.reshape(-1, 784).astype("float32") / 255
rows_train, rows_test = (pixels_train.reshape(-1, 28, 28).mean(axis=2),
                         pixels_test.reshape(-1, 28, 28).mean(axis=2))
bright_train, bright_test = (pixels_train.mean(axis=1, keepdims=True),
                             pixels_test.mean(axis=1, keepdims=True))

pixels = keras.Input(shape=(784,), name="pixels")
rows = keras.Input(shape=(28,), name="rows")
features = layers.concatenate([layers.Dense(128, activation="relu")(pixels),
                               layers.Dense(16, activation="relu")(rows)])
kind = layers.Dense(10, activation="softmax", name="kind")(features)
bright = layers.Dense(1, name="bright")(features)
model = keras.Model(inputs=[pixels, rows], outputs=[kind, bright])
model.compile(
    optimizer=keras.optimizers.RMSprop(1e-3),
    loss={"kind": "sparse_categorical_crossentropy", "bright": "mse"},
    loss_weights={"kind": 1.0, "bright": 0.2},
    metrics={"kind": ["accuracy"], "bright": ["mae"]},
)
history = model.fit({"pixels": pixels_train, "rows": rows_train},
                    {"kind": y_train, "bright": bright_train},
                    epochs=3, batch_size=32, validation_split=0.2)
results = model.evaluate({"pixels": pixels_test, "rows": rows_test},
                         {"kind": y_test, "bright": bright_test}, verbose=0, return_dict=True)
'''

MAXNORM_MLP = '''
import keras
from keras import layers
from keras.constraints import MaxNorm
''' + _FASHION_MLP + '''
x_train = x_train.reshape(-1, 784).astype("float32") / 255
x_test = x_test.reshape(-1, 784).astype("float32") / 255
model = keras.Sequential([
    keras.Input((784,)),
    layers.Dropout(0.2),
    layers.Dense(256, activation="relu", kernel_constraint=MaxNorm(2.0)),
    layers.Dropout(0.5),
    layers.Dense(256, activation="relu", kernel_constraint=MaxNorm(2.0)),
    layers.Dropout(0.5),
    layers.Dense(10, activation="softmax"),
])
model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.01, momentum=0.9),
              loss="sparse_categorical_crossentropy", metrics=["accuracy"])
model.fit(x_train, y_train, epochs=3, batch_size=64, validation_data=(x_test, y_test))
score = model.evaluate(x_test, y_test, verbose=0)
'''

CLASS_WEIGHTED = '''
import numpy as np
import keras
from keras import layers
''' + _FASHION_MLP + '''
# an imbalanced task: is it a bag (class 8), about 1 in 10?
x_train = x_train.reshape(-1, 784).astype("float32") / 255
x_test = x_test.reshape(-1, 784).astype("float32") / 255
y_train = (y_train == 8).astype("float32")
y_test = (y_test == 8).astype("float32")
neg, pos = np.bincount(y_train.astype(int))
class_weight = {0: (1 / neg) * (neg + pos) / 2.0, 1: (1 / pos) * (neg + pos) / 2.0}
model = keras.Sequential([
    keras.Input((784,)),
    layers.Dense(32, activation="relu"),
    layers.Dense(1, activation="sigmoid"),
])
model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="binary_crossentropy",
              metrics=[keras.metrics.AUC(name="auc"), keras.metrics.Recall(name="recall"),
                       keras.metrics.BinaryAccuracy(name="accuracy")])
model.fit(x_train, y_train, batch_size=64, epochs=3, validation_data=(x_test, y_test),
          class_weight=class_weight)
results = model.evaluate(x_test, y_test, verbose=0, return_dict=True)
'''

# what each test compares with plain Keras: the cell's own result after its fit
FIT_CELLS = {
    "keras-io-convnet": (KERAS_IO_CONVNET, lambda ns: ns["score"][1]),
    "early-stopping": (CONVNET_EARLY_STOPPING, lambda ns: ns["score"][1]),
    "two-in-two-out": (TWO_INPUTS_TWO_OUTPUTS, lambda ns: ns["results"]["kind_accuracy"]),
    "maxnorm": (MAXNORM_MLP, lambda ns: ns["score"][1]),
    "class-weighted": (CLASS_WEIGHTED, lambda ns: ns["results"]["auc"]),
}

_BASELINES: dict[str, float] = {}


def fit_baseline(name: str, cell: str | None = None) -> float:
    """The cell (`cell`, else FIT_CELLS's) run by plain Keras (its own fit call), seeded, once
    per test session."""
    import contextlib
    import io

    import keras

    if name not in _BASELINES:
        cell, result = cell or FIT_CELLS[name][0], FIT_CELLS[name][1]
        keras.utils.set_random_seed(0)
        ns: dict = {}
        with contextlib.redirect_stdout(io.StringIO()):
            exec(cell, ns)  # noqa: S102 - the test's own cell
        _BASELINES[name] = float(result(ns))
    return _BASELINES[name]


def trained_by_keras() -> bool | None:
    """On an engine: whether the cell's `model` there ever built Keras's train function (None:
    the engine ran no cell, e.g. a hub shard's)."""
    from nbdist.engine.run_cell import engine_namespace

    model = engine_namespace().get("model")
    return None if model is None else model.train_function is not None


# -- the parity cells (issue: async that trains as well as fit for every optimizer) ------------
# Classic small cells as a course writes them, each with its own fit call, 2-3 epochs: an MLP,
# the same with MaxNorm constraints, a CNN with BatchNorm and Dropout, and an Embedding + LSTM
# on a synthetic sequence task. `parity_cell(model, optimizer)` gives one with the optimizer
# spelled as the cell would (`PARITY_OPTIMIZERS`); tests/cluster/test_parity_cells.py and
# benchmarks/parity_matrix.py train them against plain `model.fit` on the same seed.

_PARITY_IMAGES = '''
import numpy as np
import keras
from keras import layers
from keras.constraints import MaxNorm
from nbdist.datasets import load_fashion_mnist
(x_train, y_train), (x_test, y_test) = load_fashion_mnist()
x_train, y_train, x_test, y_test = x_train[:12000], y_train[:12000], x_test[:4000], y_test[:4000]
'''

_PARITY_MODELS = {
    "mlp": (_PARITY_IMAGES + '''
x_train = x_train.reshape(-1, 784).astype("float32") / 255
x_test = x_test.reshape(-1, 784).astype("float32") / 255
model = keras.Sequential([
    keras.Input((784,)),
    layers.Dense(256, activation="relu"),
    layers.Dense(10, activation="softmax"),
])
''', "epochs=2, batch_size=64", 0.1),
    "maxnorm": (_PARITY_IMAGES + '''
x_train = x_train.reshape(-1, 784).astype("float32") / 255
x_test = x_test.reshape(-1, 784).astype("float32") / 255
model = keras.Sequential([
    keras.Input((784,)),
    layers.Dense(256, activation="relu", kernel_constraint=MaxNorm(2.0)),
    layers.Dense(256, activation="relu", kernel_constraint=MaxNorm(2.0)),
    layers.Dense(10, activation="softmax"),
])
''', "epochs=2, batch_size=64", 0.1),
    "bn-cnn": (_PARITY_IMAGES + '''
x_train = np.expand_dims(x_train.astype("float32") / 255, -1)
x_test = np.expand_dims(x_test.astype("float32") / 255, -1)
model = keras.Sequential([
    keras.Input((28, 28, 1)),
    layers.Conv2D(32, 3, use_bias=False),
    layers.BatchNormalization(),
    layers.ReLU(),
    layers.MaxPooling2D(2),
    layers.Conv2D(64, 3, use_bias=False),
    layers.BatchNormalization(),
    layers.ReLU(),
    layers.MaxPooling2D(2),
    layers.Flatten(),
    layers.Dropout(0.5),
    layers.Dense(10, activation="softmax"),
])
''', "epochs=2, batch_size=64", 0.05),
    "lstm": ('''
import numpy as np
import keras
from keras import layers
# does token 7 occur in the sequence? 15 tokens of 30 kinds; about half the sequences hold one
rng = np.random.default_rng(1234)
x_all = rng.integers(8, 30, size=(7000, 15))
holds = rng.random(7000) < 0.5
x_all[holds, rng.integers(0, 15, size=holds.sum())] = 7
y_all = holds.astype("int32")
x_train, y_train, x_test, y_test = x_all[:5000], y_all[:5000], x_all[5000:], y_all[5000:]
model = keras.Sequential([
    keras.Input((15,), dtype="int32"),
    layers.Embedding(30, 16),
    layers.LSTM(32),
    layers.Dense(2, activation="softmax"),
])
''', "epochs=3, batch_size=64", 0.5),
}

# how a cell spells each optimizer; "{lr}" is the model's plain-SGD rate
PARITY_OPTIMIZERS = {
    "sgd": "keras.optimizers.SGD({lr})",
    "momentum": "keras.optimizers.SGD({lr}, momentum=0.9)",
    "momentum5": "keras.optimizers.SGD({lr}, momentum=0.5)",
    "nesterov": "keras.optimizers.SGD({lr}, momentum=0.9, nesterov=True)",
    "rmsprop": "keras.optimizers.RMSprop()",
    "adam": "keras.optimizers.Adam()",
    "adamw": "keras.optimizers.AdamW()",
}


def parity_cell(model: str, optimizer: str) -> str:
    """The `model` cell ("mlp", "maxnorm", "bn-cnn", "lstm") compiled with `optimizer` (a key of
    PARITY_OPTIMIZERS), its own fit call, then `score = model.evaluate(...)` on held-out data."""
    body, fit_args, lr = _PARITY_MODELS[model]
    spelled = PARITY_OPTIMIZERS[optimizer].format(lr=lr)
    return body + f'''model.compile(optimizer={spelled}, loss="sparse_categorical_crossentropy",
              metrics=["accuracy"])
model.fit(x_train, y_train, {fit_args})
score = model.evaluate(x_test, y_test, verbose=0)
'''
