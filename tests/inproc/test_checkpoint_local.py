"""Checkpoint and resume of real runs in this kernel (--mode local): bit-for-bit resume,
periodic checkpoints, and what a run without a checkpoint folder says."""

import json
import os

import numpy as np
import pytest

import nbdist
from nbdist.errors import ConfigError, TrainingError
from tests.helpers import SYNTHETIC_CELL, epoch_ends, wait_for, wait_paused

SEEDED_CELL = SYNTHETIC_CELL.replace("model = keras",
                                     "keras.utils.set_random_seed(3)\nmodel = keras")


def weights(ns):
    return np.concatenate([v.numpy().ravel() for v in ns["model"].trainable_variables])


@pytest.mark.slow
def test_stop_and_resume_ends_with_exactly_the_weights_of_an_uninterrupted_run(tmp_path):
    """One worker is deterministic: a resume that restores weights, DDC-ASGD's momentum and
    running mean, the version and the data position must continue bit for bit."""
    options = dict(mode="local", epochs=2, batch_size=8, algorithm="ddc-asgd")
    straight = {}
    nbdist.train(SEEDED_CELL, namespace=straight, wait=True, **options)
    first = {}
    run = nbdist.train(SEEDED_CELL, namespace=first, checkpoint_dir=str(tmp_path), pause_at=20,
                       **options)
    wait_paused(run).stop()  # at step 20 of the first epoch's 113, whatever the machine's speed
    run.wait()
    meta = json.loads((tmp_path / "meta.json").read_text())
    done = meta["schedule"]["done"]
    assert run.status == "stopped" and run.last_checkpoint == str(tmp_path / "meta.json")
    assert done == 20 * 8 and meta["shards"][0]["version"] == 20
    resumed = {}
    again = nbdist.resume(tmp_path, SEEDED_CELL, namespace=resumed, wait=True)
    assert again.status == "finished" and again.config.pause_at is None  # not the first's pause
    assert again.nodes["samples"].sum() == 2 * 900 - done  # nothing trained twice, nothing skipped
    assert epoch_ends(again) == [0, 1]
    np.testing.assert_array_equal(weights(resumed), weights(straight))


@pytest.mark.slow
def test_periodic_checkpoints_are_taken_during_the_run_and_one_remains(tmp_path):
    run = nbdist.train(SYNTHETIC_CELL, namespace={}, mode="local", epochs=4, batch_size=8,
                       checkpoint_dir=str(tmp_path), checkpoint_every=0.5, pause_at=20)
    wait_paused(run)  # held at step 20: it cannot end, and the resume below finds it paused
    wait_for(lambda: run.last_checkpoint is not None, what="a checkpoint")  # from the timer
    assert not run.done()  # the first checkpoint came from the timer, not the end of the run
    mid = json.loads((tmp_path / "meta.json").read_text())
    assert mid["epochs_done"] < 4
    path = run.checkpoint(str(tmp_path / "by-hand"))
    assert path == str(tmp_path / "by-hand" / "meta.json")
    run.resume()
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
    # train one epoch more
    longer = nbdist.resume(tmp_path, trust_cell=True, namespace={}, epochs=5, wait=True)
    assert longer.nodes["samples"].sum() == 900 and epoch_ends(longer) == [4]


@pytest.mark.slow
def test_checkpoint_without_a_folder_says_how_to_give_one():
    with nbdist.train(SYNTHETIC_CELL, namespace={}, mode="local", pause_at=0) as run:
        with pytest.raises(ConfigError, match="No checkpoint folder.*--checkpoint-dir"):
            run.checkpoint()
        run.stop()


