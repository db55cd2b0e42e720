"""Asynchronous training on a real local ipyparallel cluster (separate engine processes)."""

import os
import time

import numpy as np
import pytest

import nbdist
from nbdist.cluster.affinity import allowed_cores
from nbdist.errors import (
    AmbiguousModelError,
    DataError,
    ModelNotCompiledError,
    ModelNotFoundError,
    NotEnoughEnginesError,
    RemoteCellError,
)
from tests.helpers import (
    FASHION_CELL,
    SYNTHETIC_CELL,
    event_names,
    global_step,
    running,
    wait_for,
    wait_paused,
)


def weights(model):
    return np.concatenate([v.numpy().ravel() for v in model.trainable_variables])


def test_magic_trains_on_engines_and_the_notebook_model_gets_the_weights(cluster, ip):
    ip.magics_manager.registry["NbdistMagics"].cluster = cluster
    ip.run_cell(SYNTHETIC_CELL)  # an earlier run in the notebook: weights before
    ip.run_cell_magic("distribute", "--workers 2 --epochs 2 --batch-size 32 --wait -o myrun",
                      SYNTHETIC_CELL)
    run = ip.user_ns["myrun"]
    assert run.status == "finished" and run.error is None
    model = ip.user_ns["model"]
    assert run.model is model
    acc = model.evaluate(ip.user_ns["x_test"], ip.user_ns["y_test"], verbose=0)[1]
    assert acc > 0.9  # the kernel's own model holds the trained weights
    nodes = run.nodes
    assert list(nodes["worker"]) == [0, 1] and (nodes["samples"] > 0).all()
    assert nodes["samples"].sum() == 2 * 900 and set(nodes["state"]) == {"done"}
    assert nodes["delay_max"].max() >= 1  # two workers: pushes arrive stale


def test_train_api_with_arrays_from_an_earlier_cell(cluster):
    from nbdist.datasets import make_synthetic

    (xa, ya), (xb, yb) = make_synthetic(n=800, shape=(8,), classes=3, seed=4)
    ns = {"features": xa, "labels": ya}
    cell = SYNTHETIC_CELL.split("(x_train")[0] + SYNTHETIC_CELL.split("seed=1)\n")[1]
    run = nbdist.train(cell, cluster=cluster, namespace=ns, workers=2, epochs=2,
                       data="features,labels", wait=True)
    assert run.history["loss"].notna().sum() == run.history["step"].max()
    assert "val_accuracy" not in run.history  # no x_test in this notebook: no validation
    assert ns["model"].evaluate(xb, yb, verbose=0)[1] > 0.85


NOTEBOOK_HELPERS = '''
def task(n):
    from nbdist.datasets import make_synthetic
    return make_synthetic(n=n, shape=(8,), classes=3, seed=1)

class Net:
    width = 16

    @staticmethod
    def build():
        import keras
        model = keras.Sequential([keras.Input((8,)),
                                  keras.layers.Dense(Net.width, activation="relu"),
                                  keras.layers.Dense(3, activation="softmax")])
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy",
                      metrics=["accuracy"])
        return model
'''


def test_helper_function_and_class_defined_in_the_notebook_reach_the_engines(cluster):
    # A notebook defines them in __main__, which plain pickle can only name, not carry.
    ns = {"__name__": "__main__"}
    exec(compile(NOTEBOOK_HELPERS, "<earlier cell>", "exec"), ns)  # noqa: S102 - our own code
    assert ns["task"].__module__ == "__main__" == ns["Net"].__module__
    cell = "(x_train, y_train), (x_test, y_test) = task(1200)\nmodel = Net.build()\n"
    run = nbdist.train(cell, cluster=cluster, namespace=ns, workers=2, epochs=2, wait=True)
    assert run.status == "finished"
    assert ns["model"].evaluate(ns["x_test"], ns["y_test"], verbose=0)[1] > 0.85


