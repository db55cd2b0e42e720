"""Cases the backend tests run in a child process of their own, with KERAS_BACKEND set there:
Keras picks its backend once per process, so a test on JAX or PyTorch cannot run in pytest's.

    KERAS_BACKEND=jax python -m tests.backend_child gradients OUT.npz
    KERAS_BACKEND=torch python -m tests.backend_child adam
    KERAS_BACKEND=jax python -m tests.backend_child convnet

Each case prints one line `@@result {json}` for the test to read.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys

import numpy as np

RESULT = "@@result "
FEATURES, CLASSES = 6, 3


def _models() -> dict:
    import keras

    class Subclassed(keras.Model):
        def __init__(self):
            super().__init__()
            self.hidden = keras.layers.Dense(7, activation="tanh",
                                             kernel_regularizer=keras.regularizers.l2(0.01))
            self.out = keras.layers.Dense(CLASSES)

        def call(self, x):
            h = self.hidden(x)
            self.add_loss(0.001 * keras.ops.sum(keras.ops.square(h)))  # a forward-pass loss
            return self.out(h)

    def functional():
        inputs = keras.Input((FEATURES,))
        a = keras.layers.Dense(8, activation="relu", kernel_regularizer="l2")(inputs)
        b = keras.layers.BatchNormalization()(keras.layers.Dense(8)(inputs))
        return keras.Model(inputs, keras.layers.Dense(CLASSES)(keras.layers.Concatenate()([a, b])))

    return {
        "sequential": lambda: keras.Sequential([keras.Input((FEATURES,)),
                                                keras.layers.Dense(8, activation="relu"),
                                                keras.layers.Dense(CLASSES)]),
        "functional": functional,
        "subclassed": Subclassed,
    }


def gradients(out: str) -> dict:
    """The worker's flat gradient (and loss, BatchNorm state, metric increments) of one batch
    with sample weights, for three kinds of model whose weights are set from a fixed seed, so
    every backend computes on the same numbers."""
    import keras

    from nbdist.engine.flat_layout import ensure_built, read_flat, write_flat
    from nbdist.engine.flatmodel import FlatModel

    rng = np.random.default_rng(0)
    x = rng.normal(size=(24, FEATURES)).astype(np.float32)
    y = rng.integers(0, CLASSES, 24)
    sw = rng.uniform(0.5, 1.5, 24).astype(np.float32)
    found = {}
    for name, build in _models().items():
        model = build()
        model.compile(optimizer="sgd", metrics=["accuracy"],
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        ensure_built(model, x[:2], y[:2], sw[:2])
        params, nt = read_flat(model)
        params = rng.normal(scale=0.3, size=params.size).astype(np.float32)
        nt = rng.uniform(0.5, 1.5, nt.size).astype(np.float32)  # BatchNorm means and variances
        write_flat(model, params, nt)
        flat = FlatModel(model)
        loss, grad, norm, nt_after = flat.assign_and_gradients(params, nt, x, y, sw)
        flat.hold(x, y, sw)
        held = flat.assign_and_gradients_at(params, nt, np.arange(4, 20))
        found.update({f"{name}/loss": np.float32(loss), f"{name}/grad": grad,
                      f"{name}/nt": nt_after, f"{name}/metrics": flat.last_metrics,
                      f"{name}/held_grad": held[1],
                      f"{name}/flat": np.array([type(flat).__name__])})
    np.savez(out, **found)
    return {"backend": keras.backend.backend(), "models": sorted(_models()), "out": out}


ADAM_MODELS = {  # the three kinds of model, without dropout (its masks are drawn per backend)
    "sequential": """
model = keras.Sequential([keras.Input((12,)), keras.layers.Dense(16, activation="relu"),
                          keras.layers.Dense(3, activation="softmax")])
""",
    "functional": """
inputs = keras.Input((12,))
a = keras.layers.Dense(16, activation="relu", kernel_regularizer="l2")(inputs)
# no bias before BatchNorm: its gradient is zero but for rounding, which Adam scales up to
# steps of the learning rate's size, so that bias would drift apart on any two code paths
b = keras.layers.BatchNormalization()(keras.layers.Dense(8, use_bias=False)(inputs))
model = keras.Model(inputs,
                    keras.layers.Dense(3, activation="softmax")(keras.layers.Concatenate()([a, b])))
