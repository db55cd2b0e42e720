"""Checkpoint and resume with real runs on engines: the hub's engine process killed mid-run,
and resumes refused or continued by the magic (runs in this kernel are in
tests/inproc/test_checkpoint_local.py)."""

import json
import os
import signal

import pytest

import nbdist
from nbdist.core.schedule import remaining_per_epoch
from nbdist.errors import CheckpointError, CheckpointNotFoundError, TrainingError
from tests.helpers import SYNTHETIC_CELL, epoch_ends, outlives, wait_paused

CLUSTER_OPTIONS = dict(workers=2, epochs=6, batch_size=8, seed=5, lr=0.05)


@pytest.mark.slow
def test_killing_the_hub_engine_then_resuming_reaches_the_accuracy_of_an_uninterrupted_run(
        cluster, tmp_path, monkeypatch):
    from nbdist.cluster.engines import Cluster

    monkeypatch.setenv("NBDIST_HUB_SNAPSHOT_S", "0")  # no takeover: the run must fail, to resume

    straight = {}
    nbdist.train(SYNTHETIC_CELL, cluster=cluster, namespace=straight, wait=True, **CLUSTER_OPTIONS)
    acc_straight = straight["model"].evaluate(straight["x_test"], straight["y_test"], verbose=0)[1]

    own = Cluster.start(3)  # killed into: never the shared session cluster
    try:
        # mid-run for sure: the run holds after two epochs (226 steps) until the hub is killed
        run = nbdist.train(SYNTHETIC_CELL, cluster=own, namespace={}, checkpoint_dir=str(tmp_path),
                           checkpoint_every=0.5, timeout=10, pause_at=230, **CLUSTER_OPTIONS)
        (hub_engine,) = [hub["engine"] for hub in run.hubs]
        hub_pid = own.client[hub_engine].apply_sync(os.getpid)
        wait_paused(run)
        run.checkpoint()
        os.kill(hub_pid, signal.SIGKILL)
        with pytest.raises(TrainingError):
            run.wait(timeout=180)
        assert not outlives(hub_pid)
    finally:
        own.stop()
    meta = json.loads((tmp_path / "meta.json").read_text())
    done, total = meta["schedule"]["done"], 6 * 900
    assert 2 * 900 <= done < total, "the kill must land mid-run, after a checkpoint"

    resumed = {}
    again = nbdist.resume(tmp_path, SYNTHETIC_CELL, cluster=cluster, namespace=resumed, wait=True)
    acc_resumed = resumed["model"].evaluate(resumed["x_test"], resumed["y_test"], verbose=0)[1]
    assert again.nodes["samples"].sum() == total - done  # finished epochs are not trained again
    left = remaining_per_epoch(meta["schedule"])
    assert epoch_ends(again) == [e for e in range(6) if left[e] > 0]
    assert acc_straight > 0.9 and abs(acc_resumed - acc_straight) <= 0.05, (
        acc_resumed, acc_straight)
    print(f"hub killed at {done / 900:.2f} epochs; accuracy uninterrupted {acc_straight:.4f}, "
          f"resumed {acc_resumed:.4f}")


def test_resume_from_a_path_that_does_not_exist_leaves_the_engines_free(cluster, ip, tmp_path):
    ip.magics_manager.registry["NbdistMagics"].cluster = cluster
    with pytest.raises(CheckpointNotFoundError, match="No checkpoint at"):
        ip.run_cell_magic("distribute", f"--resume {tmp_path / 'missing'} --wait", SYNTHETIC_CELL)
    ip.run_cell_magic("distribute", "--workers 2 --wait -o after", SYNTHETIC_CELL)
    assert ip.user_ns["after"].status == "finished"


def test_resume_from_a_corrupt_checkpoint_is_refused_and_leaves_the_engines_free(cluster, ip,
                                                                                 tmp_path):
    ip.magics_manager.registry["NbdistMagics"].cluster = cluster
    ip.run_cell_magic("distribute", f"--workers 2 --checkpoint-dir {tmp_path} --wait -o first",
                      SYNTHETIC_CELL)
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert meta["epochs_done"] == 1 and meta["config"]["checkpoint_dir"] == str(tmp_path)
    arrays = tmp_path / meta["arrays_file"]
    data = arrays.read_bytes()
    arrays.write_bytes(data[: len(data) - 100])  # truncated
    with pytest.raises(CheckpointError, match="corrupt.*SHA-256"):
        ip.run_cell_magic("distribute", f"--resume {tmp_path} --epochs 2 --wait", SYNTHETIC_CELL)
    ip.run_cell_magic("distribute", "--workers 2 --wait -o after", SYNTHETIC_CELL)
    assert ip.user_ns["after"].status == "finished"


def test_magic_resume_trains_the_remaining_epochs(cluster, ip, tmp_path):
    ip.magics_manager.registry["NbdistMagics"].cluster = cluster
    ip.run_cell_magic("distribute", f"--workers 2 --checkpoint-dir {tmp_path} --wait",
                      SYNTHETIC_CELL)
    # a resumed run checkpoints only into a folder given again (never the checkpoint's own)
    ip.run_cell_magic("distribute", f"--resume {tmp_path} --checkpoint-dir {tmp_path} --epochs 3 "
                      "--wait -o more", SYNTHETIC_CELL)
    more = ip.user_ns["more"]
    assert more.config.workers == 2 and more.config.epochs == 3  # saved options, one overridden
    assert more.nodes["samples"].sum() == 2 * 900 and epoch_ends(more) == [1, 2]
    assert json.loads((tmp_path / "meta.json").read_text())["epochs_done"] == 3
