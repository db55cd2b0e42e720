"""--mode pipeline with its stages as threads of the test process (real Keras, real signed
ZeroMQ sockets on loopback): exactness against single-machine training, and the stage cut."""

from __future__ import annotations

import numpy as np
import pytest

from nbdist.config import TrainConfig
from nbdist.errors import ConfigError
from tests.helpers import PIPELINE_OPERATORS_CELL
from tests.helpers import PIPELINE_SKIP_CELL as SKIP_CELL


def _start(cell: str, **options):
    from nbdist.engine.cell import inspect_cell
    from nbdist.modes.pipeline.start import start_stages

    config = TrainConfig(mode="pipeline", **options)
    ns: dict = {}
    exec(compile(cell, "<cell>", "exec"), ns)  # noqa: S102 - the test's own cell
    contents = inspect_cell(cell, ns, config)
    return ns, start_stages(cell, config, None, ns, False, contents, [], in_process=True)


def _reference(cell: str, batch: int, seed: int = 0) -> list:
    """The same cell trained on one machine, same mini-batches in the same order."""
    from nbdist.core.schedule import epoch_permutation

    ns: dict = {}
    exec(compile(cell, "<cell>", "exec"), ns)  # noqa: S102
    model, x, y = ns["model"], ns["x_train"], ns["y_train"]
    perm = epoch_permutation(len(x), seed, 0)
    for start in range(0, len(x), batch):
        model.train_on_batch(x[perm[start:start + batch]], y[perm[start:start + batch]])
    return [w.numpy() for w in model.weights]


@pytest.mark.parametrize(("stages", "schedule"),
                         [(2, "gpipe"), (3, "1f1b"), (3, "gpipe"), (2, "1f1b")])
@pytest.mark.slow
def test_pipeline_equals_single_machine_training(stages, schedule):
    cell = "B = 16\n" + SKIP_CELL
    want = _reference(cell, 16)
    ns, run = _start(cell, stages=stages, micro_batches=4, batch_size=16, schedule=schedule,
                     partition="uniform", timeout=60)
    run.wait(timeout=120)
    got = [w.numpy() for w in ns["model"].weights]
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)
    assert run.history["step"].max() == 20
    assert len(run.partition) == stages
    summary = run.pipeline
    assert summary["measured_steps"] == 20 and 0 < summary["bubble"] < 1
    assert "forward" in {t["name"] for t in run.pipeline_figure()["data"]}


@pytest.mark.slow
def test_operators_between_layers_are_steps_of_the_pipeline_and_it_equals_one_machine():
    """`c1 + c2 * 0.5` and `h * 2.0 + 1.0` are operations without weights: each is a step of
    the graph, placed in a stage like a layer (it failed: "'Multiply' object has no attribute
    'weights'")."""
    from nbdist.modes.pipeline.graph import Graph

    cell = "B = 16\n" + PIPELINE_OPERATORS_CELL
    ns: dict = {}
    exec(compile(cell, "<cell>", "exec"), ns)  # noqa: S102 - the test's own cell
    names = Graph(ns["model"]).names
    assert {"c1", "c2", "pool", "out"} <= set(names) and len(names) == 8, names
    want = _reference(cell, 16)
    for stages in (2, 3):
        ns, run = _start(cell, stages=stages, micro_batches=2, batch_size=16, partition="uniform",
                         timeout=60)
        run.wait(timeout=120)
        assert run.status == "finished", run.error
        for a, b in zip([w.numpy() for w in ns["model"].weights], want, strict=True):
            np.testing.assert_allclose(a, b, atol=1e-5)


