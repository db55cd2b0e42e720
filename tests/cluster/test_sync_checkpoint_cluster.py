"""Checkpoint and resume of --mode sync runs on real engines with real Horovod (Gloo): a stop
and resume, and a rank's engine killed mid-run on a separate cluster: the ranks left finish."""

import json
import os
import signal
import time

import numpy as np
import pytest

import nbdist
from nbdist.errors import CheckpointError, ConfigError, WorkersLostError
from tests.helpers import SYNTHETIC_CELL, outlives, wait_ended, wait_for, wait_paused

pytest.importorskip("horovod.tensorflow", reason="Horovod is built by `make horovod`")
pytestmark = pytest.mark.horovod

# momentum: the Keras optimizer keeps one slot per weight, which the checkpoint must carry;
# seeded: the same initial weights in every run
MOMENTUM_CELL = SYNTHETIC_CELL.replace("SGD(0.1)", "SGD(0.05, momentum=0.9)").replace(
    "model = keras", "keras.utils.set_random_seed(3)\nmodel = keras")
OPTIONS = dict(mode="sync", workers=2, batch_size=8, seed=4)
TOLERANCE = 0.05  # test accuracy of a resumed run vs an uninterrupted one


def meta(path):
    return json.loads((path / "meta.json").read_text())


def weights(ns):
    return np.concatenate([v.numpy().ravel() for v in ns["model"].trainable_variables])


def accuracy(ns):
    return ns["model"].evaluate(ns["x_test"], ns["y_test"], verbose=0)[1]


def test_sync_stop_then_resume_ends_with_exactly_the_weights_of_an_uninterrupted_run(cluster,
                                                                                     tmp_path):
    """Two ranks sum gradients in either order to the same floats, and a resume starts at a
    whole global batch with the momentum restored: the run continues bit for bit."""
    straight = {}
    nbdist.train(MOMENTUM_CELL, cluster=cluster, namespace=straight, epochs=4, wait=True, **OPTIONS)

    run = nbdist.train(MOMENTUM_CELL, cluster=cluster, namespace={}, epochs=4,
                       checkpoint_dir=str(tmp_path), pause_at=150, **OPTIONS)
    wait_paused(run).stop()  # held at 75 steps of two ranks (1.3 epochs), then stopped
    run.wait(timeout=60)
    saved = meta(tmp_path)  # the final checkpoint, taken where rank 0 stopped
    done = saved["schedule"]["done"]
    assert run.status == "stopped" and saved["config"]["mode"] == "sync"
    assert 900 <= done < 4 * 900 and done % 900 % 16 == 0  # whole global batches of 2 x 8
    steps = done // 900 * 57 + done % 900 // 16  # 57 = ceil(900 / 16) steps per epoch
    assert (saved["sync"]["optimizer"] == "SGD"
            and saved["sync"]["iterations"] == saved["sync"]["steps"] == steps)
    assert saved["sync"]["slots"] == saved["layout"]["trainable"]  # one momentum per weight
    from nbdist.checkpoint.store import load

    assert np.abs(load(tmp_path).arrays["shard0.optimizer_slots"]).max() > 0

    resumed = {}
    # (both ranks used to be written off by the hub, once in four CI runs, when they were silent
    # together for 30 s while rank 0 evaluated: a sync rank's silence is no loss any more,
    # see Plan.silence_is_loss and tests/unit/test_modes.py)
    # the folder given again: a resume writes only into a folder it is given
    again = nbdist.resume(tmp_path, MOMENTUM_CELL, cluster=cluster, namespace=resumed, wait=True,
                          checkpoint_dir=str(tmp_path))
    assert again.status == "finished" and again.config.mode.value == "sync"
    assert again.nodes["samples"].sum() == 4 * 900 - done  # nothing skipped, nothing twice
    results = again.worker_results
    np.testing.assert_array_equal(results[0]["params"], results[1]["params"])
    assert meta(tmp_path)["epochs_done"] == 4
    acc_straight, acc_resumed = accuracy(straight), accuracy(resumed)
    assert acc_straight > 0.9 and abs(acc_resumed - acc_straight) <= TOLERANCE, (
        acc_resumed, acc_straight)
    np.testing.assert_array_equal(weights(resumed), weights(straight))
    print(f"stopped at {done / 900:.2f} epochs; accuracy uninterrupted {acc_straight:.4f}, "
          f"resumed {acc_resumed:.4f}")