def test_cell_error_on_engine_shows_engine_traceback_and_engines_stay_usable(cluster):
    # `np` was imported in an earlier cell: modules are not shipped, so only engines fail
    ns = {"np": np}
    cell = SYNTHETIC_CELL + "\nwidth = np.int64(16)\n"
    run = nbdist.train(cell, cluster=cluster, namespace=ns, workers=2, epochs=1)
    with pytest.raises(RemoteCellError,
                       match=r"NameError on engine \d.*'np' is not defined") as info:
        run.wait(timeout=120)
    assert ("width = np.int64(16)" in info.value.remote_traceback
            or "<%%distribute cell>" in info.value.remote_traceback)
    assert run.status == "failed"
    again = nbdist.train(SYNTHETIC_CELL, cluster=cluster, namespace={}, workers=2, wait=True)
    assert again.status == "finished"


@pytest.mark.parametrize("cell,options,error,match", [
    ("import numpy as np\nx_train = np.zeros(3)", {}, ModelNotFoundError, "defines no keras.Model"),
    (SYNTHETIC_CELL + "\nm2 = model", {}, AmbiguousModelError, "m2, model"),
    (SYNTHETIC_CELL.replace("model.compile(", "dict("), {}, ModelNotCompiledError, "not compiled"),
    (SYNTHETIC_CELL, {"data": "xs,ys"}, DataError, "xs, ys"),
    (SYNTHETIC_CELL + "\ny_train = y_train[:10]", {}, DataError, "900 samples but y_train has 10"),
    (SYNTHETIC_CELL, {"workers": 5}, NotEnoughEnginesError, "has 3 engine"),
])
def test_bad_input_fails_before_training_and_leaves_engines_ready(cluster, cell, options, error,
                                                                   match):
    with pytest.raises(error, match=match):
        nbdist.train(cell, cluster=cluster, namespace={}, **options)
    from nbdist.hub.launch import running_hubs

    assert cluster.client[:].apply_sync(running_hubs) == [[]] * 3


def test_pause_stops_pushes_resume_restarts_stop_ends_with_weights(cluster):
    ns = {}
    run = nbdist.train(SYNTHETIC_CELL, cluster=cluster, namespace=ns, workers=2, epochs=200,
                       batch_size=8)
    before = weights(ns["model"]).copy()
    wait_for(lambda: global_step(run) > 20)
    run.pause()
    # each worker is told on its next message, which carries its step in flight: once every
    # worker shows "paused", that step has landed and no other may follow
    wait_for(lambda: run.status == "paused" and set(run.nodes["state"]) == {"paused"})
    paused_at = global_step(run)
    time.sleep(1.5)  # deliberate: time passes while paused, and no push may land in it
    assert global_step(run) == paused_at, "pushes continued while paused"
    run.set_lr(0.05)
    run.resume()
    wait_for(lambda: global_step(run) > paused_at + 20)
    run.stop()
    run.wait(timeout=60)
    assert run.status == "stopped"
    assert [e for e in event_names(run) if e not in ("epoch_end", "note")] == [
        "pause", "set_lr", "resume", "stop"]
    assert not np.array_equal(before, weights(ns["model"]))


def test_current_weights_are_the_hubs_while_it_trains_and_the_model_gets_them_when_stopped(cluster):
    from nbdist.engine.flat_layout import read_flat

    ns = {}
    run = nbdist.train(SYNTHETIC_CELL, cluster=cluster, namespace=ns, workers=2, batch_size=8,
                       pause_at=20)
    initial = read_flat(ns["model"])[0]  # the kernel's model keeps these until the run ends
    wait_paused(run)  # every worker holds: its step in flight has landed
    backend, control = run.state.backend, run.state.control
    params, non_trainable = backend.current_weights(control)
    again, _ = backend.current_weights(control)
    assert params.shape == initial.shape and non_trainable.size == 0
    assert not np.array_equal(params, initial)  # trained on the hub
    np.testing.assert_array_equal(params, again)  # every worker holds: nothing lands
    np.testing.assert_array_equal(read_flat(ns["model"])[0], initial)  # read, not written in
    run.stop()
    run.wait(timeout=60)
    np.testing.assert_array_equal(read_flat(ns["model"])[0], params)