@pytest.mark.slow
def test_a_batchnorm_cnn_and_integer_tokens_into_an_embedding_equal_one_machine():
    """A BatchNorm CNN at one micro-batch (its statistics are the mini-batch's, as in fit), and
    token ids into an Embedding at two: the first stage's inputs are integers (no gradient), and
    the Embedding's sparse gradients (IndexedSlices) are joined across the micro-batches, not
    made dense, so Adam updates them as fit's one batch (a dense sum moved Adam's moments of
    every row: 6e-3 off after 20 steps). The same cells on JAX and PyTorch:
    tests/inproc/test_backends.py."""
    from tests.backend_child import PIPELINE_BN_CELL, PIPELINE_TOKENS_CELL

    for cell, micro in ((PIPELINE_BN_CELL, 1), (PIPELINE_TOKENS_CELL, 2)):
        cell = "B = 16\n" + cell
        want = _reference(cell, 16)
        ns, run = _start(cell, stages=2, micro_batches=micro, batch_size=16, partition="uniform",
                         timeout=60)
        run.wait(timeout=120)
        assert run.status == "finished", run.error
        for a, b in zip([w.numpy() for w in ns["model"].weights], want, strict=True):
            np.testing.assert_allclose(a, b, atol=1e-5)


def test_profile_and_live_tensors_of_a_skip_connection():
    from nbdist.modes.pipeline.graph import Graph

    ns: dict = {}
    exec(compile("B = 8\n" + SKIP_CELL, "<cell>", "exec"), ns)  # noqa: S102
    graph = Graph(ns["model"])
    assert graph.names == ["d1", "d2", "add", "d3", "out"]
    # after d2 both d1's and d2's outputs are live: the Add still needs d1
    assert len(graph.live(0)) == 1 and len(graph.live(1)) == 2 and len(graph.live(2)) == 1
    from nbdist.modes.pipeline.profile import profile_model

    prof = profile_model(ns["model"], ns["x_train"][:8], repeats=1)
    assert [r["cut_bytes"] for r in prof["layers"]][:4] == [8 * 16 * 4, 2 * 8 * 16 * 4, 8 * 16 * 4,
                                                            8 * 12 * 4]
    assert [r["params"] for r in prof["layers"]] == [8 * 16 + 16, 16 * 16 + 16, 0, 16 * 12 + 12,
                                                     12 * 4 + 4]


def test_clear_errors():
    import nbdist
    from nbdist.errors import NoClusterError

    with pytest.raises(NoClusterError,
                       match=r"--mode pipeline puts each stage on its own engine.*%nbdist start 2"):
        nbdist.train("B = 8\n" + SKIP_CELL, namespace={}, mode="pipeline", batch_size=8,
                     micro_batches=2)
    with pytest.raises(ConfigError, match="does not split into --micro-batches 3"):
        TrainConfig(mode="pipeline", batch_size=16, micro_batches=3)
    with pytest.raises(ConfigError,
                       match="--stages 6 needs at least 6 layers.*d1, d2, add, d3, out"):
        _start("B = 8\n" + SKIP_CELL, stages=6, batch_size=8, micro_batches=2)
    subclassed = '''
import keras
import numpy as np
class Net(keras.Model):
    def __init__(self):
        super().__init__()
        self.a = keras.layers.Dense(4)
    def call(self, x):
        return self.a(x)
x_train = np.zeros((32, 3), "float32"); y_train = np.zeros((32, 4), "float32")
model = Net(); model.compile(optimizer="sgd", loss="mse")
'''
    with pytest.raises(ConfigError, match="subclassed keras.Model.*keras.Sequential"):
        _start(subclassed, stages=2, batch_size=8, micro_batches=2)


BN_CELL = '''
import keras
import numpy as np
keras.utils.set_random_seed(1)
from nbdist.datasets import make_synthetic
(x_train, y_train), (x_test, y_test) = make_synthetic(n=640, shape=(8,), classes=3, seed=1)
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(32, activation="relu"),
                          keras.layers.BatchNormalization(), keras.layers.Dropout(0.2),
                          keras.layers.Dense(16, activation="relu"),
                          keras.layers.Dense(3, activation="softmax")])
model.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy",
              metrics=["accuracy"])
'''


