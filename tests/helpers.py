"""Helpers shared by the tests of every tier (fixtures live in conftest.py): waiting for an
event, the cells several test files train, and a Run fed with a made-up hub snapshot.

Test files import from here, never from each other or from conftest.py."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable

import numpy as np
import pytest

# -- waiting for events -------------------------------------------------------------------------


def wait_for(condition: Callable[[], object], timeout: float = 120.0, poll_s: float = 0.05,
             what: str | Callable[[], str] = "condition"):
    """Poll `condition` until it is true and return its value; fail the test after `timeout`
    seconds, saying `what` was awaited (a callable: what is left, read at the failure). A
    bound on a wait for an event, not a timing assertion: generous, so a loaded machine only
    waits longer."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what() if callable(what) else what} not reached within "
                                 f"{timeout:g}s")
        time.sleep(poll_s)
    return value


def wait_paused(run, timeout: float = 120.0):
    """Wait until `run`, started with `pause_at=N` (--pause-at), has paused itself and every
    worker holds; return it. The run cannot end before then (N is below its last step), so a
    test acts on a run that is surely still going: no race with its end."""
    wait_for(lambda: run.done() or (run.status == "paused" and set(run.nodes["state"]) <= HOLDING),
             timeout, what=lambda: f"run {run.run_id} paused (status {run.status})")
    assert not run.done(), f"the run ended ({run.status}) before it paused: pause_at is too late"
    return run


def wait_ended(run, timeout: float):
    """`run.wait(timeout)`, failing the test with what the hub last said (its step, pause, who
    trains and who evaluates, the last events) if the run is still going then: a hang in a
    cluster test says where it stands, not only that it timed out."""
    try:
        return run.wait(timeout=timeout)
    except TimeoutError:
        snap = run.state.snapshot
        nodes = [{k: n.get(k) for k in ("worker", "state", "steps", "hellos")}
                 for n in snap.get("nodes", [])]
        said = {k: snap.get(k) for k in ("global_step", "epochs_done", "paused", "finished",
                                         "lost", "open_epoch")}
        raise AssertionError(f"run {run.run_id} still {run.status} after {timeout:g}s: hub said "
                             f"{said}, nodes {nodes}, last events {snap.get('events', [])[-8:]}, "
                             f"warnings {run.warnings}") from None


HOLDING = {"paused", "done", "lost"}  # node states of a paused run's workers


def refuse_network(monkeypatch, who: str) -> None:
    """Make any outgoing connection fail the test: `who` must work offline."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"{who} tried to open a network connection")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def running(pid: int) -> bool:
    """Whether process `pid` exists now."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def alive(proc) -> bool:
    """Whether the `psutil.Process` `proc` still runs (a zombie, exited but not reaped, does not:
    its parent may be stopped or gone)."""
    import psutil

    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def outlives(pid: int, wait_s: float = 5.0) -> bool:
    """Whether `pid` still runs after up to `wait_s` seconds (engines take a moment to exit)."""
    deadline = time.monotonic() + wait_s
    while running(pid):
        if time.monotonic() >= deadline:
            return True
        time.sleep(0.1)
    return False


def global_step(run) -> int:
    """The hub's global step as the kernel last saw it (0 before the first poll)."""
    return run.stats.get("global_step", 0)


def event_names(run) -> list[str]:
    """The names of the run's events, oldest first."""
    events = run.events
    return events["event"].tolist() if "event" in events else []


# -- faults injected on an engine (sent there with apply_sync; imported there from this module) --


def hang_worker_once(worker: int, after_steps: int) -> None:
    """On an engine: the next run's worker `worker` there stops inside its step after
    `after_steps` steps and stays there, silent with its engine busy, until it is interrupted:
    a worker stuck in its own code. Once; steps are normal again afterwards."""
    import time

    fault_in_a_step(worker, after_steps, lambda loop: time.sleep(3600))


def stop_reading_once(worker: int, after_steps: int, requests: int, pause_s: float) -> None:
    """On an engine: the next run's worker `worker` there, after `after_steps` steps, stops
    reading for a while: it sends `requests` bare steps and reads none of their replies (its
    line fills), pauses `pause_s`, sends its next step and pauses again (so the hub answers it
    into a full line), then waits for that step's reply as usual. Once."""
    import time

    from nbdist.wire.messages import Step

    def not_reading_from(loop):
        transport, send_step = loop.transport, loop.transport.send_step

        def not_reading(*args, **kwargs):
            transport.send_step = send_step
            for _ in range(requests):
                transport.lines[0].send(Step(worker))
            time.sleep(pause_s)
            send_step(*args, **kwargs)
            time.sleep(pause_s)

        transport.send_step = not_reading

    fault_in_a_step(worker, after_steps, not_reading_from)