@pytest.mark.slow
def test_fashion_mnist_mlp_reaches_80_percent_in_two_epochs_with_two_workers(cluster):
    pytest.importorskip("nbdist.datasets").load_fashion_mnist()  # skip cleanly if data absent
    run = nbdist.train(FASHION_CELL, cluster=cluster, namespace={}, workers=2, epochs=2,
                       batch_size=64, wait=True)
    assert run.history["val_accuracy"].dropna().iloc[-1] >= 0.80


FUNCTIONAL_CELL = '''
import keras
from keras import ops
from nbdist.datasets import make_synthetic
(x_train, y_train), (x_test, y_test) = make_synthetic(n=1200, shape=(8,), classes=3, seed=2)

def smoothed_loss(y_true, y_pred):  # a custom loss defined in the cell
    y_true = ops.one_hot(ops.cast(ops.reshape(y_true, (-1,)), "int32"), 3)
    return keras.losses.categorical_crossentropy(0.9 * y_true + 0.1 / 3, y_pred)

inputs = keras.Input((8,))
h = keras.layers.Dense(32, activation="relu")(inputs)
h = keras.layers.BatchNormalization()(h)
h = keras.layers.Dropout(0.2)(h)
outputs = keras.layers.Dense(3, activation="softmax")(h)
net = keras.Model(inputs, outputs)
net.compile(optimizer=keras.optimizers.SGD(0.1), loss=smoothed_loss, metrics=["accuracy"])
'''


def test_functional_model_with_batchnorm_dropout_and_custom_loss_learns(cluster):
    ns = {}
    run = nbdist.train(FUNCTIONAL_CELL, cluster=cluster, namespace=ns, workers=2, epochs=3,
                       wait=True)
    assert run.model_name == "net"
    assert run.history["val_accuracy"].dropna().iloc[-1] > 0.85
    bn = next(layer for layer in ns["net"].layers if "batch_normalization" in layer.name)
    # the merged moving statistics reached the kernel's model (they start at 0 and 1)
    assert np.abs(bn.moving_mean.numpy()).max() > 0.01
    assert np.abs(bn.moving_variance.numpy() - 1).max() > 0.01


def test_two_shards_on_two_engines_give_the_same_weights_as_one(cluster):
    cell = SYNTHETIC_CELL.replace("import keras\n",
                                  "import keras\nkeras.utils.set_random_seed(5)\n")
    finals = []
    for servers in (1, 2):
        ns = {}
        run = nbdist.train(cell, cluster=cluster, namespace=ns, workers=1, servers=servers,
                           epochs=1, wait=True)
        assert run.nodes["steps"].sum() == 29
        finals.append(weights(ns["model"]))
    np.testing.assert_array_equal(finals[0], finals[1])


def test_hogwild_and_tcp_transport_learn(cluster):
    run = nbdist.train(SYNTHETIC_CELL, cluster=cluster, namespace={}, workers=2, epochs=2,
                       algorithm="hogwild", transport="tcp", wait=True)
    assert run.history["val_accuracy"].dropna().iloc[-1] > 0.85


def test_connect_attaches_to_a_running_cluster(cluster, ip):
    from nbdist.cluster.engines import Cluster

    other = Cluster.connect(**cluster.connect_args)
    try:
        assert other.engine_ids == cluster.engine_ids
        assert other.describe().startswith("connected") and other.connect_args is None
    finally:
        other.stop()  # only disconnects: the engines belong to the session fixture
    assert len(cluster.client[:].apply_sync(os.getpid)) == 3


@pytest.mark.slow
def test_magic_start_status_stop_leaves_no_process(ip, capsys):
    ip.run_line_magic("nbdist", "start 1")
    magics = ip.magics_manager.registry["NbdistMagics"]
    pids = magics.cluster.client[:].apply_sync(os.getpid)
    ip.run_line_magic("nbdist", "status")
    assert "1 engine(s)" in capsys.readouterr().out
    ip.run_line_magic("nbdist", "stop")
    assert magics.cluster is None
    for pid in pids:
        wait_for(lambda pid=pid: not running(pid), timeout=20)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="pinning needs two cores")