def test_a_second_run_given_a_folder_in_use_is_refused_and_nothing_there_is_deleted(tmp_path):
    """Two runs saving into one folder would delete each other's array files: the second is
    refused before it starts, the first's checkpoints stay whole, and once the first has ended
    the folder takes the next run."""
    from nbdist.checkpoint.store import load
    from nbdist.errors import CheckpointError

    folder = str(tmp_path)
    first = nbdist.train(SYNTHETIC_CELL, namespace={}, mode="local", pause_at=0,
                         checkpoint_dir=folder)
    with first:  # paused from the start: it holds the folder while it waits
        first.checkpoint()
        files = {name: (tmp_path / name).read_bytes() for name in os.listdir(tmp_path)}
        in_use = rf"folder {tmp_path} is in use by run {first.run_id}"
        with pytest.raises(CheckpointError, match=in_use):
            nbdist.train(SYNTHETIC_CELL, namespace={}, mode="local", checkpoint_dir=folder)
        other = nbdist.train(SYNTHETIC_CELL, namespace={}, mode="local", pause_at=0)
        with other:
            with pytest.raises(CheckpointError, match=f"in use by run {first.run_id}"):
                other.checkpoint(folder)  # nor may another run save into it by hand
            other.stop()
        assert {name: (tmp_path / name).read_bytes() for name in os.listdir(tmp_path)} == files
        assert load(folder).meta["run_id"] == first.run_id
        first.stop()
    assert first.status == "stopped"
    again = nbdist.train(SYNTHETIC_CELL, namespace={}, mode="local", epochs=1,
                         checkpoint_dir=folder, wait=True)
    assert again.status == "finished" and load(folder).meta["run_id"] == again.run_id


def _listing(folder) -> dict:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.mark.slow
def test_a_resume_writes_into_the_folder_it_is_given_never_into_the_checkpoints_own(tmp_path):
    """A checkpoint read from someone's folder (shared, or another run's) names that folder in
    its options: a resume that adopted it would rotate and delete files there (issue 36)."""
    shared, mine = tmp_path / "shared", tmp_path / "mine"
    options = dict(mode="local", batch_size=8)
    first = nbdist.train(SYNTHETIC_CELL, namespace={}, epochs=1, checkpoint_dir=str(shared),
                         wait=True, **options)
    assert first.last_checkpoint == str(shared / "meta.json")
    before = _listing(shared)
    again = nbdist.resume(shared, SYNTHETIC_CELL, namespace={}, epochs=2, wait=True)
    assert again.status == "finished" and epoch_ends(again) == [1]
    assert again.config.checkpoint_dir is None and again.last_checkpoint is None
    assert _listing(shared) == before  # nothing written, rotated or deleted there
    assert any("no --checkpoint-dir" in w and "no checkpoints" in w for w in again.warnings), \
        again.warnings
    into = nbdist.resume(shared, SYNTHETIC_CELL, namespace={}, epochs=2, checkpoint_dir=str(mine),
                         wait=True)
    assert into.last_checkpoint == str(mine / "meta.json")
    assert json.loads((mine / "meta.json").read_text())["epochs_done"] == 2
    assert _listing(shared) == before


@pytest.mark.slow
def test_a_run_of_many_epochs_keeps_its_state_and_stops_at_once(tmp_path):
    """`--epochs 100000` trains until Stop is clicked. The hub's state carries the data
    position, which once listed every epoch: 500 KB, over a header's 64 KiB, so the hub's
    reply was dropped and every epoch's end, checkpoint and stop waited 30 s for it."""
    run = nbdist.train(SYNTHETIC_CELL, mode="local", namespace={}, epochs=100_000, batch_size=8)
    try:
        wait_for(lambda: len(epoch_ends(run)) >= 1, what="the first epoch's end")
        wait_for(lambda: run.state.kept is not None and run.state.kept[2] is not None,
                 timeout=10, what="the hub's state kept at the first epoch's end")
        saved = run.checkpoint(str(tmp_path))
        with open(saved) as meta:
            assert json.load(meta)["schedule"]["epochs"] == 100_000
    finally:
        run.stop()
    assert run.state.ended.wait(15), "the run did not end within 15 s of its stop"
    assert run.status == "stopped"