def fault_in_a_step(worker: int, after_steps: int, fault: Callable) -> None:
    """On an engine: the next run's worker `worker` there calls `fault(its loop)` once, inside
    its step after `after_steps` steps, where the step sleeps for its slow-down. Private access
    by necessity: nbdist has no fault hook, and grows none for tests."""
    from nbdist.modes.common import worker as module

    loop = module._AsyncLoop  # noqa: SLF001 - the worker loop the fault goes into
    original = loop._slow_down  # noqa: SLF001 - where a step sleeps: the fault's place

    def slow_down(self, compute_s, reply):
        if self.spec.worker == worker and self.steps > after_steps:
            loop._slow_down = original  # noqa: SLF001 - once: the steps after it are normal
            fault(self)
        return original(self, compute_s, reply)

    loop._slow_down = slow_down  # noqa: SLF001 - (see above)


def hub_process_pids() -> list[int]:
    """On an engine: the process ids of the hub shards it serves in processes of their own."""
    from nbdist.hub.launch import hub_process, running_hubs

    return [proc.pid for proc in (hub_process(*key) for key in running_hubs()) if proc is not None]


def tensorflow_threads() -> tuple[int, int]:
    """On an engine: TensorFlow's (intra-op, inter-op) thread counts (0: TensorFlow's default)."""
    import tensorflow as tf

    return (tf.config.threading.get_intra_op_parallelism_threads(),
            tf.config.threading.get_inter_op_parallelism_threads())


# -- cells --------------------------------------------------------------------------------------

# A small learnable problem: trains in seconds, reaches high accuracy (900 train, 300 test).
SYNTHETIC_CELL = '''
import keras
from nbdist.datasets import make_synthetic
(x_train, y_train), (x_test, y_test) = make_synthetic(n=1200, shape=(8,), classes=3, seed=1)
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                          keras.layers.Dense(3, activation="softmax")])
model.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy",
              metrics=["accuracy"])
'''

# The whole of Fashion-MNIST on an MLP: two workers reach 80 % in two epochs.
FASHION_CELL = '''
import keras
from nbdist.datasets import load_fashion_mnist
(x_train, y_train), (x_test, y_test) = load_fashion_mnist()
x_train = x_train.reshape(-1, 784).astype("float32") / 255.0
x_test = x_test.reshape(-1, 784).astype("float32") / 255.0
model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(256, activation="relu"),
                          keras.layers.Dense(256, activation="relu"),
                          keras.layers.Dense(10, activation="softmax")])
model.compile(optimizer=keras.optimizers.SGD(0.05), loss="sparse_categorical_crossentropy",
              metrics=["accuracy"])
'''

# Cells as Keras tutorials write them: a subclassed model, a tf.data.Dataset.
_DATA = SYNTHETIC_CELL.split("model = ")[0]  # imports and the synthetic arrays
SUBCLASSED_CELL = _DATA + '''
class Net(keras.Model):
    def __init__(self):
        super().__init__()
        self.hidden = keras.layers.Dense(16, activation="relu")
        self.out = keras.layers.Dense(3, activation="softmax")
    def call(self, x):
        return self.out(self.hidden(x))
model = Net()
model.build((None, 8))
model.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy",
              metrics=["accuracy"])
'''
DATASET_CELL = SYNTHETIC_CELL + '''
import tensorflow as tf
train_ds = tf.data.Dataset.from_tensor_slices((x_train, y_train)).batch(32)
'''

