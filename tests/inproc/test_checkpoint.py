"""Checkpoints without processes: data position, rule state, the file format and its checks."""

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest

from nbdist.algorithms.optimizers import server_optimizer_spec
from nbdist.checkpoint import store as checkpoint
from nbdist.config import TrainConfig
from nbdist.core.coordinator import Plan
from nbdist.core.schedule import EpochSchedule
from nbdist.core.shard import ShardCore
from nbdist.errors import CheckpointError, CheckpointNotFoundError, ConfigError
from nbdist.hub.export import restore_shard, shard_state
from nbdist.wire.messages import Hello, Step

LAYOUT = {"trainable": [[2, 3], [3]], "non_trainable": [[2]]}  # 9 parameters, 2 non-trainable


# -- data position ------------------------------------------------------------------------------


def test_chunks_in_flight_count_as_not_done_and_come_back_first():
    s = EpochSchedule(num_samples=10, epochs=2)
    _, b, _ = s.next_chunk(4), s.next_chunk(4), s.next_chunk(4)  # [0,4) [4,8) [8,10)
    s.complete(b.id)
    r = EpochSchedule.from_state(s.state())
    assert r.epochs_done == 0.4 and not r.finished
    handed = [r.next_chunk(4) for _ in range(5)]
    # a and c again
    assert [(h.epoch, h.start, h.stop) for h in handed[:2]] == [(0, 0, 4), (0, 8, 10)]
    assert [(h.epoch, h.start, h.stop) for h in handed[2:]] == [(1, 0, 4), (1, 4, 8), (1, 8, 10)]
    for h in handed:
        r.complete(h.id)
    assert r.finished and r.epochs_done == 2.0  # every sample of both epochs exactly once


def test_a_resumed_schedule_can_be_extended_but_not_shortened():
    s = EpochSchedule(num_samples=4, epochs=1)
    s.complete(s.next_chunk(4).id)
    assert s.finished
    longer = EpochSchedule.from_state(s.state(), epochs=3)
    assert not longer.finished and longer.next_chunk(4).epoch == 1
    with pytest.raises(ValueError, match="cannot shorten"):
        EpochSchedule.from_state(EpochSchedule(4, 2).state(), epochs=1)


def test_an_inconsistent_data_position_is_refused():
    state = EpochSchedule(num_samples=10, epochs=2).state()
    state["remaining"] = [5, 10]  # 5 samples done that no chunk accounts for
    with pytest.raises(ValueError, match="inconsistent"):
        EpochSchedule.from_state(state)
    state = EpochSchedule(num_samples=10, epochs=1).state()
    state["pending"] = [[0, 8, 12]]
    with pytest.raises(ValueError, match="outside the data"):
        EpochSchedule.from_state(state)


# -- a shard's state through save and load ------------------------------------------------------


def _hub(algorithm="ddc-asgd", optimizer="sgd", shard=0, size=9, seed=0):
    """A shard's core (the rule, with plain SGD at 0.1 or another server optimizer), as a hub
    holds it: checkpointing reads and writes it through `export` and `restore`."""
    rng = np.random.default_rng(seed)
    plan = Plan(num_workers=2, num_samples=10, epochs=2, batch_size=4, lr=0.1, has_validation=True,
                algorithm=algorithm)
    spec = server_optimizer_spec(optimizer, 0.1 if optimizer == "sgd" else None, [size])
    return ShardCore(plan, rng.normal(size=size).astype(np.float32), np.array([1, 2], np.float32),
                     now=lambda: 0.0, shard=shard, optimizer=spec,
                     rule_options={"n": 1} if algorithm == "softsync" else None)  # n=1: buffer 2


def _train(hub, pushes, seed):
    """Two workers as the hub sees them after (re)connecting: both pull, then each push is
    followed by that worker's pull, so every push is stale (compensation and momentum act)."""
    rng = np.random.default_rng(seed)
    for w in (0, 1):
        hub.updater.rule.on_pull(w, hub.params, hub.version)
    for i in range(pushes):
        w = i % 2
        g = rng.normal(size=hub.params.size).astype(np.float32)
        hub.updater.push(w, hub.params, g, 1 + i % 3)
        hub.version += 1
        hub.updater.rule.on_pull(w, hub.params, hub.version)


