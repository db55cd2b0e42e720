"""Checkpoint and resume with real runs: in this kernel (--mode local), and on real engines
where the hub's engine process is killed mid-run."""

import json
import os
import signal
import time

import numpy as np
import pytest

import nbdist
from nbdist.errors import CheckpointError, CheckpointNotFoundError, ConfigError, TrainingError
from tests.conftest import SYNTHETIC_CELL, _alive
from tests.helpers import wait_for

SEEDED_CELL = SYNTHETIC_CELL.replace("model = keras", "keras.utils.set_random_seed(3)\nmodel = keras")


def weights(ns):
    return np.concatenate([v.numpy().ravel() for v in ns["model"].trainable_variables])




def epoch_ends(run):
    events = run.events
    return sorted(events.loc[events["event"] == "epoch_end", "epoch"]) if "event" in events else []


@pytest.mark.slow
def test_stop_and_resume_ends_with_exactly_the_weights_of_an_uninterrupted_run(tmp_path):
    """One worker is deterministic: a resume that restores weights, DDC-ASGD's momentum and
    running mean, the version and the data position must continue bit for bit."""
    options = dict(mode="local", epochs=2, batch_size=8, algorithm="ddc-asgd", slowdown=[5])
    straight = {}
    nbdist.train(SEEDED_CELL, namespace=straight, wait=True, **options)
    first = {}
    run = nbdist.train(SEEDED_CELL, namespace=first, checkpoint_dir=str(tmp_path), **options)
    wait_for(lambda: run.nodes["samples"].sum() >= 300)  # a third into the first epoch
    run.stop()
    run.wait()
    meta = json.loads((tmp_path / "meta.json").read_text())
    done = meta["schedule"]["done"]
    assert run.status == "stopped" and run.last_checkpoint == str(tmp_path / "meta.json")
    assert 300 <= done < 900 and meta["shards"][0]["version"] > 0
    resumed = {}
    again = nbdist.resume(tmp_path, SEEDED_CELL, namespace=resumed, wait=True)
    assert again.status == "finished"
    assert again.nodes["samples"].sum() == 2 * 900 - done  # nothing trained twice, nothing skipped
    assert epoch_ends(again) == [0, 1]
    np.testing.assert_array_equal(weights(resumed), weights(straight))


@pytest.mark.slow
def test_periodic_checkpoints_are_taken_during_the_run_and_one_remains(tmp_path):
    run = nbdist.train(SYNTHETIC_CELL, namespace={}, mode="local", epochs=4, batch_size=8,
                       checkpoint_dir=str(tmp_path), checkpoint_every=0.5)
    wait_for(lambda: run.last_checkpoint is not None or run.done)
    assert not run.done  # the first checkpoint came from the timer, not the end of the run
    mid = json.loads((tmp_path / "meta.json").read_text())
    assert mid["epochs_done"] < 4
    path = run.checkpoint(str(tmp_path / "by-hand"))
    assert path == str(tmp_path / "by-hand" / "meta.json")
    run.wait()
    final = json.loads((tmp_path / "meta.json").read_text())
    assert final["epochs_done"] == 4 and final["created"] > mid["created"]
    before = json.loads((tmp_path / "meta.1.json").read_text())  # KEEP=2: the one before stays
    assert before["created"] < final["created"]
    assert sorted(p for p in os.listdir(tmp_path) if p.endswith(".npz")) == sorted(
        {final["arrays_file"], before["arrays_file"]})
    with pytest.raises(TrainingError, match="nothing to checkpoint"):
        run.checkpoint()
    with pytest.raises(ConfigError, match="epochs 2 is fewer"):
        nbdist.resume(tmp_path, SYNTHETIC_CELL, namespace={}, epochs=2)
    longer = nbdist.resume(tmp_path, trust_cell=True, namespace={}, epochs=5, wait=True)  # train one epoch more
    assert longer.nodes["samples"].sum() == 900 and epoch_ends(longer) == [4]


@pytest.mark.slow
def test_checkpoint_without_a_folder_says_how_to_give_one():
    with nbdist.train(SYNTHETIC_CELL, namespace={}, mode="local", epochs=50) as run:
        with pytest.raises(ConfigError, match="No checkpoint folder.*--checkpoint-dir"):
            run.checkpoint()
        run.stop()


# -- on engines -----------------------------------------------------------------------------------

CLUSTER_OPTIONS = dict(workers=2, epochs=6, batch_size=8, seed=5, lr=0.05)