def test_pin_auto_gives_the_hub_and_the_worker_cores_of_their_own_and_trains_the_same(cluster):
    cell = SYNTHETIC_CELL.replace("import keras\n",
                                  "import keras\nkeras.utils.set_random_seed(5)\n")
    cores = sorted(os.sched_getaffinity(0))
    finals, placed = {}, {}
    for pin in ("auto", "off"):
        ns = {}
        run = nbdist.train(cell, cluster=cluster, namespace=ns, workers=1, servers=1, epochs=1,
                           pin=pin, wait=True)
        assert run.nodes["steps"].sum() == 29
        finals[pin] = weights(ns["model"])
        placed[pin] = [sorted(a) for a in cluster.client[:].apply_sync(os.sched_getaffinity, 0)]
    # the hub's engine, the worker's
    assert [cores[-1]] in placed["auto"] and cores[:-1] in placed["auto"]
    assert [cores[-1]] not in placed["off"] and cores[:-1] not in placed["off"]  # given back
    np.testing.assert_array_equal(finals["auto"], finals["off"])


def test_spin_auto_polls_where_the_hub_has_a_core_and_trains_the_same_as_off(cluster):
    """One hub and one worker on this 2-core host: the hub has a core of its own, so under
    --spin auto it polls (run.hubs says how long); with two workers it has none and sleeps."""
    cell = SYNTHETIC_CELL.replace("import keras\n",
                                  "import keras\nkeras.utils.set_random_seed(5)\n")
    finals, spins = {}, {}
    for spin in ("auto", "off"):
        ns = {}
        run = nbdist.train(cell, cluster=cluster, namespace=ns, workers=1, servers=1, epochs=1,
                           spin=spin, wait=True)
        assert run.status == "finished" and run.nodes["steps"].sum() == 29
        finals[spin], spins[spin] = weights(ns["model"]), [h["spin_s"] for h in run.hubs]
    cores = len(set().union(*cluster.client[:].apply_sync(allowed_cores)))  # the engines' host
    assert spins["off"] == [0.0]
    assert spins["auto"] == ([0.005] if cores >= 2 else [0.0])
    np.testing.assert_array_equal(finals["auto"], finals["off"])  # one worker: deterministic
    two = nbdist.train(cell, cluster=cluster, namespace={}, workers=2, servers=1, epochs=1,
                       wait=True)
    # 2 cores: no core left
    assert [h["spin_s"] for h in two.hubs] == ([0.005] if cores >= 3 else [0.0])
    tcp = nbdist.train(cell, cluster=cluster, namespace={}, workers=1, servers=1, epochs=1,
                       transport="tcp", wait=True)
    assert [h["spin_s"] for h in tcp.hubs] == [0.0]  # over TCP polling gained nothing


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2,
                    reason="a one-core engine set differs from this kernel's only with two cores")
def test_engines_started_on_one_core_are_planned_on_it_not_on_the_kernel_s_cores():
    """Engines started in a one-core set (`taskset -c 0 ipengine`, a Slurm task of one CPU)
    beside a kernel with more: the hub and the worker share that core, so the hub sleeps under
    --spin auto instead of polling as it would with the kernel's count."""
    from nbdist.cluster import affinity
    from nbdist.cluster.engines import Cluster

    core = min(os.sched_getaffinity(0))
    assert affinity.pin_process((core,))  # the engines inherit it, as from taskset
    try:
        small = Cluster.start(2)
    finally:
        affinity.unpin_process()
    try:
        assert small.client[:].apply_sync(allowed_cores) == [(core,), (core,)]
        run = nbdist.train(SYNTHETIC_CELL, cluster=small, namespace={}, workers=1, servers=1,
                           epochs=1, wait=True)
        assert run.status == "finished" and run.nodes["steps"].sum() == 29
        assert [h["spin_s"] for h in run.hubs] == [0.0]
        assert run.state.backend.host_cores(run.state.backend.roles.workers[0]) == 1
    finally:
        small.stop()