def _save(tmp_path, hubs, **info):
    info = {"run_id": "r1",
            "config": TrainConfig(algorithm=hubs[0].updater.rule.name, epochs=2).to_dict(),
            "cell": "x = 1", "layout": LAYOUT, "num_samples": 10, "num_workers": 2, **info}
    return checkpoint.save(str(tmp_path), [shard_state(h) for h in hubs], info)


@pytest.mark.parametrize("algorithm", ["ddc-asgd", "dc-asgd-a", "softsync", "async-local-sgd"])
def test_a_restored_rule_continues_exactly_like_the_uninterrupted_one(tmp_path, algorithm):
    straight, interrupted = _hub(algorithm), _hub(algorithm)
    _train(straight, 7, seed=1)
    _train(straight, 6, seed=2)
    _train(interrupted, 7, seed=1)
    path = _save(tmp_path, [interrupted])
    fresh = _hub(algorithm, seed=99)  # other starting weights: everything must come from the file
    ckpt = checkpoint.load(path)
    fresh.params[:] = ckpt.params
    restore_shard(fresh, ckpt.shard_restores()[0])
    assert fresh.version == 7
    _train(fresh, 6, seed=2)
    np.testing.assert_array_equal(fresh.params, straight.params)


def test_hub_optimizer_slots_and_step_are_saved(tmp_path):
    hub = _hub("asgd", optimizer="adam")
    _train(hub, 3, seed=1)
    ckpt = checkpoint.load(_save(tmp_path, [hub]))
    fresh = _hub("asgd", optimizer="adam")
    restore_shard(fresh, ckpt.shard_restores()[0])
    saved, restored = hub.updater.optimizer.export_state(), fresh.updater.optimizer.export_state()
    assert restored["iterations"] == 3 and saved.keys() == restored.keys()
    for name, value in saved.items():
        np.testing.assert_array_equal(restored[name], value)


def test_data_position_and_pending_evaluations_are_restored(tmp_path):
    hub = _hub("asgd")
    c = hub.coordinator
    c.hello(Hello(0, host="h", engine=1))
    c.hello(Hello(1, host="h", engine=2))
    c.work_for(0, True, 0)
    c.work_for(1, True, 0)
    c.push(Step(0, chunks=[c.assigned[0][0].id]), 0, 1.0)  # worker 1's chunk stays in flight
    c.eval_queue.append(0)
    ckpt = checkpoint.load(_save(tmp_path, [hub]))
    assert ckpt.meta["epochs_done"] == 0.4 and ckpt.meta["schedule"]["pending"] == [[0, 4, 8]]
    fresh = _hub("asgd")
    restore_shard(fresh, ckpt.shard_restores()[0])
    assert fresh.coordinator.schedule.next_chunk(4).to_list() == [0, 0, 4, 8]
    assert list(fresh.coordinator.eval_queue) == [0]


def test_two_shards_are_saved_side_by_side(tmp_path):
    hubs = [_hub("asgd", shard=0, size=5), _hub("asgd", shard=1, size=4, seed=1)]
    hubs[1].version = 3
    ckpt = checkpoint.load(_save(tmp_path, hubs))
    np.testing.assert_array_equal(ckpt.params, np.concatenate([hubs[0].params, hubs[1].params]))
    assert [r["version"] for r in ckpt.shard_restores()] == [0, 3]
    with pytest.raises(CheckpointError, match="2 parameter shard.*servers=2"):
        ckpt.check_fits(LAYOUT, 10, servers=1)