""",
    "subclassed": """
class Net(keras.Model):
    def __init__(self):
        super().__init__()
        self.hidden = keras.layers.Dense(16, activation="tanh")
        self.out = keras.layers.Dense(3, activation="softmax")

    def call(self, x):
        h = self.hidden(x)
        self.add_loss(0.001 * keras.ops.mean(keras.ops.square(h)))  # a forward-pass loss
        return self.out(h)

model = Net()
""",
}
ADAM_CELL = '''
import numpy as np
import keras
keras.utils.set_random_seed(3)
rng = np.random.default_rng(3)
x = rng.normal(size=(1600, 12)).astype("float32")
y = (x[:, :3].sum(axis=1) > 0).astype("int64") + (x[:, 3] > 1).astype("int64")
{model}
model.compile(optimizer=keras.optimizers.Adam(0.01), loss="sparse_categorical_crossentropy")
model.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
'''


def adam_cell(kind: str = "sequential") -> str:
    return ADAM_CELL.format(model=ADAM_MODELS[kind])


def adam() -> dict:
    """50 hub steps with Adam (--mode local, one worker, no staleness, the data's own order)
    against Keras's own fit of the same cell on this backend, for each kind of model."""
    import keras

    return {"backend": keras.backend.backend(),
            "models": {kind: _adam(kind) for kind in ADAM_MODELS}}


def _adam(kind: str) -> dict:
    import nbdist
    from nbdist.engine.flat_layout import read_flat

    cell = adam_cell(kind)
    ns: dict = {}
    # the moving averages, as fit keeps them (not the statistics recomputed at the end)
    run = nbdist.train(cell, namespace=ns, mode="local", precise_bn=False)
    ours = np.concatenate(read_flat(ns["model"]))  # trainable and non-trainable (BatchNorm's)
    plain: dict = {}
    exec(cell, plain)  # noqa: S102 - the test's own cell, trained by Keras
    theirs = np.concatenate(read_flat(plain["model"]))
    steps = int(run.nodes["steps"].sum())
    return {"steps": steps, "max_diff": float(np.abs(ours - theirs).max()),
            "moved": float(np.abs(theirs - np.concatenate(read_flat(_fresh(cell)))).max()),
            "events": [str(t) for t in run.events["text"].dropna()]}


MODE_RUNS = {  # what async's options do, in the kernel: --mode local (one worker) and simulate
    "local": {},
    "local --local-steps 4": {"local_steps": 4},
    "local --overlap": {"overlap": True},
    "local --algorithm easgd": {"algorithm": "easgd"},
    **{f"simulate --algorithm {rule}": {"mode": "simulate", "workers": 4, "algorithm": rule}
       for rule in ("asgd", "hogwild", "dc-asgd", "dc-asgd-a", "softsync", "ssp", "group")},
    # ddc-asgd is its own momentum on plain SGD: it refuses the cell's Adam unless told
    "simulate --algorithm ddc-asgd --server-optimizer sgd --lr 0.05": {
        "mode": "simulate", "workers": 4, "algorithm": "ddc-asgd", "server_optimizer": "sgd",
        "lr": 0.05},
    "simulate --dbs --slowdown 1,1,2,4": {"mode": "simulate", "dbs": True,
                                          "slowdown": (1, 1, 2, 4)},
}


def modes() -> dict:
    """The Sequential Adam cell (3 epochs) trained by each of MODE_RUNS, and by Keras's fit: the
    accuracy each reaches on its training data, on this backend."""
    import keras

    import nbdist

    cell = adam_cell().replace("epochs=1", "epochs=3")
    found = {}
    for name, options in MODE_RUNS.items():
        ns: dict = {}
        with contextlib.redirect_stdout(io.StringIO()):
            nbdist.train(cell, namespace=ns, **{"mode": "local", **options})
        found[name] = _accuracy(ns)
    plain: dict = {}
    exec(cell, plain)  # noqa: S102 - the test's own cell, trained by Keras
    majority = float(np.bincount(plain["y"]).max() / len(plain["y"]))
    return {"backend": keras.backend.backend(), "fit": _accuracy(plain), "majority": majority,
            "runs": found}


ASYNC_RUNS = {  # on engines: 2 workers, 1 hub shard
    "--algorithm dc-asgd-a --dbs": {"algorithm": "dc-asgd-a", "dbs": True},
    "--local-steps 2": {"local_steps": 2},
    "--overlap": {"overlap": True},
    # what sync's refusal points to
    "--algorithm ssp --staleness 0": {"algorithm": "ssp", "staleness": 0},
}


def async_options(cluster=None) -> dict:
    """The Sequential Adam cell (3 epochs) in --mode async on a real cluster (`cluster`, else
    one of its own) with each of ASYNC_RUNS, and by Keras's fit: the accuracy each reaches on
    its training data."""
    import keras

    import nbdist

    cell = adam_cell().replace("epochs=1", "epochs=3")
    found = {}
    with _a_cluster(cluster) as on:
        for name, options in ASYNC_RUNS.items():
            ns: dict = {}
            with contextlib.redirect_stdout(io.StringIO()):
                nbdist.train(cell, namespace=ns, cluster=on, workers=2, **options)
            found[name] = _accuracy(ns)
    plain: dict = {}
    exec(cell, plain)  # noqa: S102 - the test's own cell, trained by Keras
    return {"backend": keras.backend.backend(), "fit": _accuracy(plain), "runs": found}


@contextlib.contextmanager
def _a_cluster(cluster=None):
    """`cluster`, or a cluster of 3 engines (one hub shard, two workers) stopped at the end."""
    import nbdist

    if cluster is not None:
        yield cluster
        return
    own = nbdist.Cluster.start(3)
    try:
        yield own
    finally:
        own.stop()


def on_a_cluster() -> dict:
    """`convnet`, `async_options` and (PyTorch) `sync_batchnorm` on one cluster: its engines
    start and import Keras once."""
    import time

    import keras

    seconds = {}
    with _a_cluster() as cluster:
        said = {}
        for name, part in (("convnet", convnet), ("async_options", async_options),
                           ("sync_batchnorm", sync_batchnorm)):
            if name == "sync_batchnorm" and keras.backend.backend() != "torch":
                continue
            started = time.monotonic()
            said[name] = part(cluster)
            seconds[name] = round(time.monotonic() - started, 1)
        return {**said, "seconds": seconds}  # where a slow CI run's time went


def sync_batchnorm(cluster) -> dict:
    """The BatchNorm CNN in sync with 2 ranks and --sync-batchnorm (the torch collective's
    statistics over the global batch): the accuracy, and each rank's moving statistics."""
    import keras

    import nbdist
    from tests.helpers import BATCHNORM_CNN_CELL

    keras.utils.set_random_seed(0)
    ns: dict = {}
    with contextlib.redirect_stdout(io.StringIO()):
        run = nbdist.train(BATCHNORM_CNN_CELL, namespace=ns, cluster=cluster, mode="sync",
                           workers=2, epochs=1, batch_size=32, sync_batchnorm=True,
                           precise_bn=False, wait=True)
    ranks = [r["own_non_trainable"] for r in run.worker_results.values()]
    accuracy = ns["model"].evaluate(ns["x_test"], ns["y_test"], verbose=0, return_dict=True)
    return {"status": run.status, "accuracy": float(accuracy["accuracy"]),
            "ranks_differ": float(np.abs(np.asarray(ranks[0]) - np.asarray(ranks[1])).max())}


def dataloader() -> dict:
    """The Sequential Adam cell fed by a `torch.utils.data.DataLoader` (3 epochs): --mode local
    and Keras's own fit of the same cell, and the accuracy each reaches on the arrays."""
    import keras

    import nbdist

    cell = adam_cell().replace("epochs=1", "epochs=3").replace(
        "model.fit(x, y, batch_size=32,",
        "import torch\nfrom torch.utils.data import DataLoader, TensorDataset\n"
        "loader = DataLoader(TensorDataset(torch.from_numpy(x), torch.from_numpy(y)), "
        "batch_size=32)\n"
        "model.fit(loader,")
    ns: dict = {}
    run = nbdist.train(cell, namespace=ns, mode="local")
    plain: dict = {}
    exec(cell, plain)  # noqa: S102 - the test's own cell, trained by Keras
    return {"backend": keras.backend.backend(), "fit": _accuracy(plain), "local": _accuracy(ns),
            "steps": int(run.nodes["steps"].sum()),
            "events": [str(t) for t in run.events["text"].dropna()]}


def _accuracy(ns: dict) -> float:
    predicted = np.asarray(ns["model"].predict(ns["x"], verbose=0)).argmax(axis=1)
    return float((predicted == ns["y"]).mean())


def _fresh(cell: str):
    """The cell's model as built, before training (the cell seeds itself)."""
    fresh: dict = {}
    exec(cell.replace("model.fit(", "(lambda *a, **k: None)("), fresh)  # noqa: S102
    model = fresh["model"]
    model(fresh["x"][:1])  # a subclassed model has its variables after its first call
    return model


def convnet(cluster=None) -> dict:
    """The keras.io convnet cell, unchanged: sync with 2 ranks and pipeline with 2 stages on a
    real cluster (`cluster`, else one of its own) and plain Keras's fit, on this backend; and
    the backend each engine's Keras runs. (Async on this backend: `async_options`, on the same
    cluster; --mode local: fifty hub steps against fit, step for step, and the rules and
    options, in tests/inproc/test_backends.py.)"""
    import time

    import keras

    import nbdist
    from tests.tutorial_cells import FIT_CELLS, fit_baseline

    cell, result = FIT_CELLS["keras-io-convnet"]
    # half the images: sync and pipeline step as fit does, so their spread is fit's own (the
    # 12,000 of the TensorFlow tests guard async's lag, which this does not run)
    cell = cell.replace("x_train[:12000], y_train[:12000]", "x_train[:6000], y_train[:6000]")
    started = time.monotonic()
    scores = {"fit": fit_baseline("keras-io-convnet", cell)}
    seconds = {"fit": round(time.monotonic() - started, 1)}
    with _a_cluster(cluster) as on:
        keras.utils.set_random_seed(0)
        ns: dict = {}
        with contextlib.redirect_stdout(io.StringIO()):
            run = nbdist.train(cell, namespace=ns, cluster=on, mode="sync", workers=2)
        scores["sync"] = float(result(ns))
        seconds["sync"] = round(time.monotonic() - started - sum(seconds.values()), 1)
        scores["sync_events"] = [str(t) for t in run.events["text"].dropna()]
        keras.utils.set_random_seed(0)
        ns = {}
        with contextlib.redirect_stdout(io.StringIO()):
            # (uniform: the measured cut's candidate timing, on JAX a compile per stage, is
            # tested in process by `pipeline` below; here the backend's passes on engines are)
            run = nbdist.train(cell, namespace=ns, cluster=on, mode="pipeline", stages=2,
                               partition="uniform")
        scores["pipeline"] = float(result(ns))
        seconds["pipeline"] = round(time.monotonic() - started - sum(seconds.values()), 1)
        scores["pipeline_epochs"] = list(run.keras_history.epoch)
        engines = on.client[:].apply_sync(_engine_backend)
    return {"backend": keras.backend.backend(), **scores, "engines": engines,
            "seconds": seconds}


def _engine_backend() -> str | None:
    """On an engine: the backend its Keras runs, None if it never imported Keras (a hub's)."""
    import sys

    keras = sys.modules.get("keras")
    return None if keras is None else keras.backend.backend()


def mismatch() -> dict:
    """An engine whose Keras already runs on TensorFlow refuses a run on this backend."""
    import nbdist
    from nbdist.errors import BackendError

    cluster = nbdist.Cluster.start(2)
    try:
        cluster.client[:].apply_sync(_load_tensorflow_keras)
        try:
            nbdist.train(adam_cell(), namespace={}, cluster=cluster, workers=1)
        except BackendError as exc:
            return {"error": str(exc)}
        return {"error": None}
    finally:
        cluster.stop()


def _load_tensorflow_keras() -> str:
    import os

    os.environ["KERAS_BACKEND"] = "tensorflow"
    import keras

    return keras.backend.backend()


def cell_sets_backend(backend: str) -> dict:
    """A kernel that has not imported Keras: the cell's own KERAS_BACKEND line chooses the run's
    backend (nbdist imports Keras only after the cell does)."""
    import nbdist

    cell = f'import os\nos.environ["KERAS_BACKEND"] = "{backend}"\n' + adam_cell()
    ns: dict = {}
    run = nbdist.train(cell, namespace=ns, mode="local")
    import keras

    return {"backend": keras.backend.backend(),
            "events": [str(t) for t in run.events["text"].dropna()]}


# --mode pipeline's stages on this backend, in this process (threads, real sockets): a BatchNorm
# CNN (one micro-batch: BatchNorm's statistics are the mini-batch's, as in fit) and integer
# token inputs into an Embedding (the first stage's inputs are not floats)
PIPELINE_BN_CELL = """
import keras
import numpy as np
keras.utils.set_random_seed(6)
rng = np.random.default_rng(2)
x_train = rng.normal(size=(B * 20, 8, 8, 1)).astype("float32")
y_train = rng.integers(0, 3, size=B * 20)
model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(4, 3, use_bias=False),
                          keras.layers.BatchNormalization(), keras.layers.Activation("relu"),
                          keras.layers.Flatten(), keras.layers.Dense(3, activation="softmax")])
model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
              loss="sparse_categorical_crossentropy", metrics=["accuracy"])
"""
PIPELINE_TOKENS_CELL = """
import keras
import numpy as np
keras.utils.set_random_seed(7)
rng = np.random.default_rng(3)
x_train = rng.integers(0, 50, size=(B * 20, 6))
y_train = rng.integers(0, 2, size=B * 20)
model = keras.Sequential([keras.Input((6,), dtype="int32"), keras.layers.Embedding(50, 8),
                          keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(8, "relu"),
                          keras.layers.Dense(2, activation="softmax")])
model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
"""


def pipeline() -> dict:
    """Each cell's weights after 20 pipeline steps against the same cell trained on one machine
    with `train_on_batch` on the same mini-batches, on this backend (the largest difference)."""
    from tests.helpers import PIPELINE_OPERATORS_CELL, PIPELINE_SKIP_CELL
    from tests.inproc.test_pipeline_inproc import _reference, _start

    cases = {"skip": (PIPELINE_SKIP_CELL, dict(stages=3, micro_batches=4, schedule="gpipe")),
             # cut by --partition measured: the candidates timed with this backend's passes
             "operators": (PIPELINE_OPERATORS_CELL, dict(stages=2, micro_batches=2,
                                                         schedule="1f1b", partition="measured")),
             "batchnorm": (PIPELINE_BN_CELL, dict(stages=2, micro_batches=1)),
             "tokens": (PIPELINE_TOKENS_CELL, dict(stages=2, micro_batches=2))}
    said = {}
    for name, (cell, options) in cases.items():
        cell = "B = 16\n" + cell
        want, initial = _reference(cell, 16), _initial_weights(cell)
        ns, run = _start(cell, batch_size=16, timeout=60, **{"partition": "uniform", **options})
        run.wait(timeout=180)
        got = [np.asarray(w.numpy()) for w in ns["model"].weights]
        said[name] = {"status": run.status, "steps": int(run.history["step"].max()),
                      "moved": _largest_difference(got, initial),
                      "difference": _largest_difference(got, want)}
    import keras

    return {"backend": keras.backend.backend(), **said}


def _largest_difference(a: list, b: list) -> float:
    return max(float(np.abs(x - y).max()) for x, y in zip(a, b, strict=True))


def _initial_weights(cell: str) -> list:
    ns: dict = {}
    exec(compile(cell, "<cell>", "exec"), ns)  # noqa: S102 - the test's own cell
    return [np.asarray(w.numpy()) for w in ns["model"].weights]


CASES = {"gradients": gradients, "adam": adam, "modes": modes, "dataloader": dataloader,
         "async_options": async_options, "convnet": convnet, "on_a_cluster": on_a_cluster,
         "pipeline": pipeline,
         "mismatch": mismatch, "cell_sets_backend": cell_sets_backend}

if __name__ == "__main__":
    print(RESULT + json.dumps(CASES[sys.argv[1]](*sys.argv[2:])), flush=True)