@pytest.mark.cluster
@pytest.mark.slow
def test_killing_the_hub_engine_then_resuming_reaches_the_accuracy_of_an_uninterrupted_run(cluster, tmp_path):
    from nbdist.cluster.engines import Cluster

    straight = {}
    nbdist.train(SYNTHETIC_CELL, cluster=cluster, namespace=straight, wait=True, **CLUSTER_OPTIONS)
    acc_straight = straight["model"].evaluate(straight["x_test"], straight["y_test"], verbose=0)[1]

    own = Cluster.start(3)  # killed into: never the shared session cluster
    try:
        run = nbdist.train(SYNTHETIC_CELL, cluster=own, namespace={}, checkpoint_dir=str(tmp_path),
                           checkpoint_every=0.5, timeout=10, **CLUSTER_OPTIONS)
        hub_engine = run._backend.roles.servers[0]  # noqa: SLF001
        hub_pid = own.client[hub_engine].apply_sync(os.getpid)
        # mid-run for sure: on a quiet machine the remaining epochs take about a second, so
        # pause after two epochs and checkpoint there, then kill the hub
        wait_for(lambda: run.last_checkpoint is not None
                 and json.loads((tmp_path / "meta.json").read_text())["epochs_done"] >= 2)
        run.pause()
        run.checkpoint()
        os.kill(hub_pid, signal.SIGKILL)
        started = time.monotonic()
        with pytest.raises(TrainingError):
            run.wait(timeout=180)
        failed_after = time.monotonic() - started
        assert not _alive(hub_pid)
    finally:
        own.stop()
    meta = json.loads((tmp_path / "meta.json").read_text())
    done, total = meta["schedule"]["done"], 6 * 900
    assert 2 * 900 <= done < total, "the kill must land mid-run, after a checkpoint"

    resumed = {}
    again = nbdist.resume(tmp_path, SYNTHETIC_CELL, cluster=cluster, namespace=resumed, wait=True)
    acc_resumed = resumed["model"].evaluate(resumed["x_test"], resumed["y_test"], verbose=0)[1]
    assert again.nodes["samples"].sum() == total - done  # finished epochs are not trained again
    assert epoch_ends(again) == [e for e in range(6) if meta["schedule"]["remaining"][e] > 0]
    assert acc_straight > 0.9 and abs(acc_resumed - acc_straight) <= 0.05, (acc_resumed, acc_straight)
    print(f"hub killed at {done / 900:.2f} epochs; run failed {failed_after:.1f}s later; "
          f"accuracy uninterrupted {acc_straight:.4f}, resumed {acc_resumed:.4f}")


@pytest.mark.cluster
def test_resume_from_a_path_that_does_not_exist_leaves_the_engines_free(cluster, ip, tmp_path):
    ip.magics_manager.registry["NbdistMagics"].cluster = cluster
    with pytest.raises(CheckpointNotFoundError, match="No checkpoint at"):
        ip.run_cell_magic("distribute", f"--resume {tmp_path / 'missing'} --wait", SYNTHETIC_CELL)
    ip.run_cell_magic("distribute", "--workers 2 --wait -o after", SYNTHETIC_CELL)
    assert ip.user_ns["after"].status == "finished"


@pytest.mark.cluster
def test_resume_from_a_corrupt_checkpoint_is_refused_and_leaves_the_engines_free(cluster, ip, tmp_path):
    ip.magics_manager.registry["NbdistMagics"].cluster = cluster
    ip.run_cell_magic("distribute", f"--workers 2 --checkpoint-dir {tmp_path} --wait -o first", SYNTHETIC_CELL)
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert meta["epochs_done"] == 1 and meta["config"]["checkpoint_dir"] == str(tmp_path)
    arrays = tmp_path / meta["arrays_file"]
    data = arrays.read_bytes()
    arrays.write_bytes(data[: len(data) - 100])  # truncated
    with pytest.raises(CheckpointError, match="corrupt.*SHA-256"):
        ip.run_cell_magic("distribute", f"--resume {tmp_path} --epochs 2 --wait", SYNTHETIC_CELL)
    ip.run_cell_magic("distribute", "--workers 2 --wait -o after", SYNTHETIC_CELL)
    assert ip.user_ns["after"].status == "finished"


@pytest.mark.cluster
def test_magic_resume_trains_the_remaining_epochs(cluster, ip, tmp_path):
    ip.magics_manager.registry["NbdistMagics"].cluster = cluster
    ip.run_cell_magic("distribute", f"--workers 2 --checkpoint-dir {tmp_path} --wait", SYNTHETIC_CELL)
    ip.run_cell_magic("distribute", f"--resume {tmp_path} --epochs 3 --wait -o more", SYNTHETIC_CELL)
    more = ip.user_ns["more"]
    assert more.config.workers == 2 and more.config.epochs == 3  # saved options, one overridden
    assert more.nodes["samples"].sum() == 2 * 900 and epoch_ends(more) == [1, 2]
    assert json.loads((tmp_path / "meta.json").read_text())["epochs_done"] == 3
