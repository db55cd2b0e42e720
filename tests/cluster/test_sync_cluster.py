"""Synchronous training through real Horovod (Gloo) on a real local ipyparallel cluster."""

import numpy as np
import pytest

import nbdist
from nbdist.errors import RemoteCellError, TrainingError
from tests.helpers import FASHION_CELL, SYNTHETIC_CELL, wait_paused

pytest.importorskip("horovod.tensorflow", reason="Horovod is built by `make horovod`")
pytestmark = pytest.mark.horovod


def test_sync_ranks_end_with_identical_weights_equal_to_the_kernel_model(cluster):
    ns = {}
    run = nbdist.train(SYNTHETIC_CELL, cluster=cluster, namespace=ns, mode="sync", workers=2,
                       epochs=2, batch_size=32, wait=True)
    results = run.worker_results
    assert sorted(results) == [0, 1]
    np.testing.assert_array_equal(results[0]["params"], results[1]["params"])
    kernel = np.concatenate([v.numpy().ravel() for v in ns["model"].trainable_variables])
    np.testing.assert_array_equal(kernel, results[0]["params"])
    assert results[0]["steps"] == results[1]["steps"] == 2 * 15  # ceil(900 / 64) per epoch
    assert run.history["val_accuracy"].dropna().iloc[-1] > 0.9
    assert (run.nodes["delay_max"] == 0).all()  # synchronous: never stale


def test_sync_works_when_engines_name_their_variables_differently(cluster):
    """Keras names variables with per-process counters; Horovod matches collectives by name.
    Build an extra layer on one engine only, so its variables are `dense_k` with another k."""
    cluster.client[1].execute("import keras; keras.layers.Dense(2).build((None, 2))", block=True)
    run = nbdist.train(SYNTHETIC_CELL, cluster=cluster, namespace={}, mode="sync", workers=2,
                       epochs=1, wait=True, timeout=60)
    assert run.status == "finished"


def test_second_sync_run_in_the_same_session_works(cluster):
    for _ in range(2):
        run = nbdist.train(SYNTHETIC_CELL, cluster=cluster, namespace={}, mode="sync", workers=2,
                           epochs=1, wait=True)
        assert run.status == "finished"


def test_a_rank_failing_mid_training_fails_the_run_naming_the_engine(cluster):
    cell = SYNTHETIC_CELL + (
        "\nimport os\nif os.environ.get('HOROVOD_RANK') == '1':\n"
        "    x_train = x_train.copy(); x_train[:] = float('nan')\n")
    run = nbdist.train(cell, cluster=cluster, namespace={}, mode="sync", workers=2, epochs=1)
    with pytest.raises((TrainingError, RemoteCellError), match=r"rank 1 \(engine \d\)|engine \d"):
        run.wait(timeout=120)
    again = nbdist.train(SYNTHETIC_CELL, cluster=cluster, namespace={}, mode="sync", workers=2,
                         wait=True)
    assert again.status == "finished"  # the engines are usable afterwards


def test_sync_pause_and_stop_reach_every_rank_at_the_same_step(cluster):
    run = nbdist.train(SYNTHETIC_CELL, cluster=cluster, namespace={}, mode="sync", workers=2,
                       batch_size=8, pause_at=20)
    wait_paused(run)  # the pause reached both ranks at one step, held there
    run.stop()
    run.wait(timeout=60)
    assert run.status == "stopped"
    results = run.worker_results
    assert results[0]["steps"] == results[1]["steps"]
    np.testing.assert_array_equal(results[0]["params"], results[1]["params"])


def test_sync_current_weights_come_from_rank_0_while_it_trains(cluster):
    """Paused first: rank 0 learns of the pause with the request for its weights at the latest,
    so what it sends comes after its last step."""
    from nbdist.engine.flat_layout import read_flat

    ns = {}
    run = nbdist.train(SYNTHETIC_CELL, cluster=cluster, namespace=ns, mode="sync", workers=2,
                       batch_size=8, pause_at=20)
    initial = read_flat(ns["model"])[0]  # the kernel's model keeps these until the run ends
    wait_paused(run)
    backend, control = run.state.backend, run.state.control
    params, non_trainable = backend.current_weights(control)
    again, _ = backend.current_weights(control)
    assert params.shape == initial.shape and non_trainable.size == 0
    assert not np.array_equal(params, initial)  # trained on the ranks
    np.testing.assert_array_equal(params, again)  # paused: no step since
    run.stop()
    run.wait(timeout=60)
    results = run.worker_results
    np.testing.assert_array_equal(results[0]["params"], params)
    np.testing.assert_array_equal(read_flat(ns["model"])[0], params)


@pytest.mark.slow
def test_sync_fashion_mnist_mlp_reaches_80_percent_in_two_epochs(cluster):
    pytest.importorskip("nbdist.datasets").load_fashion_mnist()
    run = nbdist.train(FASHION_CELL, cluster=cluster, namespace={}, mode="sync", workers=2,
                       epochs=2, batch_size=64, wait=True)
    assert run.history["val_accuracy"].dropna().iloc[-1] >= 0.80