# The cells people actually write, on Fashion-MNIST: a tutorial convnet with one-hot labels and
# optimizer="adam", and an MLP with RMSprop on an ExponentialDecay schedule.
ADAM_CONVNET_CELL = '''
import numpy as np
import keras
from keras import layers
from nbdist.datasets import load_fashion_mnist
(x_train, y_train), (x_test, y_test) = load_fashion_mnist()
x_train, y_train, x_test, y_test = x_train[:6000], y_train[:6000], x_test[:2000], y_test[:2000]
x_train = np.expand_dims(x_train.astype("float32") / 255, -1)
x_test = np.expand_dims(x_test.astype("float32") / 255, -1)
y_train = keras.utils.to_categorical(y_train, 10)
y_test = keras.utils.to_categorical(y_test, 10)
model = keras.Sequential([
    keras.Input(shape=(28, 28, 1)),
    layers.Conv2D(8, kernel_size=(3, 3), activation="relu"),
    layers.MaxPooling2D(pool_size=(2, 2)),
    layers.Flatten(),
    layers.Dropout(0.5),
    layers.Dense(10, activation="softmax"),
])
model.compile(loss="categorical_crossentropy", optimizer="adam", metrics=["accuracy"])
'''
RMSPROP_SCHEDULE_CELL = '''
import keras
from nbdist.datasets import load_fashion_mnist
(x_train, y_train), (x_test, y_test) = load_fashion_mnist()
x_train = x_train[:8000].reshape(-1, 784).astype("float32") / 255
x_test = x_test[:2000].reshape(-1, 784).astype("float32") / 255
y_train, y_test = y_train[:8000], y_test[:2000]
model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(64, activation="relu"),
                          keras.layers.Dense(10, activation="softmax")])
schedule = keras.optimizers.schedules.ExponentialDecay(1e-3, decay_steps=100, decay_rate=0.9)
model.compile(optimizer=keras.optimizers.RMSprop(learning_rate=schedule),
              loss="sparse_categorical_crossentropy", metrics=["accuracy"])
'''
TYPICAL_CELLS = {"adam-convnet": ADAM_CONVNET_CELL, "rmsprop-schedule": RMSPROP_SCHEDULE_CELL}
# The dropout paper's recipe: dropout and a max-norm on every kernel. With Adam(2e-3) the first
# kernel's largest column norm reaches 2.16 in two epochs without the constraint, so it bites.
MAXNORM_CELL = '''
import keras
from nbdist.datasets import load_fashion_mnist
(x_train, y_train), (x_test, y_test) = load_fashion_mnist()
x_train = x_train[:8000].reshape(-1, 784).astype("float32") / 255
x_test = x_test[:2000].reshape(-1, 784).astype("float32") / 255
y_train, y_test = y_train[:8000], y_test[:2000]
model = keras.Sequential([
    keras.Input((784,)),
    keras.layers.Dropout(0.2),
    keras.layers.Dense(128, activation="relu", kernel_constraint=keras.constraints.MaxNorm(2.0)),
    keras.layers.Dropout(0.5),
    keras.layers.Dense(128, activation="relu", kernel_constraint=keras.constraints.MaxNorm(2.0)),
    keras.layers.Dropout(0.5),
    keras.layers.Dense(10, activation="softmax", kernel_constraint=keras.constraints.MaxNorm(2.0)),
])
model.compile(optimizer=keras.optimizers.Adam(2e-3), loss="sparse_categorical_crossentropy",
              metrics=["accuracy"])
'''


def column_norms(model) -> list:
    """The largest column norm of each Dense kernel (what MaxNorm bounds), in float64."""
    import numpy as np

    return [float(np.linalg.norm(layer.kernel.numpy().astype(np.float64), axis=0).max())
            for layer in model.layers if hasattr(layer, "kernel")]
TYPICAL_EPOCHS, TYPICAL_BATCH = 2, 32


def typical_accuracy(ns: dict) -> float:
    """Test accuracy of the model a typical cell defined in `ns`."""
    return float(ns["model"].evaluate(ns["x_test"], ns["y_test"], verbose=0,
                                      return_dict=True)["accuracy"])


_FIT_ACCURACY: dict[str, float] = {}


def typical_fit_accuracy(cells: dict[str, str] | None = None) -> dict[str, float]:
    """Plain `model.fit` on each typical cell (or on `cells`), the yardstick (seeded, in this
    process, once)."""
    import keras

    for name, cell in (TYPICAL_CELLS if cells is None else cells).items():
        if name not in _FIT_ACCURACY:
            keras.utils.set_random_seed(0)
            ns: dict = {}
            exec(cell, ns)  # noqa: S102 - the test's own cell
            ns["model"].fit(ns["x_train"], ns["y_train"], batch_size=TYPICAL_BATCH,
                            epochs=TYPICAL_EPOCHS, verbose=0)
            _FIT_ACCURACY[name] = typical_accuracy(ns)
    return _FIT_ACCURACY