@pytest.mark.slow
def test_batchnorm_and_dropout_train_and_the_dashboard_shows_the_timeline():
    ns, run = _start(BN_CELL, stages=2, micro_batches=2, batch_size=32, epochs=3,
                     partition="uniform", schedule="1f1b", timeout=60)
    run.wait(timeout=180)
    bn = ns["model"].layers[1]  # its moving mean starts at 0; the stage that holds it updated it
    assert np.abs(bn.moving_mean.numpy()).max() > 1e-3
    val = run.history["val_accuracy"].dropna()
    assert len(val) == 3 and val.iloc[-1] > 0.8
    dash = run.dashboard()
    dash.refresh()
    assert {t["name"] for t in dash.figures["pipeline"]["data"]} >= {"forward", "backward"}


def test_stop_ends_after_the_current_mini_batch_and_keeps_the_weights():
    from nbdist.engine.flat_layout import read_flat
    from tests.helpers import wait_for

    cell = "B = 16\n" + SKIP_CELL
    start: dict = {}
    exec(compile(cell, "<cell>", "exec"), start)  # noqa: S102 - the weights the run starts from
    initial = read_flat(start["model"])[0]
    ns, run = _start(cell, stages=2, micro_batches=2, batch_size=16, epochs=500, timeout=60)
    before = [w.numpy().copy() for w in ns["model"].weights]
    wait_for(lambda: run.state.snapshot.get("global_step", 0) >= 5)
    current, _ = run.state.backend.current_weights(run.state.control)  # the stages' own layers
    assert current.shape == initial.shape and not np.array_equal(current, initial)
    run.stop()
    run.wait(timeout=60)
    assert run.status == "stopped" and run.error is None
    assert 5 <= run.history["step"].max() < 500 * 20
    assert any(not np.allclose(a, w.numpy())
               for a, w in zip(before, ns["model"].weights, strict=True))


@pytest.mark.slow
def test_same_host_stages_send_through_shared_memory_and_tcp_gives_the_same_weights():
    cell = "B = 16\n" + SKIP_CELL
    weights, messages = {}, {}
    for transport in ("auto", "tcp"):
        ns, run = _start(cell, stages=3, micro_batches=4, batch_size=16, schedule="1f1b",
                         partition="uniform", timeout=60, transport=transport)
        run.wait(timeout=120)
        assert run.error is None
        weights[transport] = [w.numpy() for w in ns["model"].weights]
        messages[transport] = run.pipeline["messages"]
    # 20 steps x 4 micro-batches, forwards out of stages 0-1 and gradients out of stages 1-2
    assert messages["auto"] == [{"shm": 80, "tcp": 0}, {"shm": 160, "tcp": 0},
                                {"shm": 80, "tcp": 0}]
    assert messages["tcp"] == [{"shm": 0, "tcp": 80}, {"shm": 0, "tcp": 160}, {"shm": 0, "tcp": 80}]
    for a, b in zip(weights["auto"], weights["tcp"], strict=True):
        np.testing.assert_array_equal(a, b)


def test_stage_link_slots_acks_fallback_growth_and_clean_up():
    import os

    from nbdist.hub.protocol import new_key
    from nbdist.modes.pipeline.kernel_link import KernelLink
    from nbdist.modes.pipeline.link import StageLink
    from nbdist.modes.pipeline.messages import Forward, Validation
    from tests.helpers import wait_for

    key = new_key()
    kernel = KernelLink(key, "r", "127.0.0.1", 2)
    a, b = (StageLink(key, "r", s, "127.0.0.1", 10, (3, 1 << 20), slots=2) for s in (0, 1))
    a.connect({"stage-1": b.info}, kernel.report_endpoint, kernel.control_endpoint)
    b.connect({"stage-0": a.info}, kernel.report_endpoint, kernel.control_endpoint)
    try:
        x = np.arange(12, dtype=np.float32).reshape(3, 4)
        for i in range(3):  # two slots: the third message, with none acknowledged, goes by TCP
            a.send("stage-1", Forward(1, i), [x + i, np.array([i], np.int32)])
        assert a.messages == {"shm": 2, "tcp": 1}
        box = a.outboxes["stage-1"]
        path = f"/dev/shm/{box.segment.name}"
        assert os.stat(path).st_mode & 0o777 == 0o600
        for i in range(3):
            _, h, (got, n) = b.wait(("F", 1, i))
            np.testing.assert_array_equal(got, x + i)
            assert n.dtype == np.int32 and n.tolist() == [i] and (h.shm is not None) == (i < 2)
        x[:] = -1  # the receiver holds copies, not views of the slots
        assert b.buffer == {} and got[0, 0] == 2
        wait_for(lambda: (a.drain(), box.busy() == 0)[1], timeout=10)  # the acks free both slots
        big = np.ones((300, 64), np.float32)  # larger than a slot, none in flight: a bigger segment
        a.send("stage-1", Validation(1), [big])
        grown = a.outboxes["stage-1"]
        assert (a.messages["shm"] == 3 and grown.generation == box.generation + 1
                and not os.path.exists(path))
        np.testing.assert_array_equal(b.wait(("E", 1, 0))[2][0], big)
        assert b.inboxes["stage-0"][0] == grown.segment.name
        path = f"/dev/shm/{grown.segment.name}"
    finally:
        a.close()
        b.close()
        kernel.close()
    assert not os.path.exists(path)  # the sender unlinks its segments when the stage ends