# the cell's fit call; its callback kills rank 1's engine (VICTIM) at the end of the second
# epoch, while both ranks wait at the epoch's gate (on the hub, in no collective)
GATE_KILL_CELL = SYNTHETIC_CELL + """
class Kill(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if epoch == 1:
            import os, signal
            os.kill(VICTIM, signal.SIGKILL)
history = model.fit(x_train, y_train, epochs=5, batch_size=16, callbacks=[Kill()],
                    validation_data=(x_test, y_test))
"""


@pytest.mark.slow
def test_a_rank_lost_at_a_fit_calls_epoch_gate_leaves_the_rank_left_to_finish_the_fit(cluster):
    """Rank 1's engine killed while both ranks wait at the second epoch's gate: the hub counts
    it out and tells rank 0, which leaves the gate with its state; it starts again alone at the
    third epoch, and the fit call ends its five epochs with every epoch's logs."""
    import contextlib
    import io

    from nbdist.cluster.engines import Cluster

    own = Cluster.start(3)  # killed into: never the shared session cluster
    try:
        rank1 = list(own.engine_ids)[1]  # the ranks take the first engines, in order
        ns = {"VICTIM": own.client[rank1].apply_sync(os.getpid)}
        with contextlib.redirect_stdout(io.StringIO()):
            run = nbdist.train(GATE_KILL_CELL, cluster=own, namespace=ns, mode="sync",
                               workers=2, seed=4, timeout=20)
        assert run.status == "finished", run.error
        row = run.events[run.events["event"] == "ranks_restarted"].iloc[0]
        assert (row["lost_ranks"], row["ranks"], row["batch_size"], row["epoch"],
                row["offset"]) == ([1], 1, 16, 2, 0)
        logs = ns["history"].history
        assert len(logs["loss"]) == len(logs["val_accuracy"]) == 5
        assert logs["val_accuracy"][-1] > 0.9, logs
    finally:
        own.stop()


def test_a_sync_checkpoint_is_refused_as_async_and_with_another_optimizer(cluster, tmp_path):
    nbdist.train(SYNTHETIC_CELL, cluster=cluster, namespace={}, epochs=1,
                 checkpoint_dir=str(tmp_path), wait=True, **OPTIONS)
    with pytest.raises(ConfigError,
                       match="--mode is async here but the checkpoint was taken with sync"):
        nbdist.resume(tmp_path, SYNTHETIC_CELL, cluster=cluster, namespace={}, mode="async")
    adam = SYNTHETIC_CELL.replace("keras.optimizers.SGD(0.1)", "keras.optimizers.Adam()")
    with pytest.raises(CheckpointError,
                       match="SGD optimizer; this cell compiles its model with Adam"):
        nbdist.resume(tmp_path, adam, cluster=cluster, namespace={}, epochs=2)
    async_dir = tmp_path / "async"
    nbdist.train(SYNTHETIC_CELL, cluster=cluster, namespace={}, workers=2, epochs=1,
                 checkpoint_dir=str(async_dir), wait=True)
    with pytest.raises(ConfigError,
                       match="--mode is sync here but the checkpoint was taken with async"):
        nbdist.resume(async_dir, SYNTHETIC_CELL, cluster=cluster, namespace={}, mode="sync")
    again = nbdist.train(SYNTHETIC_CELL, cluster=cluster, namespace={}, epochs=1, wait=True,
                         **OPTIONS)
    assert again.status == "finished"  # the refusals left the engines free


