"""overhead.py's model.fit side: a child process that loads TensorFlow once and, per request
on stdin, times `model.fit` on the benchmark's MLP and the worker's compiled call alone with
the same threads. It sits idle (blocked on stdin) while nbdist trains, so the two never
compete for cores.

    # what FitChild starts; one JSON line per request
    python benchmarks/_overhead_fit.py --threads 2
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time

import _common  # noqa: F401 - sets TF_CPP_MIN_LOG_LEVEL and sys.path before nbdist loads
from _common import median

MODELS = {  # what both sides train (nbdist: the same code, no x_test, so no validation pauses)
    "mlp": '''
import keras
from nbdist.datasets import load_fashion_mnist
(x_train, y_train), _ = load_fashion_mnist()
x_train = x_train.reshape(-1, 784).astype("float32") / 255.0
model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(256, activation="relu"),
                          keras.layers.Dense(256, activation="relu"),
                          keras.layers.Dense(10, activation="softmax")])
model.compile(optimizer=keras.optimizers.SGD(0.05), loss="sparse_categorical_crossentropy")
''',
    # the keras.io "Simple MNIST convnet" (tests/tutorial_cells.py), on Fashion-MNIST, with SGD
    "convnet": '''
import keras
from keras import layers
from nbdist.datasets import load_fashion_mnist
(x_train, y_train), _ = load_fashion_mnist()
x_train = x_train.reshape(-1, 28, 28, 1).astype("float32") / 255.0
model = keras.Sequential([keras.Input((28, 28, 1)),
                          layers.Conv2D(32, kernel_size=(3, 3), activation="relu"),
                          layers.MaxPooling2D(pool_size=(2, 2)),
                          layers.Conv2D(64, kernel_size=(3, 3), activation="relu"),
                          layers.MaxPooling2D(pool_size=(2, 2)), layers.Flatten(),
                          layers.Dropout(0.5),
                          layers.Dense(10, activation="softmax")])
model.compile(optimizer=keras.optimizers.SGD(0.05), loss="sparse_categorical_crossentropy")
''',
}
MODEL_CODE = MODELS["mlp"]
RESULT = "@@result "
WINDOW = (0.10, 0.95)  # the part of each run that counts as steady state


# -- model.fit side (child process) -----------------------------------------------------------


def fit_server(threads: int) -> None:
    """Child: load TensorFlow once, then answer one JSON request per stdin line."""
    from nbdist.engine.keras_backend import configure_engine

    backend = os.environ.get("KERAS_BACKEND", "tensorflow")
    configure_engine(backend, threads, 0)  # exactly what a worker engine does
    info = {"backend": backend, **backend_threads()}
    print(RESULT + json.dumps({"ready": True, **info}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        print(RESULT + json.dumps(measure_fit(**request)), flush=True)


def backend_threads() -> dict:
    """The threads this process's backend computes with ("-" where it does not say: JAX)."""
    backend = os.environ.get("KERAS_BACKEND", "tensorflow")
    if backend == "tensorflow":
        import tensorflow as tf

        return {"intra": tf.config.threading.get_intra_op_parallelism_threads(),
                "inter": tf.config.threading.get_inter_op_parallelism_threads()}
    if backend == "torch":
        import torch

        return {"intra": torch.get_num_threads(), "inter": torch.get_num_interop_threads()}
    return {"intra": "-", "inter": "-"}


def measure_fit(batch: int, epochs: int, model: str = "mlp") -> dict:
    import keras
    import numpy as np

    ns: dict = {}
    exec(compile(MODELS[model], "<cell>", "exec"), ns)  # noqa: S102 - our own code
    model, x, y = ns["model"], ns["x_train"], ns["y_train"]
    n = len(x)
    model.fit(x[:batch * 20], y[:batch * 20], batch_size=batch, epochs=1, verbose=0)  # trace

    stamps: list[float] = []

    class Stamp(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            stamps.append(time.perf_counter())

    t0 = time.perf_counter()
    model.fit(x, y, batch_size=batch, epochs=epochs, verbose=0, shuffle=True, callbacks=[Stamp()])
    wall = time.perf_counter() - t0
    per_epoch = math.ceil(n / batch)
    sizes = [min(batch, n - (i % per_epoch) * batch) for i in range(len(stamps))]
    i0, i1 = int(WINDOW[0] * len(stamps)), int(WINDOW[1] * len(stamps)) - 1
    rate = sum(sizes[i0 + 1:i1 + 1]) / (stamps[i1] - stamps[i0])

    # FlatModel.gradients and .assign_and_gradients (the worker's per-step call), alone, same
    # threads.
    from nbdist.engine.flat_layout import read_flat
    from nbdist.engine.flatmodel import FlatModel

    flat = FlatModel(model)
    params, nt = read_flat(model)
    rng = np.random.default_rng(0)
    idx = [np.sort(rng.choice(n, batch, replace=False)) for _ in range(8)]
    for i in range(5):
        flat.gradients(x[idx[i % 8]], y[idx[i % 8]])
        flat.assign_and_gradients(params, nt, x[idx[i % 8]], y[idx[i % 8]])
    reps = 60
    t0 = time.perf_counter()
    for i in range(reps):
        flat.gradients(x[idx[i % 8]], y[idx[i % 8]])
    grad_s = (time.perf_counter() - t0) / reps
    t0 = time.perf_counter()
    for i in range(reps):  # what the worker's compute calls: the pulled weights go in with it
        flat.assign_and_gradients(params, nt, x[idx[i % 8]], y[idx[i % 8]])
    assign_grad_s = (time.perf_counter() - t0) / reps
    # the worker's own call: the batch gathered in the graph from held arrays, stateless
    # (nbdist's default) and assigning the variables first, alternated
    flat.hold(x, y)
    stateless = flat.stateless
    held = {}
    for mode in (True, False, False, True) * 3:  # ABBA order: drift hits both alike
        flat.stateless = mode and stateless
        for i in range(3):
            flat.assign_and_gradients_at(params, nt, idx[i % 8])
        t0 = time.perf_counter()
        for i in range(reps // 2):
            flat.assign_and_gradients_at(params, nt, idx[i % 8])
        held.setdefault(mode, []).append((time.perf_counter() - t0) / (reps // 2))
    return {"rate": rate, "whole_rate": epochs * n / wall, "steps": len(stamps),
            "grad_s": grad_s, "assign_grad_s": assign_grad_s, "params": int(params.size),
            "held_stateless_s": median(held[True]), "held_assign_s": median(held[False])}


class FitChild:
    """The model.fit process: started once, idle (blocked on stdin) while nbdist runs."""

    def __init__(self, threads: int):
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--threads", str(threads)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        self.info = self._read()

    def fit(self, batch: int, epochs: int, model: str = "mlp") -> dict:
        self.proc.stdin.write(json.dumps({"batch": batch, "epochs": epochs, "model": model}) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def _read(self) -> dict:
        for line in self.proc.stdout:
            if line.startswith(RESULT):
                return json.loads(line[len(RESULT):])
        raise RuntimeError(f"the model.fit child exited (code {self.proc.wait()})")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="overhead.py's model.fit child")
    parser.add_argument("--threads", type=int, required=True)
    fit_server(parser.parse_args().threads)