def train_typical(cell: str, **options) -> tuple[float, object]:
    """Train a typical cell with nbdist as `fit` did; its accuracy and the run."""
    import keras

    import nbdist

    keras.utils.set_random_seed(0)
    ns: dict = {}
    run = nbdist.train(cell, namespace=ns, epochs=TYPICAL_EPOCHS, batch_size=TYPICAL_BATCH,
                       wait=True, **options)
    assert run.status == "finished" and run.error is None
    # trained with the cell's own optimizer, nothing else (two or more async workers hand back
    # the mean of the run's tail, and say so)
    assert [w for w in run.warnings if not w.startswith("--average-tail ")] == [], run.warnings
    return typical_accuracy(ns), run


def prepared(cell: str, config):
    """The job `nbdist.job.prepare_job` decides for `cell` once it has run (as `nbdist.train`
    runs it first), for tests of what the kernel decides."""
    from nbdist.job import prepare_job

    ns: dict = {}
    exec(cell, ns)  # noqa: S102 - the test's own cell
    return prepare_job(cell, config, ns)


# -- a Run fed by hand --------------------------------------------------------------------------


def snapshot(num_workers: int, t: float, *, paused: bool = False) -> dict:
    """What the hub's stats reply looks like at time t (worker w runs at 100 / (w + 1))."""
    import numpy as np

    nodes = [{"worker": w, "engine": w + 1, "host": "localhost", "state": "running",
              "samples": 10 * w, "samples_per_s": 100.0 / (w + 1), "steps": 5,
              "delay_mean": 1.0 + w, "delay_p95": 2.0 + w, "delay_max": 3, "batch_size": 32,
              "slowdown": 1.0 + (w == 1), "group": None, "loss": 1.0, "compute_s": 0.01,
              "comm_s": 0.001}
             for w in range(num_workers)]
    timeline = [{"worker": w, "time": tt, "samples_per_s": 100.0 / (w + 1), "batch_size": 32,
                 "delay_mean": 1.0 + w, "delay_p95": 2.0 + w}
                for w in range(num_workers) for tt in np.arange(0.0, t, 1.0)]
    history = [[tt, i, tt / 10, i % num_workers, 2.0 / (1 + tt), 1, 32]
               for i, tt in enumerate(np.arange(0.0, t, 0.1))]
    return {"nodes": nodes, "timeline": timeline, "history": history, "paused": paused,
            "lr": 0.05, "batch_policy": "fixed", "global_step": len(history),
            "delays": {str(w): {0: 3, 1 + w: 5} for w in range(num_workers)},
            "events": [{"time": 1.5, "step": 15, "event": "set_lr", "lr": 0.05}],
            "evals": [{"time": t, "step": len(history), "val_accuracy": 0.5, "val_loss": 1.2}]}


def fed_run(num_workers: int, t: float = 5.0, config=None):
    """A running Run with no hub behind it, fed `snapshot(num_workers, t)` the way the monitor
    thread feeds a real one (for the dashboard and report tests)."""
    from nbdist.config import TrainConfig
    from nbdist.run.handle import Run

    run = Run(config or TrainConfig(), model=None, model_name="model")
    run.state.status = "running"
    return feed(run, snapshot(num_workers, t))


def feed(run, snap: dict):
    """Give `run` the hub's next stats reply `snap`, by the monitor thread's own path."""
    from nbdist.run.monitor import absorb

    absorb(run, snap)
    return run


def end(run, status: str = "finished", history=None):
    """End a fed run as its monitor thread does when training is over (`monitor.conclude`:
    ended, then its Future completed with its History or its error). Its History is
    `history`, or a stand-in without Keras (tests/unit imports none): the one built from the
    epochs is tested in tests/inproc/test_run_future_local.py."""
    from types import SimpleNamespace

    from nbdist.run.monitor import conclude

    if run.state.keras_history is None and run.state.fit_call_returned is None:
        run.state.keras_history = history or SimpleNamespace(epoch=[], history={})
    run.state.status = status
    conclude(run)
    return run


def epoch_ends(run) -> list[int]:
    """The epochs whose end the run recorded, in order."""
    events = run.events
    return sorted(events.loc[events["event"] == "epoch_end", "epoch"]) if "epoch" in events else []


def quiet_keras_build():
    """Keras warns that build() on a subclassed model without build() creates nothing."""
    import warnings

    return warnings.catch_warnings(action="ignore", category=UserWarning)