def test_with_encrypt_stage_links_admit_only_the_runs_clients():
    """--encrypt: a stage's PULL and the kernel's PULL and PUB are CurveZMQ servers. A peer
    without CurveZMQ, or with a client key of its own, delivers nothing, not even a message
    signed with the run's key; the run's own stages exchange arrays, reports and control."""
    import time

    import zmq

    from nbdist.hub.gate import curve_keys
    from nbdist.hub.protocol import Codec, new_key
    from nbdist.modes.pipeline.kernel_link import KernelLink
    from nbdist.modes.pipeline.link import StageLink
    from nbdist.modes.pipeline.messages import Forward, StepDone, Stop
    from tests.helpers import wait_for

    key = new_key()
    kernel = KernelLink(key, "r", "127.0.0.1", 2, encrypt=True)
    a, b = (StageLink(key, "r", s, "127.0.0.1", 10, (3, 1 << 20), transport="tcp", encrypt=True)
            for s in (0, 1))
    a.connect({"stage-1": b.info}, kernel.report_endpoint, kernel.control_endpoint)
    b.connect({"stage-0": a.info}, kernel.report_endpoint, kernel.control_endpoint)
    forged = Codec(key, "stage-0", "r").encode(
        {"op": "F", "step": 9, "mb": 0, "src": "stage-0", "shapes": [], "dtypes": []}, to="stage-1")
    ctx = zmq.Context()
    intruders = [ctx.socket(zmq.PUSH), ctx.socket(zmq.PUSH)]  # plaintext; CurveZMQ, its own key
    public, secret = zmq.curve_keypair()
    intruders[1].setsockopt(zmq.CURVE_SERVERKEY, curve_keys(key)["server_public"])
    intruders[1].setsockopt(zmq.CURVE_PUBLICKEY, public)
    intruders[1].setsockopt(zmq.CURVE_SECRETKEY, secret)
    for sock in intruders:
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(b.info["endpoint"])
        sock.send_multipart(forged)  # queued until the handshake, which fails
    try:
        x = np.arange(6, dtype=np.float32).reshape(2, 3)
        a.send("stage-1", Forward(1), [x])
        np.testing.assert_array_equal(b.wait(("F", 1, 0))[2][0], x)
        report = StepDone(1, 0, 0.5, 2, time.time())
        b.report(report)
        assert kernel.receive(5000) == (report, [])
        time.sleep(0.5)  # a SUB socket joins its PUB a moment after connecting
        kernel.broadcast(Stop())
        wait_for(lambda: (b.check_control(), b.stop_requested)[1], timeout=10)
        time.sleep(0.5)  # every chance for the intruders' message to arrive
        b.drain()
        assert b.buffer == {}  # step 9 never came in
    finally:
        for sock in intruders:
            sock.close()
        ctx.term()
        a.close()
        b.close()
        kernel.close()