def test_the_last_two_checkpoints_are_kept_and_no_temporary_files(tmp_path):
    hub = _hub("asgd")
    saved = []
    for seed in (1, 2, 3):
        _train(hub, 2, seed=seed)
        assert _save(tmp_path, [hub]) == str(tmp_path / "meta.json")
        saved.append(hub.params.copy())
    files = sorted(os.listdir(tmp_path))
    assert len(files) == 4 and files[2:] == ["meta.1.json", "meta.json"]
    assert all(f.startswith("arrays-r1-") for f in files[:2])
    np.testing.assert_array_equal(checkpoint.load(tmp_path).params, saved[2])
    np.testing.assert_array_equal(checkpoint.load(tmp_path / "meta.1.json").params, saved[1])


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_weights_that_are_not_finite_are_refused_and_the_last_good_checkpoint_stays(tmp_path, bad):
    hub = _hub("asgd")
    _save(tmp_path, [hub])
    good = hub.params.copy()
    hub.params[3] = bad
    with pytest.raises(CheckpointError,
                       match=r"shard0.params hold NaN or infinite values.*last good "
                             r"checkpoint there is kept"):
        _save(tmp_path, [hub])
    np.testing.assert_array_equal(checkpoint.load(tmp_path).params, good)
    assert sorted(os.listdir(tmp_path))[-1] == "meta.json" and len(os.listdir(tmp_path)) == 2


def test_the_array_file_is_hashed_on_the_bytes_that_are_loaded(tmp_path, monkeypatch):
    """A file swapped after hashing cannot be loaded: load reads it once."""
    _save(tmp_path, [_hub("asgd")])
    opened = []
    real_open = open

    def counting_open(path, *args, **kwargs):
        if str(path).endswith(".npz"):
            opened.append(path)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", counting_open)
    checkpoint.load(tmp_path)
    assert len(opened) == 1


def test_a_failed_write_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    hub = _hub("asgd")
    _save(tmp_path, [hub])
    before = checkpoint.load(tmp_path).params.copy()
    hub.params += 1

    def crash(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(np, "savez", crash)
    with pytest.raises(OSError, match="No space"):
        _save(tmp_path, [hub])
    assert len(os.listdir(tmp_path)) == 2  # the temporary file was removed
    np.testing.assert_array_equal(checkpoint.load(tmp_path).params, before)


# -- what load refuses --------------------------------------------------------------------------


def test_a_missing_checkpoint_says_where_it_looked(tmp_path):
    with pytest.raises(CheckpointNotFoundError,
                       match=r"No checkpoint at .*nowhere.*--checkpoint-dir"):
        checkpoint.load(tmp_path / "nowhere")


def _array_file(path):
    meta = json.loads(Path(path).read_text())
    return os.path.join(os.path.dirname(path), meta["arrays_file"])


def test_a_truncated_array_file_is_refused(tmp_path):
    path = _save(tmp_path, [_hub()])
    data = Path(_array_file(path)).read_bytes()
    Path(_array_file(path)).write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="corrupt.*bytes and SHA-256.*nothing was changed"):
        checkpoint.load(path)


def test_a_flipped_byte_is_refused(tmp_path):
    path = _save(tmp_path, [_hub()])
    data = bytearray(Path(_array_file(path)).read_bytes())
    data[len(data) // 2] ^= 0xFF
    Path(_array_file(path)).write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="SHA-256"):
        checkpoint.load(path)