def trained_every_sample(run, epochs: int = 2, threshold: float = 0.85, samples: int = 900) -> None:
    """The run finished, trained every sample once per (global) epoch and learned."""
    assert run.status == "finished" and run.error is None
    assert run.nodes["samples"].sum() == epochs * samples
    assert run.history["val_accuracy"].dropna().iloc[-1] > threshold

# --mode pipeline: a functional model whose skip connection (d1 read by the Add) crosses the
# cuts; prefix `B = n` for n * 20 samples.
PIPELINE_SKIP_CELL = '''
import keras
import numpy as np
keras.utils.set_random_seed(4)
rng = np.random.default_rng(0)
x_train = rng.normal(size=(B * 20, 8)).astype("float32")
y_train = rng.integers(0, 4, size=B * 20)
inp = keras.Input((8,))
d1 = keras.layers.Dense(16, activation="relu", name="d1")(inp)
d2 = keras.layers.Dense(16, activation="tanh", name="d2")(d1)
s = keras.layers.Add(name="add")([d1, d2])
d3 = keras.layers.Dense(12, activation="relu", name="d3")(s)
out = keras.layers.Dense(4, activation="softmax", name="out")(d3)
model = keras.Model(inp, out)
model.compile(optimizer=keras.optimizers.Adam(0.01), loss="sparse_categorical_crossentropy",
              metrics=["accuracy"])
'''

# A residual CNN written with operators, as functional models often are: `x + y` for the skip
# and `x * 0.5` for a scale are Keras operations (keras.ops), not layers: they have no weights.
PIPELINE_OPERATORS_CELL = '''
import keras
import numpy as np
keras.utils.set_random_seed(5)
rng = np.random.default_rng(1)
x_train = rng.normal(size=(B * 20, 8, 8, 1)).astype("float32")
y_train = rng.integers(0, 3, size=B * 20)
inp = keras.Input((8, 8, 1))
c1 = keras.layers.Conv2D(4, 3, padding="same", activation="relu", name="c1")(inp)
c2 = keras.layers.Conv2D(4, 3, padding="same", activation="tanh", name="c2")(c1)
s = c1 + c2 * 0.5
h = keras.layers.GlobalAveragePooling2D(name="pool")(s)
out = keras.layers.Dense(3, activation="softmax", name="out")(h * 2.0 + 1.0)
model = keras.Model(inp, out)
model.compile(optimizer=keras.optimizers.SGD(0.05), loss="sparse_categorical_crossentropy")
'''

# --mode local against one async worker (tests/cluster/test_local_equals_worker.py). Neither
# cell seeds Keras itself: the test seeds the kernel, and the workers start from its dropout
# seeds. 2,000 Fashion-MNIST images, one epoch of 63 steps at batch 32.
_FASHION_2000 = '''
import numpy as np
import keras
from nbdist.datasets import load_fashion_mnist
(x_train, y_train), (x_test, y_test) = load_fashion_mnist()
x_train, y_train, x_test, y_test = x_train[:2000], y_train[:2000], x_test[:500], y_test[:500]
'''
DROPOUT_MLP_CELL = _FASHION_2000 + '''
x_train = x_train.reshape(-1, 784).astype("float32") / 255
x_test = x_test.reshape(-1, 784).astype("float32") / 255
model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(64, activation="relu"),
                          keras.layers.Dropout(0.3), keras.layers.Dense(10, activation="softmax")])
model.compile(optimizer=keras.optimizers.SGD(0.05), loss="sparse_categorical_crossentropy",
              metrics=["accuracy"])
'''
BATCHNORM_CNN_CELL = _FASHION_2000 + '''
x_train = np.expand_dims(x_train.astype("float32") / 255, -1)
x_test = np.expand_dims(x_test.astype("float32") / 255, -1)
model = keras.Sequential([
    keras.Input((28, 28, 1)),
    keras.layers.Conv2D(8, 3, use_bias=False), keras.layers.BatchNormalization(),
    keras.layers.Activation("relu"), keras.layers.MaxPooling2D(2), keras.layers.Flatten(),
    keras.layers.Dropout(0.3), keras.layers.Dense(10, activation="softmax"),
])
model.compile(optimizer=keras.optimizers.SGD(0.05), loss="sparse_categorical_crossentropy",
              metrics=["accuracy"])
'''
LOCAL_WORKER_CELLS = {"dropout-mlp": DROPOUT_MLP_CELL, "batchnorm-cnn": BATCHNORM_CNN_CELL}

