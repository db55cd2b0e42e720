"""--mode local: the real hub and worker loop as threads in this process (no cluster)."""

import numpy as np
import pytest

import nbdist
from nbdist.errors import NoClusterError, TrainingError
from tests.helpers import SYNTHETIC_CELL, event_names, global_step, wait_paused


@pytest.mark.slow  # three epochs
def test_local_run_trains_and_writes_weights_into_the_callers_model():
    ns = {}
    run = nbdist.train(SYNTHETIC_CELL, namespace=ns, mode="local", epochs=3, batch_size=32,
                       wait=True)
    assert run.status == "finished" and run.error is None
    history = run.history
    assert history["val_accuracy"].dropna().iloc[-1] > 0.9
    assert len(history["val_accuracy"].dropna()) == 3  # one validation per epoch
    assert history["loss"].dropna().iloc[-20:].mean() < history["loss"].dropna().iloc[:20].mean()
    assert ns["model"].evaluate(ns["x_test"], ns["y_test"], verbose=0)[1] > 0.9
    assert run.nodes.loc[0, "samples"] == 3 * 900  # every training sample once per epoch
    assert run.worker_results == {0: {"worker": 0, "steps": 3 * 29, "keras_backend": "tensorflow",
                                  "shard_passes": None}}


def test_two_shards_give_the_same_weights_as_one():
    """Sharding only splits the vector: a single deterministic worker must end identically."""
    results = []
    for servers in (1, 2):
        ns = {}
        cell = (SYNTHETIC_CELL + "\nkeras.utils.set_random_seed(7)\n"
                + SYNTHETIC_CELL.split("import keras")[1]
                                .split("model.compile")[0].split("\n", 2)[2]
                + "\nmodel.compile(optimizer=keras.optimizers.SGD(0.1), "
                  "loss='sparse_categorical_crossentropy')\n")
        nbdist.train(cell, namespace=ns, mode="local", servers=servers, epochs=1, wait=True)
        results.append(np.concatenate([v.numpy().ravel() for v in ns["model"].trainable_variables]))
    np.testing.assert_array_equal(results[0], results[1])


def test_a_local_run_listens_on_loopback_only():
    """docs/security.md: nothing of a --mode local run leaves this host (so --encrypt has
    nothing to encrypt there)."""
    run = nbdist.train(SYNTHETIC_CELL, namespace={}, mode="local", servers=2, epochs=1, wait=True)
    endpoints = [line.endpoint for line in run.state.control.lines]  # the hub shards' sockets
    assert len(endpoints) == 2 and all(ep["tcp"].startswith("tcp://127.0.0.1:") for ep in endpoints)
    assert all(ep["ipc"].startswith("ipc://") for ep in endpoints)


def test_a_local_run_needs_no_cluster_so_its_cell_runs():
    """(async and sync refuse before the cell runs: tests/unit/test_modes.py)"""
    with pytest.raises(RuntimeError, match="the cell ran"):
        nbdist.train("raise RuntimeError('the cell ran')", mode="local")


def test_async_without_a_cluster_says_how_to_start_one():
    with pytest.raises(NoClusterError, match="%nbdist start"):
        nbdist.train(SYNTHETIC_CELL, namespace={}, mode="async")


def test_diverging_training_stops_naming_the_step():
    with pytest.raises(TrainingError, match=r"(loss|gradient norm) became (nan|inf) at step \d+"):
        nbdist.train(SYNTHETIC_CELL, namespace={}, mode="local", epochs=3, lr=1e30, wait=True)


def test_nan_in_the_data_is_refused_before_training():
    from nbdist.errors import DataError

    cell = SYNTHETIC_CELL + "\nx_train[5:50] = float('nan')\n"
    with pytest.raises(DataError, match="x_train contains NaN or inf in 45 sample.*index 5"):
        nbdist.train(cell, namespace={}, mode="local", epochs=1)


@pytest.mark.slow  # a run, then every figure into one HTML file
def test_report_is_one_offline_html_file_with_every_panel(tmp_path):
    run = nbdist.train(SYNTHETIC_CELL, namespace={}, mode="local", epochs=2, batch_size=32,
                       wait=True)
    path = run.report(tmp_path / "out" / "run.html")
    html = path.read_text()
    assert html.count('id="nbdist-') == 7  # throughput, delay, histogram, batch, loss, hosts, table
    assert run.run_id in html and "worker 0" in html
    assert 'id="nbdist-hosts"' in html and "w0 shm" in html  # one worker beside its hub shard


def test_leaving_a_with_block_on_an_error_stops_the_run():
    run = nbdist.train(SYNTHETIC_CELL, namespace={}, mode="local", pause_at=0)  # cannot end alone
    with pytest.raises(KeyboardInterrupt), run:
        raise KeyboardInterrupt  # e.g. Ctrl-C while a script waits
    assert run.done() and run.status == "stopped"