def test_a_broken_meta_file_is_refused(tmp_path):
    path = _save(tmp_path, [_hub()])
    text = Path(path).read_text()
    Path(path).write_text(text[: len(text) // 2])
    with pytest.raises(CheckpointError, match="meta.json is not readable JSON"):
        checkpoint.load(tmp_path)
    Path(path).write_text(json.dumps({"format": "something else"}))
    with pytest.raises(CheckpointError, match="not an nbdist checkpoint"):
        checkpoint.load(tmp_path)


def _rewrite(path, change_meta=None, change_arrays=None):
    """Tamper with a checkpoint but keep its checksum right, to reach the checks behind it."""
    meta = json.loads(Path(path).read_text())
    file = _array_file(path)
    with np.load(file) as z:
        arrays = {k: z[k] for k in z.files}
    if change_arrays:
        change_arrays(arrays)
        with open(file, "wb") as f:
            np.savez(f, **arrays)
        data = Path(file).read_bytes()  # the checksum the format records: the file's SHA-256
        meta["sha256"], meta["bytes"] = hashlib.sha256(data).hexdigest(), len(data)
    if change_meta:
        change_meta(meta)
    Path(path).write_text(json.dumps(meta))


def test_arrays_that_differ_from_their_listing_are_refused(tmp_path):
    path = _save(tmp_path, [_hub()])
    _rewrite(path, change_arrays=lambda a: a.update({"shard0.params": a["shard0.params"][:5]}))
    with pytest.raises(CheckpointError,
                       match=r"array shard0.params is <f4\[5\], listed as <f4\[9\]"):
        checkpoint.load(path)


def test_rule_state_that_does_not_match_the_rule_is_refused(tmp_path):
    path = _save(tmp_path, [_hub("ddc-asgd")])
    _rewrite(path, change_arrays=lambda a: a.pop("shard0.rule._d"),
             change_meta=lambda m: m["arrays"].pop("shard0.rule._d"))
    with pytest.raises(CheckpointError, match="saved rule state.*rule._d"):
        checkpoint.load(path)


def test_a_checkpoint_of_another_model_or_data_is_refused(tmp_path):
    ckpt = checkpoint.load(_save(tmp_path, [_hub()]))
    wider = {"trainable": [[2, 4], [4]], "non_trainable": [[2]]}
    with pytest.raises(CheckpointError,
                       match=r"trainable variable 0 has shape \[2, 3\] there and \[2, 4\] here"):
        ckpt.check_fits(wider, 10, servers=1)
    with pytest.raises(CheckpointError, match="1 non_trainable variables, this model 0"):
        ckpt.check_fits({**LAYOUT, "non_trainable": []}, 10, servers=1)
    with pytest.raises(CheckpointError, match="10 samples; this run's data has 12"):
        ckpt.check_fits(LAYOUT, 12, servers=1)
    ckpt.check_fits(LAYOUT, 10, servers=1)


def test_resume_refuses_changed_options_that_give_the_state_its_meaning(tmp_path):
    from nbdist.api import _resumed_config

    ckpt = checkpoint.load(_save(tmp_path, [_hub("ddc-asgd")]))
    assert _resumed_config(ckpt, {"workers": 3, "epochs": 4}).algorithm.value == "ddc-asgd"
    with pytest.raises(ConfigError,
                       match="--algorithm is asgd here but the checkpoint was taken with ddc-asgd"):
        _resumed_config(ckpt, {"algorithm": "asgd"})
    with pytest.raises(ConfigError, match="--epochs 1 is fewer than the checkpointed run's 2"):
        _resumed_config(ckpt, {"epochs": 1})


def test_rule_options_set_live_carry_over_and_worker_dependent_defaults_follow_the_new_run(
        tmp_path):
    from nbdist.api import _resumed_config

    ssp = _hub("ssp")
    ssp.updater.rule.set_option("staleness", 5)  # run.set_option during the run; the flag said 3
    config = TrainConfig(algorithm="ssp", staleness=3, epochs=2).to_dict()
    resumed = _resumed_config(checkpoint.load(_save(tmp_path / "ssp", [ssp], config=config)), {})
    assert resumed.rule_options() == {"staleness": 5}
    softsync = _hub("softsync")  # n=1 given; the default would be n = number of workers
    resumed = _resumed_config(checkpoint.load(_save(tmp_path / "softsync", [softsync])),
                              {"workers": 4})
    assert resumed.rule_options() == {"n": 1}
    ddc = _hub("ddc-asgd")
    assert _resumed_config(checkpoint.load(_save(tmp_path / "ddc", [ddc])), {}).rule_options() == {}


# -- configuration ------------------------------------------------------------------------------


def test_checkpoint_options_are_validated():
    assert TrainConfig(checkpoint_dir="ckpt").checkpoint_interval == 60.0
    assert TrainConfig().checkpoint_interval is None
    with pytest.raises(ConfigError, match="--checkpoint-every needs --checkpoint-dir"):
        TrainConfig(checkpoint_every=10)
    with pytest.raises(ConfigError, match="--checkpoint-every must be a positive number"):
        TrainConfig(checkpoint_dir="ckpt", checkpoint_every=0)
    assert TrainConfig(mode="sync", checkpoint_dir="ckpt").checkpoint_interval == 60.0


def test_an_unwritable_checkpoint_folder_is_refused_before_training(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(CheckpointError, match="Cannot write checkpoints to"):
        checkpoint.prepare_dir(str(blocker / "sub"))


def test_resume_never_runs_a_stored_cell_it_was_not_given(tmp_path):
    import nbdist

    marker = tmp_path / "pwned"
    _save(tmp_path / "ckpt", [_hub("asgd")], cell=f"open({str(marker)!r}, 'w').write('x')")
    with pytest.raises(CheckpointError,
                       match=r"got no cell \(Received: cell=None\).*trust_cell=True"):
        nbdist.resume(tmp_path / "ckpt", mode="local")
    assert not marker.exists()
    with pytest.raises(CheckpointError, match="got no cell"):  # refused before the folder is read
        nbdist.resume(tmp_path / "missing")
    assert not marker.exists()


# -- one run per folder --------------------------------------------------------------------------


def test_a_checkpoint_folder_is_held_by_one_run_until_it_gives_it_back(tmp_path):
    from nbdist.checkpoint.folder import FolderLock, claimed

    first = FolderLock(str(tmp_path), owner="run-a")
    with pytest.raises(CheckpointError, match=r"folder .* is in use by run run-a \(process \d+ "
                                              r"on .*nothing in the folder was changed.*another "
                                              r"--checkpoint-dir"):
        FolderLock(str(tmp_path), owner="run-b")
    with claimed(str(tmp_path), "run-a", first):  # its holder saves there
        pass
    with pytest.raises(CheckpointError, match="in use by run run-a"):  # noqa: SIM117 - it raises
        with claimed(str(tmp_path), "run-b", None):
            pass
    elsewhere = str(tmp_path / "elsewhere")  # a folder nobody held: taken for the save alone
    with claimed(elsewhere, "run-b", None), pytest.raises(CheckpointError, match="by run run-b"):
        FolderLock(elsewhere, owner="run-c")
    first.release()
    assert os.listdir(tmp_path) == ["elsewhere"]  # no lock file left, here...
    assert os.listdir(tmp_path / "elsewhere") == []  # ...nor there
    FolderLock(str(tmp_path), owner="run-b").release()  # free again


def test_a_disk_full_while_saving_leaves_both_earlier_checkpoints_as_they_were(tmp_path,
                                                                                monkeypatch):
    """Two checkpoints (A in meta.1.json, B in meta.json); the disk fills while the third's meta
    is written. The save fails, and A and B are both still there and load (before: the rotation
    had already copied B over meta.1.json, so A was lost, and C's arrays file stayed)."""
    import errno

    hub = _hub("asgd")
    saved = {}
    for run_id in ("A", "B"):
        _train(hub, 2, seed=len(saved))
        _save(tmp_path, [hub], run_id=run_id)
        saved[run_id] = hub.params.copy()
    real_write = checkpoint._write_atomic  # noqa: SLF001 - where a save reaches the disk

    def disk_full_for_c(path, write):
        import io

        buffer = io.BytesIO()
        write(buffer)
        if b'"run_id": "C"' in buffer.getvalue():
            raise OSError(errno.ENOSPC, "No space left on device", path)
        return real_write(path, write)

    monkeypatch.setattr(checkpoint, "_write_atomic", disk_full_for_c)
    _train(hub, 2, seed=9)
    with pytest.raises(OSError, match="No space left"):
        _save(tmp_path, [hub], run_id="C")
    newest, before = checkpoint.load(tmp_path), checkpoint.load(tmp_path / "meta.1.json")
    assert (newest.meta["run_id"], before.meta["run_id"]) == ("B", "A")
    np.testing.assert_array_equal(newest.params, saved["B"])
    np.testing.assert_array_equal(before.params, saved["A"])
    assert not [f for f in os.listdir(tmp_path) if "-C-" in f or f.startswith(".")]