# The synthetic cell with Keras seeded inside it, so that every run starts from the same
# weights whatever --seed is: two runs then differ only by their data order.
SEEDED_SYNTHETIC_CELL = SYNTHETIC_CELL.replace("import keras\n",
                                               "import keras\nkeras.utils.set_random_seed(3)\n", 1)


def first_step_losses(run, steps: int = 3) -> list[float]:
    """The loss of each worker's first `steps` steps in a finished run: the first batches' loss
    on the same starting weights, so they tell its data order. Each worker's own rows in the
    order it trained them, the workers in the order of their losses: which sync rank takes
    which half of the global batch varies from run to run, the global batch does not (nor do
    the rows' `step` numbers, which count the reports as the hub takes them in)."""
    history = run.history.dropna(subset=["loss"])
    per_worker = sorted(tuple(float(v) for v in rows.sort_values("time")["loss"].iloc[:steps])
                        for _, rows in history.groupby("worker", dropna=False))
    assert all(len(rows) == steps for rows in per_worker), (
        f"run {run.run_id}: a worker has fewer than {steps} steps with a loss: {per_worker}")
    return [loss for rows in per_worker for loss in rows]


def assert_seed_sets_order(train) -> None:
    """`train(seed)` -> a finished run: the same --seed twice gives the same data order (the
    same first losses to 1e-6), and another seed another order (a first loss 1e-4 apart)."""
    a, again, b = (first_step_losses(train(seed)) for seed in (1, 1, 2))
    assert max(abs(x - y) for x, y in zip(a, again, strict=True)) < 1e-6, (a, again)
    assert max(abs(x - y) for x, y in zip(a, b, strict=True)) > 1e-4, (a, b)

# keras.io's transfer-learning guide, its data and base made small: train the top with the base
# frozen, then unfreeze the base, compile again with a low rate, and fit again (two fit calls)
TRANSFER_CELL = '''
import numpy as np
import keras
from nbdist.datasets import make_synthetic
(x_train, y_train), (x_test, y_test) = make_synthetic(n=1200, shape=(8,), classes=3, seed=1)
base_model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                               keras.layers.Dense(16, activation="relu")], name="base")
base_model.trainable = False
inputs = keras.Input((8,))
x = base_model(inputs, training=False)
outputs = keras.layers.Dense(3, activation="softmax")(x)
model = keras.Model(inputs, outputs)
model.compile(optimizer=keras.optimizers.Adam(), loss="sparse_categorical_crossentropy",
              metrics=["accuracy"])
base_before = [w.copy() for w in base_model.get_weights()]
top = model.fit(x_train, y_train, epochs=4, batch_size=16, validation_split=0.1)
base_after_top = [w.copy() for w in base_model.get_weights()]
top_score = model.evaluate(x_test, y_test, verbose=0)
base_model.trainable = True
model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy",
              metrics=["accuracy"])
tuned = model.fit(x_train, y_train, epochs=2, batch_size=16, validation_split=0.1)
score = model.evaluate(x_test, y_test, verbose=0)
'''


def check_transfer_cell(ns: dict) -> None:
    """The two phases of TRANSFER_CELL as Keras would train them: each call's History, the base
    untouched by the first and trained by the second, the second compile's optimizer kept."""
    assert ns["top"].epoch == [0, 1, 2, 3] and ns["tuned"].epoch == [0, 1]
    assert set(ns["top"].history) == {"loss", "accuracy", "val_loss", "val_accuracy"}
    assert len(ns["tuned"].history["loss"]) == 2
    for before, after in zip(ns["base_before"], ns["base_after_top"], strict=True):
        np.testing.assert_array_equal(before, after)  # frozen in the first phase
    # fit: 0.51 after the first phase (chance 0.33), 0.95 after the second (seed 0)
    assert ns["top_score"][1] > 0.42  # the code between the calls ran on the trained weights
    tuned = ns["base_model"].get_weights()
    assert any(np.abs(a - b).max() > 1e-6 for a, b in zip(ns["base_after_top"], tuned, strict=True))
    assert float(ns["model"].optimizer.learning_rate) == pytest.approx(1e-3)
    assert ns["score"][1] > 0.85