def test_pause_at_holds_the_run_at_that_step_until_it_is_resumed():
    """--pause-at 10 with one worker: the reply to its tenth push pauses it, so exactly ten
    steps are trained however fast the machine is; resume() trains the rest of the epoch."""
    run = wait_paused(nbdist.train(SYNTHETIC_CELL, namespace={}, mode="local", batch_size=32,
                                   pause_at=10, no_validation=True))
    assert global_step(run) == 10 and run.nodes.loc[0, "samples"] == 10 * 32
    events = run.events
    assert events["event"].tolist() == ["note", "pause"]  # the note names the Keras backend
    assert events.loc[events["event"] == "pause", "reason"].tolist() == ["--pause-at"]
    run.resume()
    run.wait(timeout=120)
    assert run.status == "finished" and run.nodes.loc[0, "samples"] == 900
    assert event_names(run) == ["note", "pause", "resume", "epoch_end"]


SCHEDULED_CELL = SYNTHETIC_CELL.replace(
    "keras.optimizers.SGD(0.1)",
    "keras.optimizers.Adam(keras.optimizers.schedules.CosineDecay(0.01, decay_steps=1000))")


@pytest.mark.parametrize("local_steps", [1, 2])
def test_set_lr_over_a_schedule_replaces_it_and_says_so(local_steps):
    """On the hub (local_steps 1) and on the workers' own optimizer (local_steps 2)."""
    run = wait_paused(nbdist.train(SCHEDULED_CELL, namespace={}, mode="local", batch_size=8,
                                   local_steps=local_steps, pause_at=5))
    assert len(run.history) == 5
    if local_steps == 1:
        assert 0.0 < run.lr <= 0.01  # the schedule's value at the hub's step
    run.set_lr(0.0123)
    run.set_lr(0.0124)  # said once
    run.stop()
    run.wait()
    assert run.error is None
    (warning,) = run.warnings
    assert warning.startswith("The run replaced the cell's CosineDecay schedule: "
                              "run.set_lr(0.0123)")
    assert run.lr == pytest.approx(0.0124)


def test_overlap_over_tcp_ends_at_the_same_weights_by_courier_or_not(monkeypatch):
    """Over TCP an overlapped exchange may go on the courier's thread (nbdist.modes.async_ps.
    courier) or the worker's, step by step: one deterministic worker must end at the same
    weights whichever way each exchange went."""
    from nbdist.modes.common.courier import Courier, WayChooser

    taken = []
    alternate = iter(range(10**6))
    ways = {"always": lambda self, now: True,
            "alternating": lambda self, now: next(alternate) % 2 == 0}
    finals, current = {}, {}
    sends = Courier.send
    monkeypatch.setattr(Courier, "send",
                        lambda self, *a: (taken.append(current["way"]), sends(self, *a)))
    for way in ("always", "alternating", "off"):
        current["way"] = way
        monkeypatch.setenv("NBDIST_COURIER", "0" if way == "off" else "1")
        if way != "off":
            monkeypatch.setattr(WayChooser, "next", ways[way])
        ns = {}
        cell = SYNTHETIC_CELL.replace("import keras\n",
                                      "import keras\nkeras.utils.set_random_seed(3)\n")
        run = nbdist.train(cell, namespace=ns, mode="local", overlap=True, transport="tcp",
                           epochs=1, batch_size=32, no_validation=True, wait=True)
        assert run.status == "finished" and run.error is None
        finals[way] = np.concatenate([v.numpy().ravel() for v in ns["model"].trainable_variables])
    steps = 900 // 32 + 1
    assert taken.count("always") == steps and taken.count("off") == 0
    assert abs(taken.count("alternating") - steps / 2) <= 1
    np.testing.assert_array_equal(finals["always"], finals["off"])
    np.testing.assert_array_equal(finals["alternating"], finals["off"])


@pytest.mark.parametrize("algorithm", ["asgd", "dc-asgd"])
def test_overlap_counts_its_extra_step_of_delay_and_still_trains(algorithm):
    """One worker with --overlap pushes step t while computing t+1: each gradient after the
    first was computed one update before the weights the hub holds, so its delay is 1 (it was
    counted as 0 when the hub took the last reply's read for the gradient's)."""
    run = nbdist.train(SYNTHETIC_CELL, namespace={}, mode="local", overlap=True,
                       algorithm=algorithm, epochs=2, batch_size=32, wait=True)
    assert run.status == "finished" and run.error is None
    delays = run.history["delay"].dropna().to_numpy()
    assert len(delays) > 50 and (delays[1:] == 1).mean() > 0.9 and delays.max() <= 1
    assert run.history["val_accuracy"].dropna().iloc[-1] > 0.85