@pytest.mark.slow
@pytest.mark.parametrize("collective", ["horovod", "torch"])
def test_a_killed_rank_s_engine_leaves_the_ranks_left_to_finish_the_run(cluster, tmp_path,
                                                                         collective):
    """Rank 0's engine killed mid-run (the state's source, worker 0's engine): rank 1 starts
    again alone, as rank 0, from the last step both applied, with the global batch of 2 x 8
    (under --dbs too), and trains every epoch to the accuracy of an undisturbed run; its
    checkpoints go on. With no rank left, the run fails saying so."""
    if collective == "torch":
        pytest.importorskip("torch", reason="--collective torch needs PyTorch")
    from nbdist.cluster.engines import Cluster

    # torch with --dbs: the hub's batches, by worker id, reach the rank left in rank order
    options = dict(OPTIONS, collective=collective, dbs=collective == "torch")
    straight = {}
    nbdist.train(SYNTHETIC_CELL, cluster=cluster, namespace=straight, epochs=8, wait=True,
                 **options)
    own = Cluster.start(3)  # killed into: never the shared session cluster
    try:
        pids = dict(zip(own.client.ids, own.client[:].apply_sync(os.getpid), strict=True))
        # held at 65 steps of two ranks (1.14 epochs) until the kill: mid-run for sure
        survived = {}
        run = nbdist.train(SYNTHETIC_CELL, cluster=own, namespace=survived, epochs=8, timeout=20,
                           checkpoint_dir=str(tmp_path), checkpoint_every=0.5, pause_at=130,
                           **options)
        wait_paused(run)
        engines = list(run.state.backend.worker_engines)
        os.kill(pids[engines[0]], signal.SIGKILL)  # rank 0, paused: in its control allreduce
        killed = time.monotonic()
        wait_for(lambda: run.state.recoveries or run.done(), 60, what="the ranks' restart")
        recovery_s = time.monotonic() - killed
        run.resume()
        wait_ended(run, 180)
        assert run.status == "finished", run.error
        row = run.events[run.events["event"] == "ranks_restarted"].iloc[0]
        assert (row["lost_ranks"], row["engines"], row["ranks"], row["batch_size"],
                row["steps_lost"], row["from_worker"]) == ([0], [engines[0]], 1, 16, 0, 1)
        assert any("the 1 rank(s) left started again" in w for w in run.warnings)
        # every sample once: the restart starts where both ranks had applied (at most one step
        # of rank 1's share over, had rank 1 applied one more step than rank 0)
        assert abs(run.nodes["samples"].sum() - 8 * 900) <= 8
        assert list(run.worker_results) == [1] and run.worker_results[1]["rank"] == 0
        assert meta(tmp_path)["epochs_done"] == 8  # the new rank 0 sent the final checkpoint
        acc, acc_straight = accuracy(survived), accuracy(straight)
        assert acc_straight > 0.9 and abs(acc - acc_straight) <= 0.03, (acc, acc_straight)
        print(f"{collective}: rank 0 killed at step {row['step']}; the rank left went on after "
              f"{recovery_s:.1f} s from the kill; accuracy {acc:.4f} (undisturbed "
              f"{acc_straight:.4f})")
        if collective == "torch":
            return
        alone = nbdist.train(SYNTHETIC_CELL, cluster=own, namespace={}, epochs=8, timeout=20,
                             pause_at=60, **dict(options, workers=1))
        wait_paused(alone)
        victim = pids[alone.state.backend.worker_engines[0]]
        os.kill(victim, signal.SIGKILL)
        with pytest.raises(WorkersLostError,
                           match=r"(?s)Rank 0's engine \(\d\) died during a --mode sync run, "
                                 r"and no rank is left, so the run failed.*The engine processes "
                                 r"this kernel started: LocalEngineLauncher \d \(pid \d+\) has "
                                 r"exited"):
            alone.wait(timeout=120)
        assert not outlives(victim)
    finally:
        own.stop()
